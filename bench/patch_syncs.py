"""Device syncs of TokenFuse's attention patches per model call, on CUDA (PyTorch's sync debug mode).

Replays the attention calls of SD1.5 model calls on the patch closures alone (devkit/patch_replay.py, as
bench/patch_overhead.py does) with the tokens, sigmas and plan on the device, for every strategy: `balanced` (todo),
`lowvram_8gb` (adaptive ratio), `tome`, `topk`; each with the run's step state (what ComfyUI's sampler path gets from
the pack's SAMPLER_SAMPLE wrapper) and with a face-crop TOKEN_PLAN. Counts the synchronizing CUDA operations PyTorch
reports (`torch.cuda.set_sync_debug_mode("warn")`: blocking host<->device copies, `float()` / `.item()` reads,
`nonzero`, synchronize calls) in the first model call (it builds the tables) and in the later ones. Issue 11 §1: no
device sync on the hot path, so 0 per model call; in the first call only device-aware schedules (`balanced`) may sync,
timing their levels once per shape (calibrate.py). The control row, `balanced` without the step state, reads ComfyUI's
device sigma once per model call by design (the fallback for samplers the wrapper does not know): it must show 1 per
model call, or the count is not working.

    python bench/patch_syncs.py [--steps 20] [--size 512] [--json PATH]

Needs CUDA (other devices have no sync debug mode): without it, prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

load_pack()
from tokenfuse.devkit.patch_replay import sync_audit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=512, help="image size in px (latent = size / 8)")
    parser.add_argument("--json", default="", help="write {'rows': [...]} here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        why = "no CUDA device here (PyTorch's sync debug mode is CUDA only); nothing measured"
        print(f"patch_syncs: {why}")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": [], "note": why}, indent=1))
        return
    rows = sync_audit(args.size, args.steps, "cuda")
    head = f"device syncs of the attention patches, SD1.5 {args.size} px call pattern, {args.steps} steps"
    print(f"{head}, {rows[0]['device']}")
    print(f"{'variant':44s} {'first call':>10s} {'per later call':>15s}")
    for r in rows:
        note = "  (first call: device-aware calibration)" if r["calibrates"] and r["first_call_syncs"] else ""
        print(f"{r['variant']:44s} {r['first_call_syncs']:10d} {r['syncs_per_model_call']:15.2f}{note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
