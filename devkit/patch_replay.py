"""The attention calls of SD1.5 U-Net model calls, replayed on TokenFuse's patch closures without a U-Net.

Shared by bench/patch_overhead.py (host cost per call), bench/patch_syncs.py and tests/test_no_sync.py (device syncs
per model call); bench/sampling_syncs.py takes its face plan and sync counter. 16 transformer blocks at /8 /16 /32
/64 in ComfyUI's call order, ComfyUI's extra_options keys, a fresh options dict per block as ComfyUI makes, tiny
token tensors (batch 1, 4 channels) on the chosen device. Not imported by the pack.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ..scheduling.keys import PLAN_KEY, STEP_KEY
from ..scheduling.patches import build_unet_patches
from ..scheduling.plan import TokenPlan
from ..scheduling.schedule import Schedule, preset_schedule
from ..scheduling.step_state import SamplingSteps
from ..scheduling.telemetry import RunTelemetry

# SD1.5 transformer blocks in call order: (block, level factor)
SD15_BLOCKS: list[tuple[tuple[str, int], int]] = (
    [(("input", 1), 8), (("input", 2), 8), (("input", 4), 16), (("input", 5), 16)]
    + [(("input", 7), 32), (("input", 8), 32), (("middle", 0), 64)]
    + [(("output", i), 32) for i in (3, 4, 5)]
    + [(("output", i), 16) for i in (6, 7, 8)]
    + [(("output", i), 8) for i in (9, 10, 11)]
)

Patches = tuple[Any, Any] | None
BarePools = dict[int, Any]


def model_call_options(size: int, steps: int, device: str | torch.device = "cpu") -> list[dict[str, Any]]:
    """One transformer_options dict per step, as ComfyUI builds them (new sigmas tensor and shape list per call; the
    sigmas on the model's device, as ComfyUI's sampler keeps them)."""
    sample_sigmas = torch.linspace(14.6, 0.0, steps + 1, device=device)
    lat = size // 8
    return [
        {
            "original_shape": [1, 4, lat, lat],
            "sigmas": sample_sigmas[i : i + 1].clone(),
            "sample_sigmas": sample_sigmas,
            "n_heads": 8,
            "dim_head": 40,
            "cond_or_uncond": [0],
        }
        for i in range(steps)
    ]


def with_step_state(opts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same model calls with the run's step state in the options, at each call's step (no sigma read needed; the
    one `tolist()` of the run's sigmas happens here, as ComfyUI's SAMPLER_SAMPLE wrapper does once per run)."""
    sample_sigmas = opts[0]["sample_sigmas"]
    values = sample_sigmas.tolist()
    out = []
    for i, o in enumerate(opts):
        state = SamplingSteps(values, source=sample_sigmas)
        state.step = i
        out.append({**o, STEP_KEY: state})
    return out


def face_plan(size: int) -> TokenPlan:
    """A face-crop TOKEN_PLAN of a size x size crop: a centred ellipse protected (1.0), the rest at 0.1."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    face = ((xx / 0.55) ** 2 + (yy / 0.7) ** 2) <= 1.0
    return TokenPlan(importance=torch.where(face, 1.0, 0.1)[None].float(), image_size=(size, size))


def with_plan(opts: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """The same model calls with face_plan(size), one plan object for the run as ScheduledFusion passes it."""
    plan = face_plan(size)
    return [{**o, PLAN_KEY: plan} for o in opts]


def block_tensors(size: int, device: str | torch.device = "cpu") -> dict[int, torch.Tensor]:
    """{level: [1, tokens, 4]} random tokens of each level's grid (odd grids round up, as the U-Net's strides do)."""
    lat = size // 8
    out = {}
    for k, level in enumerate((8, 16, 32, 64)):
        side = lat
        for _ in range(k):
            side = (side + 1) // 2
        out[level] = torch.randn(1, side * side, 4, device=device)
    return out


def replay(patches: Patches | BarePools, opts: list[dict[str, Any]], xs: dict[int, torch.Tensor]) -> int:
    """All attention calls of len(opts) model calls; returns the number of calls.

    patches: an (attn1_patch, attn1_output_patch) pair, or a dict {level: K/V fn} applied without any patch (the same
    tensor work as balanced with none of its host work), or None (the floor: the loop and the options dicts alone).
    """
    calls = 0
    for topts in opts:
        topts = dict(topts)
        for tidx, (block, level) in enumerate(SD15_BLOCKS):
            eo = dict(topts)
            eo["block"] = block
            eo["block_index"] = 0
            eo["transformer_index"] = tidx
            n = xs[level]
            if isinstance(patches, tuple):
                f, g = patches
                n2, c2, v2 = f(n, n, n, eo)
                g(n2, eo)
            elif patches is not None and level in patches:
                patches[level](n)
            calls += 1
    return calls


SYNC_MESSAGE = "called a synchronizing CUDA operation"


def count_syncs(fn: Callable[[], Any]) -> int:
    """How many synchronizing CUDA operations fn performs (PyTorch's sync debug mode: blocking copies either way,
    `.item()` / `float()` reads, `nonzero`, stream and device synchronize). CUDA only."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum(SYNC_MESSAGE in str(w.message) for w in caught)


def sync_schedules() -> dict[str, Schedule]:
    """The strategies the sync audit replays: every preset strategy of the U-Net path."""
    return {
        "balanced": preset_schedule("balanced", "sd15"),
        "lowvram_8gb": preset_schedule("lowvram_8gb", "sd15"),
        "tome 0.5 /8 /16": Schedule(strategy="tome", ratios={8: 0.5, 16: 0.5}, protect_blocks=0),
        "topk 0.5 /8 /16": Schedule(strategy="topk", ratios={8: 0.5, 16: 0.5}, protect_blocks=0),
    }


def sync_audit(
    size: int, steps: int, device: str, count: Callable[[Callable[[], Any]], int] = count_syncs
) -> list[dict[str, Any]]:
    """One row per (schedule, step state, plan): syncs in the first model call (it builds the tables) and per later
    model call (bench/patch_syncs.py prints them; tests/test_no_sync.py asserts them). count: count_syncs on CUDA;
    elsewhere a stand-in (the CPU test runs every case with one that counts nothing, so the replays themselves are
    checked in CI)."""
    xs = block_tensors(size, device)
    plain = model_call_options(size, steps, device)
    rows = []
    schedules = sync_schedules()
    cases = [(name, True, False) for name in schedules] + [(name, True, True) for name in schedules]
    cases.append(("balanced", False, False))  # the control: the sigma fallback reads once per model call
    for name, state, planned in cases:
        opts = with_step_state(plain) if state else plain
        opts = with_plan(opts, size) if planned else opts
        patches = build_unet_patches(schedules[name], RunTelemetry())
        first = count(partial(replay, patches, opts[:1], xs))
        later = count(partial(replay, patches, opts[1:], xs))
        on_cuda = torch.device(device).type == "cuda"
        if on_cuda:
            torch.cuda.synchronize()
        rows.append(
            {
                "variant": name + (" + plan" if planned else "") + ("" if state else " (sigma read, control)"),
                "first_call_syncs": first,
                "calibrates": schedules[name].device_aware,  # its first call times levels: syncs by design, once
                "syncs_per_model_call": later / max(1, steps - 1),
                "size": size,
                "steps": steps,
                "device": torch.cuda.get_device_name(0) if on_cuda else str(device),
            }
        )
    return rows
