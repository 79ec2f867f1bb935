"""Where sampling is for an attention call: the step, its share of the run and the sigma, cached per model call.

Shared by the U-Net patches (unet_eager.py) and the DiT override (dit_override.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .keys import STEP_KEY
from .step_state import run_steps


@dataclass(frozen=True)
class StepInfo:
    step: int  # index into sample_sigmas (-1 when unknown)
    steps: int  # number of sampling steps (0 when unknown)
    progress: float  # fraction of sampling done, in [0, 1)
    sigma: float


class StepTracker:
    """Step progress of a model call, cached per call.

    With the run's SamplingSteps in options[STEP_KEY] (ComfyUI's sampler path, nodes/sampler_steps.py) the step is an
    attribute read: no device sync (see scheduling/step_state.py for the step semantics of multi-evaluation
    samplers). Without it (plain-torch callers, unit tests, samplers the wrapper does not know) the step is the
    nearest extra_options["sample_sigmas"] entry to extra_options["sigmas"]: one host read of the current sigma per
    model call, which on a GPU is a blocking device sync.
    """

    def __init__(self) -> None:
        self._sig: Any = None
        self._ss: Any = None
        self._ss_vals: list[float] = []
        self._info = StepInfo(-1, 0, 0.0, float("nan"))
        self._state: Any = None
        self._state_step = -1

    def __call__(self, options: dict[str, Any]) -> StepInfo:
        state = run_steps(options, STEP_KEY)
        if state is not None:
            if state is not self._state or state.step != self._state_step:
                step = state.step
                self._info = StepInfo(step, state.steps, min(step / state.steps, 1.0), state.sigma)
                self._state, self._state_step, self._sig = state, step, None
            return self._info
        sig, ss = options.get("sigmas"), options.get("sample_sigmas")
        if sig is None:
            return StepInfo(-1, 0, 0.0, float("nan"))
        if sig is self._sig and ss is self._ss:
            return self._info
        sigma = float(sig.reshape(-1)[0]) if isinstance(sig, torch.Tensor) else float(sig)
        if ss is not self._ss:
            self._ss_vals = [float(s) for s in ss.reshape(-1).tolist()] if isinstance(ss, torch.Tensor) else []
        if len(self._ss_vals) >= 2:
            step = min(range(len(self._ss_vals)), key=lambda i: abs(self._ss_vals[i] - sigma))
            steps = len(self._ss_vals) - 1
            info = StepInfo(step, steps, min(step / steps, 1.0), sigma)
        else:
            info = StepInfo(-1, 0, 0.0, sigma)
        self._sig, self._ss, self._info, self._state = sig, ss, info, None
        return info
