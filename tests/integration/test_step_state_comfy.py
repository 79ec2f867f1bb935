"""The sync-free step index inside real ComfyUI sampling (random-weight SD1.5 U-Net, CPU, PyTorch SDPA).

Checks: the SAMPLER_SAMPLE wrapper's SamplingSteps reaches the attention patches as one object per run, advanced per
step; with it no TokenFuse patch reads a tensor value on the host (the one read per run is the wrapper's); a
step-windowed ToMe schedule (its partition seed also depends on the step) gives bit-identical output with and without
the wrapper for single-evaluation samplers; for heun the documented difference (scheduling/step_state.py): its
second evaluation of step i counts as step i, where the sigma lookup said i + 1.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tokenfuse.nodes.glue import patcher
from tokenfuse.nodes.model_patching import remove_scheduling, schedule_model
from tokenfuse.scheduling.keys import STEP_KEY, WRAPPER_KEY
from tokenfuse.scheduling.schedule import Schedule
from tokenfuse.scheduling.step_state import SamplingSteps

pytestmark = pytest.mark.integration
SIZE = 128  # px: latent 16x16, level /8 = 256 tokens
STEPS = 4
# ToMe at /8 from half-way: the window and the per-step partition seed both depend on the step index.
WINDOWED = Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0, start_percent=0.5)


def ksample(comfy: SimpleNamespace, model: Any, sampler: str, steps: int = STEPS) -> torch.Tensor:
    pos = comfy.models.conditioning("sd15", seed=1, tiny=True)
    neg = comfy.models.conditioning("sd15", seed=2, tiny=True)
    latent = {"samples": torch.zeros(1, comfy.models.latent_channels("sd15"), SIZE // 8, SIZE // 8)}
    (out,) = comfy.nodes.common_ksampler(model, 0, steps, 2.0, sampler, "normal", pos, neg, latent)
    assert torch.isfinite(out["samples"]).all()
    return out["samples"]


def scheduled(model: Any, schedule: Schedule, wrapper: bool) -> tuple[Any, Any]:
    patched, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    assert patcher.has_wrapper(patched, "SAMPLER_SAMPLE", WRAPPER_KEY)
    if not wrapper:
        patcher.remove_wrapper(patched, "SAMPLER_SAMPLE", WRAPPER_KEY)
    return patched, telemetry


def calls_per_step(telemetry: Any) -> list[int]:
    per: Counter[int] = Counter()
    for (step, _level), agg in telemetry.per_step.items():
        per[step] += agg[0]
    return [per[i] for i in range(max(per) + 1)]


@pytest.fixture(scope="module")
def model(random_model) -> Any:
    return random_model("sd15")


def test_state_reaches_the_patches_once_per_run_and_advances(comfy, model) -> None:
    patched, _ = scheduled(model, WINDOWED, wrapper=True)
    seen: list[tuple[int, int]] = []  # (run-state id, step) per attention call, from a patch after ours

    def spy(n, ctx, val, extra_options):
        state = extra_options.get(STEP_KEY)
        assert isinstance(state, SamplingSteps) and state.source is extra_options["sample_sigmas"]
        seen.append((id(state), state.step))
        return n, ctx, val

    patched.set_model_attn1_patch(spy)
    ksample(comfy, patched, "euler")
    first = list(seen)
    ksample(comfy, patched, "euler")
    runs = [first, seen[len(first) :]]
    for run in runs:
        assert len({sid for sid, _ in run}) == 1  # one state object per run, the same in every attention call
        steps = [step for _, step in run]
        assert sorted(set(steps)) == list(range(STEPS)) and steps == sorted(steps)
    assert runs[0][0][0] != runs[1][0][0]  # a fresh state per run: nothing carries over
    assert remove_scheduling(patched) and not patcher.has_wrapper(patched, "SAMPLER_SAMPLE", WRAPPER_KEY)


class HostReads:
    """Counts Tensor.__float__ / item / tolist calls made from TokenFuse modules (on a GPU each is a device sync)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_module: Counter[str] = Counter()
        for name in ("__float__", "item", "tolist"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original: Any) -> Any:
        def read(t: torch.Tensor, *a: Any, **kw: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("tokenfuse."):
                self.by_module[caller] += 1
            return original(t, *a, **kw)

        return read


@pytest.mark.parametrize("cache", [False, True])
def test_no_host_read_of_device_tensors_on_the_hot_path(comfy, model, monkeypatch, cache: bool) -> None:
    schedule = Schedule(**{**WINDOWED.to_dict(), **({"cache_interval": 2} if cache else {})})
    reads = HostReads(monkeypatch)
    ksample(comfy, scheduled(model, schedule, wrapper=True)[0], "euler")
    assert dict(reads.by_module) == {"tokenfuse.nodes.sampler_steps": 1}  # the run's sigmas, once
    reads.by_module.clear()
    ksample(comfy, scheduled(model, schedule, wrapper=False)[0], "euler")  # the fallback: a read per model call
    assert reads.by_module["tokenfuse.scheduling.step_tracker"] >= STEPS
    assert (reads.by_module["tokenfuse.scheduling.step_cache"] >= STEPS) is cache


@pytest.mark.parametrize("sampler", ["euler", "dpmpp_2m"])
def test_windowed_schedule_is_bit_identical_with_and_without_the_wrapper(comfy, model, sampler: str) -> None:
    base = ksample(comfy, model, sampler)
    outs, steps = [], []
    for wrapper in (True, False):
        patched, telemetry = scheduled(model, WINDOWED, wrapper)
        outs.append(ksample(comfy, patched, sampler))
        steps.append(dict(telemetry.per_step))
    assert torch.equal(outs[0], outs[1])
    assert steps[0] == steps[1]  # same calls, same steps, same tokens per (step, level)
    assert not torch.equal(outs[0], base)  # the window did reduce: the comparison can fail


def test_heun_evaluations_of_a_step_share_its_index(comfy, model) -> None:
    """Documented difference (scheduling/step_state.py): heun evaluates step i at sigma[i] and sigma[i + 1]; with the
    wrapper both count as step i, the sigma lookup counted the second one as i + 1. The last step has one."""
    per = []
    for wrapper in (True, False):
        patched, telemetry = scheduled(model, WINDOWED, wrapper)
        ksample(comfy, patched, "heun")
        per.append(calls_per_step(telemetry))
    c = per[0][0]  # attention calls of one evaluation
    # sample_heun calls the callback right after its first evaluation, so the second one (at sigma[i + 1]) sees
    # i + 1, as the sigma lookup did: heun keeps today's semantics (measured: [16, 32, 32, 32] with the wrapper).
    assert per[0] == per[1] == [c, 2 * c, 2 * c, 2 * c]
