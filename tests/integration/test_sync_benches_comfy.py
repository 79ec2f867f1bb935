"""bench/sampling_syncs.py on real ComfyUI: every variant samples through ComfyUI's sampler with its patches live
(on the CPU nothing is counted: PyTorch's sync debug mode is CUDA only; on a GPU the counts are asserted too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_sampling_syncs_bench_samples_every_variant_patched(comfyui_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "syncs.json"
    env = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "bench/sampling_syncs.py", "--comfyui", str(comfyui_path), "--width", "32"]
    cmd += ["--size", "128", "--steps", "3", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 14
    names = ("balanced", "lowvram_8gb", "tome 0.5 /8", "lowvram_8gb + plan", "tome 0.5 /8 + plan")
    for name in (*names, "flux: balanced (attention override)"):
        assert rows[name]["reduced_calls"] > 0, (name, rows[name])  # the patches ran and reduced in the counted run
    cached = rows["balanced + step cache"]["attention_calls"]
    assert 0 < cached < rows["balanced"]["attention_calls"]  # the step cache skipped deep blocks in a cached step
    if torch.cuda.is_available():  # per run: at most the wrapper's one read of the run's sigmas
        assert all(r["vs_unpatched"] <= 1 for r in rows.values()), rows
