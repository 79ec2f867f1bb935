"""SAMPLER_SAMPLE wrapper: the run's step index on the host, so no TokenFuse patch reads a device sigma per call.

ComfyUI calls `KSAMPLER.sample(model_wrap, sigmas, extra_args, callback, noise, latent_image, denoise_mask,
disable_pbar)` once per sampling run inside CFGGuider.inner_sample, with `extra_args["model_options"]` the copy whose
`transformer_options` every model call of the run receives (its "sample_sigmas" is this `sigmas`). The wrapper:
- reads `sigmas` on the host once (one device sync per run, like ComfyUI's own max_denoise check),
- creates a fresh SamplingSteps (scheduling/step_state.py) and puts it under STEP_KEY into a copy of
  `extra_args["model_options"]["transformer_options"]` (ComfyUI copies dicts and lists between the sampler and the
  attention patches, but passes other objects through, so the patches see this very instance),
- wraps `callback` so each finished step advances it (the sampler calls it after step i's evaluations with i).

Only samplers known to call the callback once per step with the index of `sigmas` they just finished get the state:
KSAMPLER over ComfyUI's k-diffusion `sample_*` functions and UniPC. dpm_fast / dpm_adaptive (their own step counts)
and any other sampler class run unchanged, and the patches fall back to reading the call's sigma (correct, one sync
per model call). No ComfyUI import: the sampler is recognised by its class and its function's module.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..scheduling.keys import STEP_KEY
from ..scheduling.step_state import SamplingSteps

log = logging.getLogger(__name__)

# Modules whose sample_* functions call callback({"i": i, ...}) once per step after evaluating step i.
_STEPWISE_MODULES = frozenset({"comfy.k_diffusion.sampling", "comfy.extra_samplers.uni_pc"})
# ... except these (an adaptive or re-planned number of solver steps).
_NOT_STEPWISE = frozenset({"sample_dpm_fast", "sample_dpm_adaptive"})


def stepwise_sampler(sampler: Any) -> bool:
    """True for a KSAMPLER whose sampler_function reports every step of `sigmas` through its callback."""
    if "KSAMPLER" not in (c.__name__ for c in type(sampler).__mro__):
        return False
    fn = getattr(sampler, "sampler_function", None)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__module__", "") in _STEPWISE_MODULES and getattr(fn, "__name__", "") not in _NOT_STEPWISE


def host_sigmas(sigmas: Any) -> list[float] | None:
    """The run's sigmas as floats (one device sync), or None when they are not a 1-D sequence of numbers."""
    try:
        values = sigmas.reshape(-1).tolist() if hasattr(sigmas, "reshape") else list(sigmas)
        return [float(v) for v in values]
    except (TypeError, ValueError, RuntimeError):
        return None


def with_step_state(extra_args: Any, state: SamplingSteps) -> Any:
    """A copy of extra_args whose model_options["transformer_options"][STEP_KEY] is `state` (inputs untouched)."""
    options = dict(extra_args.get("model_options") or {})
    to = dict(options.get("transformer_options") or {})
    to[STEP_KEY] = state
    options["transformer_options"] = to
    return {**extra_args, "model_options": options}


def make_sampler_step_wrapper() -> Callable[..., Any]:
    """The SAMPLER_SAMPLE wrapper fn(executor, *args, **kwargs) (see module docstring); one per patched clone."""
    told: set[str] = set()

    def tokenfuse_sampler_steps(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        sampler = getattr(executor, "class_obj", None)
        # (model_wrap, sigmas, extra_args, callback, ...) positionally, as CFGGuider.inner_sample calls it
        if len(args) < 4 or not isinstance(args[2], dict) or not stepwise_sampler(sampler):
            name = type(sampler).__name__
            if name not in told:
                told.add(name)
                log.info("TokenFuse: sampler %s has no per-step callback we know; steps come from sigma reads", name)
            return executor(*args, **kwargs)
        values = host_sigmas(args[1])
        if values is None or len(values) < 2:
            return executor(*args, **kwargs)
        state = SamplingSteps(values, source=args[1])
        callback = args[3]

        def step_callback(step: int, x0: Any, x: Any, total_steps: int) -> Any:
            state.advance(step)
            return callback(step, x0, x, total_steps) if callback is not None else None

        return executor(args[0], args[1], with_step_state(args[2], state), step_callback, *args[4:], **kwargs)

    return tokenfuse_sampler_steps
