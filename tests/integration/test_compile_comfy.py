"""Patched models under ComfyUI's TorchCompileModel (issue 11): KSampler through torch.compile on a random-weight U-Net.

TorchCompileModel is `comfy_api.torch_helpers.set_torch_compile_wrapper(model, backend)`: an APPLY_MODEL wrapper that
swaps in `torch.compile(diffusion_model)`. Our attn1 patches then run inside the traced U-Net. The test compiles with
a counting backend (dynamo's graphs, each run eagerly: no C compiler needed, fast on 2 cores) and checks that
- the patched, compiled run matches the patched eager run, and the preset still reduces tokens (telemetry);
- the graph breaks are ours by design: each patch call is wrapped in torch.compiler.disable (scheduling/patches.py),
  so it is one graph break that runs eagerly. Without it dynamo traced into the closures and guarded on their tables
  and on the per-model-call `sigmas` object: a recompile per step until the recompile limit (49 graphs here). With it
  the U-Net still splits at every transformer block (39 graphs vs 1 unpatched) and the per-level shapes then exceed
  dynamo's recompile limit in the block-calling frame, which runs eagerly: correct, but not fully compiled;
- the step cache (Schedule.cache_*) compiles to two graphs, the full U-Net and the shallow forward of a cached step,
  whatever the number of steps: its host logic (which step, which condition group, the counters) runs eagerly, one
  graph break before each call and one after a full call. Traced, it made dynamo guard on the per-step state and
  recompile every step (7 graphs for 7 steps, and past the recompile limit in a 20-step run).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tokenfuse.nodes.glue import patcher
from tokenfuse.nodes.model_patching import schedule_model
from tokenfuse.nodes.scheduler_node import TokenSchedulerController, schedule_from_widgets

pytestmark = pytest.mark.integration
SIZE = 128
CACHE = '{"cache_interval": 3, "cache_depth": 2}'
CACHE_STEPS = 7  # interval 3: full at 0, 3, 6, cached at 1, 2, 4, 5


def ksample(comfy: SimpleNamespace, model: Any, steps: int = 2) -> torch.Tensor:
    pos = comfy.models.conditioning("sd15", seed=1, tiny=True)
    neg = comfy.models.conditioning("sd15", seed=2, tiny=True)
    latent = {"samples": torch.zeros(1, 4, SIZE // 8, SIZE // 8)}
    (out,) = comfy.nodes.common_ksampler(model, 0, steps, 2.0, "euler", "normal", pos, neg, latent)
    samples: torch.Tensor = out["samples"]
    assert torch.isfinite(samples).all()
    return samples


def compiled(model: Any, graphs: list[Any]) -> Any:
    """model.clone() with ComfyUI's TorchCompileModel wrapper, compiled by a backend that counts dynamo's graphs."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    m = model.clone()
    set_torch_compile_wrapper(model=m, backend=counting_backend)
    return m


def test_balanced_runs_under_torch_compile(comfy, random_model) -> None:
    torch._dynamo.reset()
    model = random_model("sd15")
    schedule = schedule_from_widgets("balanced", "preset", 0.0, "sd15")
    eager_patched, _ = schedule_model(model, schedule, patcher.detect_family(model))
    eager = ksample(comfy, eager_patched)

    base_graphs: list[Any] = []
    ksample(comfy, compiled(model, base_graphs))
    torch._dynamo.reset()

    patched, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    ours_graphs: list[Any] = []
    out = ksample(comfy, compiled(patched, ours_graphs))
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    summary = telemetry.summary()
    assert summary["reduced_calls"] > 0 and summary["kv_tokens_out"] < summary["kv_tokens_in"]
    print(f"dynamo graphs: unpatched {len(base_graphs)}, patched {len(ours_graphs)}")
    assert base_graphs and ours_graphs


@pytest.mark.parametrize("preset", ["off", "balanced"])
def test_step_cache_runs_under_torch_compile(comfy, random_model, caplog, preset: str) -> None:
    """ours (cache) and ours (both) compiled: the same samples and the same full/cached split as eager; the cache alone
    adds no graph per step (2 graphs: the full U-Net and the cached step's shallow forward)."""
    torch._dynamo.reset()
    patched, _ = TokenSchedulerController().apply(random_model("sd15"), preset, "preset", 0.0, schedule_text=CACHE)
    split = "step cache 3 full / 4 cached U-Net calls of 7"
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        eager = ksample(comfy, patched, steps=CACHE_STEPS)
        caplog_eager = [r.getMessage() for r in caplog.records if split in r.getMessage()]
        caplog.clear()
        graphs: list[Any] = []
        out = ksample(comfy, compiled(patched, graphs), steps=CACHE_STEPS)
    assert len(caplog_eager) == 1
    assert len([r for r in caplog.records if split in r.getMessage()]) == 1, "compiled run: another full/cached split"
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    print(f"dynamo graphs, step cache with preset {preset}: {len(graphs)}")
    if preset == "off":
        assert len(graphs) == 2, f"{len(graphs)} graphs for {CACHE_STEPS} steps: a recompile per step"
