"""The sampling step a model call belongs to, kept on the host: no device sync on the attention hot path.

ComfyUI hands the attention patches the current sigma as a device tensor (`transformer_options["sigmas"]`); reading
it (`float(t)`) blocks the CPU until the GPU has drained its queue, once per model call, in the middle of the U-Net
forward. The node layer's SAMPLER_SAMPLE wrapper (nodes/sampler_steps.py) instead reads the run's sigmas once on the
host, creates one `SamplingSteps` per sampling run, advances it from the sampler's per-step callback and puts it into
`transformer_options[STEP_KEY]` (scheduling/keys.py). Patches read `step` from it: an attribute read, no sync.

Step semantics: `step` is the index of the sampler step being computed (0 before the first callback, i + 1 after the
callback of step i). For samplers that evaluate the model once per step at `sample_sigmas[i]` (euler, euler_a,
dpmpp_2m, lms, ipndm, deis, uni_pc, ...) this equals the old sigma lookup (the nearest `sample_sigmas` entry).
Multi-evaluation samplers: ComfyUI's heun / dpm_2 style loops call the callback right after a step's FIRST
evaluation, so their later evaluation(s) of step i already see i + 1. For heun (second evaluation at sigma[i + 1])
that is exactly the old nearest-sigma index (measured: the same attention calls per step with and without the state,
tests/integration/test_step_state_comfy.py); a midpoint evaluation (dpm_2, dpmpp_2s_ancestral, dpmpp_sde, seeds_2/3)
sees i + 1 where the sigma lookup gave i or i + 1 by rounding: a step-window boundary moves by at most one
evaluation (not measured). Exact sigma-nearest indices for those would need each evaluation's sigma on the host,
i.e. the sync this removes.

Pure Python (no torch): the node layer owns the ComfyUI side, scheduling/patches.py and step_cache.py read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class SamplingSteps:
    """Mutable step state of one sampling run (a new object per run, so nothing carries over between runs).

    sigmas: the run's schedule on the host (len = steps + 1, decreasing, usually ending at 0).
    source: the device tensor it was read from (ComfyUI's `sample_sigmas`); readers check it is the tensor of the
    call they serve, so a state can never describe another run's schedule.
    Not a dict or list on purpose: ComfyUI's copy_nested_dicts copies those between the sampler and the model call,
    while any other object reaches the patches as the same instance.
    """

    __slots__ = ("sigmas", "source", "steps", "step")

    def __init__(self, sigmas: Sequence[float], source: Any = None) -> None:
        self.sigmas = [float(s) for s in sigmas]
        self.source = source
        self.steps = max(len(self.sigmas) - 1, 0)
        self.step = 0

    def advance(self, i: int) -> None:
        """The sampler finished step i (its callback): later model calls belong to step i + 1 (at most `steps`)."""
        self.step = min(max(int(i) + 1, 0), self.steps)

    @property
    def sigma(self) -> float:
        """The scheduled sigma of the current step (the last one once every step is done); nan without a schedule."""
        return self.sigmas[min(self.step, len(self.sigmas) - 1)] if self.sigmas else float("nan")

    def __repr__(self) -> str:  # logs and ComfyUI's repr of model_options stay short
        return f"SamplingSteps(step={self.step}/{self.steps})"


def run_steps(options: Any, key: str | None) -> SamplingSteps | None:
    """The run's SamplingSteps under `key` in a call's transformer_options, when it describes this call's schedule
    (its source is the call's "sample_sigmas" tensor and it has at least one step); else None (read the sigma)."""
    state = options.get(key) if key else None
    if isinstance(state, SamplingSteps) and state.source is options.get("sample_sigmas") and state.steps >= 1:
        return state
    return None
