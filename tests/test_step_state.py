"""The step index without a device sync (issue 11 §1): SamplingSteps in transformer_options instead of float() of
ComfyUI's device `sigmas`. The "meta" device stands in for a GPU: any host read of a meta tensor raises, so a patch
that still reads the sigma fails these tests (and the sigma-read fallback is shown to raise on the same options)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_patches import SAMPLE_SIGMAS, block, extra_options, tokens
from test_step_cache import SIGMAS, Executor, TinyUNet, deep_calls, embed, latents
from tokenfuse.nodes.sampler_steps import make_sampler_step_wrapper, stepwise_sampler, with_step_state
from tokenfuse.scheduling.dit_override import build_attention_override
from tokenfuse.scheduling.keys import DISABLED_KEY, PLAN_KEY, STEP_KEY
from tokenfuse.scheduling.patches import build_unet_patches
from tokenfuse.scheduling.schedule import Schedule
from tokenfuse.scheduling.step_cache import StepCacheKeys, build_step_cache
from tokenfuse.scheduling.step_state import SamplingSteps
from tokenfuse.scheduling.telemetry import RunTelemetry

META_SS = torch.empty(SAMPLE_SIGMAS.shape, device="meta")  # a device schedule whose values the host cannot read


def state_at(step: int, source: Any = META_SS, sigmas: list[float] | None = None) -> SamplingSteps:
    state = SamplingSteps(SAMPLE_SIGMAS.tolist() if sigmas is None else sigmas, source=source)
    if step:
        state.advance(step - 1)
    return state


def meta_options(hw: tuple[int, int], step: int, **kw: Any) -> dict[str, Any]:
    """extra_options of a call at `step` whose sigmas live on a device (meta) plus the run's step state."""
    opts = extra_options(hw, step=step, **kw)
    opts["sigmas"] = torch.empty(opts["sigmas"].shape, device="meta")
    opts["sample_sigmas"] = META_SS
    opts[STEP_KEY] = state_at(step)
    return opts


def test_sampling_steps_advance_clamp_and_sigma() -> None:
    s = SamplingSteps([14.6, 8.0, 4.0, 0.0])
    assert (s.step, s.steps, s.sigma) == (0, 3, 14.6)
    s.advance(0)
    assert (s.step, s.sigma) == (1, 8.0)
    s.advance(2)
    assert (s.step, s.sigma) == (3, 0.0)
    s.advance(7)  # a callback past the end never leaves the schedule
    assert s.step == 3 and "3/3" in repr(s)


def test_meta_sigmas_with_step_state_pick_the_step_window() -> None:
    """No host read of the call's sigma: the window (start_percent 0.5 of 10 steps) comes from the step state."""
    f, g = build_unet_patches(
        Schedule(strategy="todo", ratios={8: 0.75}, protect_blocks=0, start_percent=0.5), RunTelemetry()
    )
    n = tokens(2, 8, 8)
    with pytest.raises((NotImplementedError, RuntimeError)):  # the old path reads the meta sigma: it cannot
        f(n, n, n, {k: v for k, v in meta_options((8, 8), 6).items() if k != STEP_KEY})
    f, g = build_unet_patches(
        Schedule(strategy="todo", ratios={8: 0.75}, protect_blocks=0, start_percent=0.5), RunTelemetry()
    )
    for step in range(10):
        _, ctx, val = f(n, n, n, meta_options((8, 8), step))
        if step < 5:
            assert ctx is n and val is n, step  # before the window: the same objects back
        else:
            assert ctx.shape == (2, 16, 32) and val is ctx, step


@pytest.mark.parametrize("strategy", ["tome", "todo", "topk"])
def test_step_state_gives_the_sigma_lookups_results_on_every_step(strategy: str) -> None:
    """Bit-identical outputs per step, state vs today's sigma lookup (tome's partition seed depends on the step)."""
    schedule = Schedule(strategy=strategy, ratios={8: 0.5}, protect_blocks=0, start_percent=0.2, end_percent=0.8)
    via_sigma, via_state = build_unet_patches(schedule, RunTelemetry()), build_unet_patches(schedule, RunTelemetry())
    n = tokens(2, 12, 12, seed=4)
    for step in range(10):
        ref = block(*via_sigma, n, extra_options((12, 12), step=step))
        got = block(*via_state, n, meta_options((12, 12), step))
        assert torch.equal(got, ref), step


def test_state_of_another_schedule_is_ignored() -> None:
    """A state whose source is not the call's sample_sigmas never decides the step: the sigma lookup does."""
    f, _ = build_unet_patches(
        Schedule(strategy="todo", ratios={8: 0.75}, protect_blocks=0, end_percent=0.5), RunTelemetry()
    )
    n = tokens(2, 8, 8)
    opts = extra_options((8, 8), step=1)  # 10% done: inside the window
    opts[STEP_KEY] = state_at(8, source=torch.linspace(1.0, 0.0, 11))  # says 80% done, for another tensor
    assert f(n, n, n, opts)[1].shape[1] == 16


def test_attention_override_reads_the_step_state() -> None:
    q = k = v = torch.randn(1, 256, 64)
    tel = RunTelemetry()
    windowed = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0, end_percent=0.5), tel)
    seen: dict[str, Any] = {}

    def func(q, k, v, heads, mask=None, skip_reshape=False, **kwargs):
        seen.update(k=k)
        return q

    for step, reduced in ((2, True), (7, False)):
        topts = {"sigmas": torch.empty(1, device="meta"), "sample_sigmas": META_SS, STEP_KEY: state_at(step)}
        windowed(func, q, k, v, 4, transformer_options=topts)
        assert (seen["k"].shape[1] == 128) is reduced and (seen["k"] is k) is not reduced


def test_step_cache_takes_its_steps_from_the_state() -> None:
    """Same full/cached decisions and outputs as the sigma lookup, with the call's sigmas on the meta device."""
    unet = TinyUNet().eval()
    xs, sig = latents(), torch.tensor(SIGMAS)
    meta_ss = torch.empty(sig.shape, device="meta")
    outs, deep = [], []
    for use_state in (False, True):
        hooks = build_step_cache(3, 2, 0.0, embed, StepCacheKeys(PLAN_KEY, DISABLED_KEY, STEP_KEY))
        hooks.state.reset()
        for b in [*unet.input_blocks, unet.middle_block, *unet.output_blocks]:
            b.calls = 0
        steps = SamplingSteps(SIGMAS, source=meta_ss)
        got = []
        with torch.no_grad():
            for i, x in enumerate(xs):
                opts = {"patches": {"output_block_patch": [hooks.output_block_patch]}, "uuids": ["c"]}
                opts["cond_or_uncond"] = [0]
                if use_state:
                    opts.update(sigmas=torch.empty(1, device="meta"), sample_sigmas=meta_ss, **{STEP_KEY: steps})
                else:
                    opts.update(sigmas=sig[i : i + 1], sample_sigmas=sig)
                got.append(
                    hooks.diffusion_model_wrapper(Executor(unet), x, sig[i : i + 1] * 10, None, None, None, opts)
                )
                steps.advance(i)
        outs.append(got)
        deep.append((deep_calls(unet, 2), hooks.state.full_calls, hooks.state.cached_calls))
    assert deep[0] == deep[1] and deep[1][2] > 0
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


# ------------------------------------------------------------------------------------- the SAMPLER_SAMPLE wrapper
def k_diffusion_euler(
    model: Any, x: torch.Tensor, sigmas: torch.Tensor, extra_args: Any = None, callback: Any = None, disable: Any = None
) -> torch.Tensor:
    """The loop shape of comfy.k_diffusion.sampling.sample_euler: one model call per step, then callback(i)."""
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i], **extra_args)
        if callback is not None:
            callback({"x": x, "i": i, "denoised": denoised})
        x = denoised
    return x


k_diffusion_euler.__module__ = "comfy.k_diffusion.sampling"  # how ComfyUI's own sampler functions are recognised


class KSAMPLER:
    """comfy.samplers.KSAMPLER.sample's callback adaptation: the sampler's dict callback -> callback(i, x0, x, n)."""

    def __init__(self, fn: Any) -> None:
        self.sampler_function = fn

    def sample(
        self, model_wrap, sigmas, extra_args, callback, noise, latent_image=None, denoise_mask=None, disable_pbar=False
    ):
        k_callback = None
        if callback is not None:
            k_callback = lambda x: callback(x["i"], x["denoised"], x["x"], len(sigmas) - 1)  # noqa: E731
        return self.sampler_function(model_wrap, noise, sigmas, extra_args=extra_args, callback=k_callback)


class SamplerExecutor:
    def __init__(self, sampler: KSAMPLER) -> None:
        self.class_obj = sampler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.class_obj.sample(*args, **kwargs)


def test_wrapper_advances_per_callback_and_starts_fresh_per_run() -> None:
    wrapper = make_sampler_step_wrapper()
    sigmas = torch.tensor([14.6, 8.0, 4.0, 2.0, 0.0])
    seen: list[tuple[int, int]] = []
    states: list[SamplingSteps] = []
    user_steps: list[int] = []

    def model(x: torch.Tensor, sigma: torch.Tensor, model_options: dict, seed: Any = None) -> torch.Tensor:
        state = model_options["transformer_options"][STEP_KEY]
        assert model_options["transformer_options"]["sample_sigmas"] is state.source
        states.append(state)
        seen.append((state.step, state.steps))
        return x * 0.5

    to = {"sample_sigmas": sigmas, "patches": {}}
    extra_args = {"model_options": {"transformer_options": to}, "seed": 0}
    for _ in range(2):  # two sampling runs
        wrapper(
            SamplerExecutor(KSAMPLER(k_diffusion_euler)),
            model,
            sigmas,
            extra_args,
            lambda i, x0, x, n: user_steps.append(i),
            torch.ones(1),
        )
    assert seen == [(i, 4) for i in range(4)] * 2
    assert states[0] is states[3] and states[4] is not states[0] and states[4].step == 4  # all done
    assert user_steps == [0, 1, 2, 3] * 2  # the user's callback (preview, progress bar) still runs
    assert STEP_KEY not in to and STEP_KEY not in extra_args["model_options"]["transformer_options"]


def test_wrapper_without_a_user_callback_and_for_unknown_samplers() -> None:
    wrapper = make_sampler_step_wrapper()
    sigmas = torch.tensor([2.0, 1.0, 0.0])
    seen: list[Any] = []

    def model(x, sigma, model_options, seed=None):
        st = model_options["transformer_options"].get(STEP_KEY)
        seen.append(None if st is None else st.step)
        return x

    extra_args = {"model_options": {"transformer_options": {"sample_sigmas": sigmas}}}
    wrapper(SamplerExecutor(KSAMPLER(k_diffusion_euler)), model, sigmas, extra_args, None, torch.ones(1))
    assert seen == [0, 1]

    def own_loop(model, x, sigmas, extra_args=None, callback=None, disable=None):  # e.g. another pack's sampler
        return k_diffusion_euler(model, x, sigmas, extra_args, callback)

    assert not stepwise_sampler(KSAMPLER(own_loop)) and stepwise_sampler(KSAMPLER(k_diffusion_euler))
    seen.clear()
    wrapper(SamplerExecutor(KSAMPLER(own_loop)), model, sigmas, extra_args, None, torch.ones(1))
    assert seen == [None, None]  # no state: the patches read the sigma (correct, one sync per call)


def test_with_step_state_copies_the_option_dicts() -> None:
    to = {"sample_sigmas": 1}
    extra = {"model_options": {"transformer_options": to}, "seed": 3}
    out = with_step_state(extra, SamplingSteps([1.0, 0.0]))
    assert out["seed"] == 3 and isinstance(out["model_options"]["transformer_options"][STEP_KEY], SamplingSteps)
    assert STEP_KEY not in to and "model_options" in extra and extra["model_options"]["transformer_options"] is to
