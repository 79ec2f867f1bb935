"""Test-only out-of-memory injection for ScheduledFusion's fallback chain (integration tests and demos).

`oom_on_first_samples(model, times)` returns a clone of a ComfyUI MODEL whose first `times` sampling runs raise
ComfyUI's OOM exception from inside comfy.sample.sample (an OUTER_SAMPLE wrapper, where a real CUDA OOM surfaces),
then sample normally. The count is shared by every clone made from it afterwards (ScheduledFusion's "stronger preset"
and "scheduling off" models are clones), so exactly `times` runs fail across the whole fallback chain.

It replaces a test hook the pack used to read from an environment variable on every run: production code carries no
injector. No relative imports: the server test's custom-node package imports this file as a top-level module.
"""

from __future__ import annotations

from typing import Any

WRAPPER_KEY = "tokenfuse_test_oom"  # not TokenFuse's own key: "scheduling off" (strip_tokenfuse) keeps this wrapper


def oom_on_first_samples(model: Any, times: int) -> Any:
    """A clone of `model` (ModelPatcher) whose next `times` sampling runs raise comfy's OOM_EXCEPTION."""
    import comfy.model_management as mm
    import comfy.patcher_extension as pe

    left = [max(0, int(times))]

    def outer_sample(executor: Any, *args: Any, **kwargs: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise mm.OOM_EXCEPTION(f"out of memory induced by the test (devkit/induce_oom.py, {left[0]} more to come)")
        return executor(*args, **kwargs)

    m = model.clone()
    m.add_wrapper_with_key(pe.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY, outer_sample)
    return m
