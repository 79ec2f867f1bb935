"""Step cache core (scheduling/step_cache.py) without ComfyUI: the full-step plan, step lookup, face drift, and the
DIFFUSION_MODEL wrapper on a small U-Net-shaped torch module whose forward loop follows ComfyUI's UNetModel._forward
(blocks, skips, patch calls, transformer_index). tests/integration/test_step_cache_comfy.py runs the real U-Net."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from tokenfuse.scheduling.keys import DISABLED_KEY, PLAN_KEY
from tokenfuse.scheduling.plan import TokenPlan
from tokenfuse.scheduling.schedule import Schedule, ScheduleError, parse_schedule_text, preset_schedule
from tokenfuse.scheduling.step_cache import StepCacheKeys, build_step_cache, face_drift, plan_full_steps, step_index
from torch import nn

EMB = 16


def embed(t: torch.Tensor, dim: int, repeat_only: bool = False) -> torch.Tensor:
    """Sinusoidal embedding, the formula of ComfyUI's timestep_embedding."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Block(nn.Module):
    """conv + time bias (+ optional stride-2 down or 2x up); `attn` blocks bump transformer_index as ComfyUI's
    SpatialTransformer does. Counts its calls."""

    def __init__(self, cin: int, cout: int, down: bool = False, up: bool = False, attn: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=2 if down else 1, padding=1)
        self.emb = nn.Linear(EMB, cout)
        self.up, self.attn, self.calls = up, attn, 0

    def forward(self, h: torch.Tensor, emb: torch.Tensor, context: Any, opts: dict, output_shape: Any = None) -> Any:
        if not torch.compiler.is_compiling():  # traced, the count would be a guard and a recompile per call
            self.calls += 1
        h = torch.tanh(self.conv(h) + self.emb(emb)[:, :, None, None])
        if self.attn:
            opts["transformer_index"] += 1
        if self.up:
            h = nn.functional.interpolate(h, size=output_shape[-2:], mode="nearest")
        return h


class TinyUNet(nn.Module):
    """4 input blocks (full, full, half, half resolution), a middle block, 4 output blocks, out; skips as ComfyUI."""

    model_channels = 8
    num_classes = None
    predict_codebook_ids = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.time_embed = nn.Linear(8, EMB)
        self.input_blocks = nn.ModuleList(
            [Block(4, 8), Block(8, 8, attn=True), Block(8, 16, down=True), Block(16, 16, attn=True)]
        )
        self.middle_block = Block(16, 16, attn=True)
        self.output_blocks = nn.ModuleList(
            [Block(32, 16, attn=True), Block(32, 8, up=True), Block(16, 8, attn=True), Block(16, 8)]
        )
        self.out = nn.Conv2d(8, 4, 1)

    def _forward(self, x, timesteps, context, y, control, opts):  # mirrors UNetModel._forward's loop
        opts["original_shape"] = list(x.shape)
        opts["transformer_index"] = 0
        patches = opts.get("patches", {})
        emb = self.time_embed(embed(timesteps, self.model_channels))
        hs, h = [], x
        for i, module in enumerate(self.input_blocks):
            opts["block"] = ("input", i)
            h = module(h, emb, context, opts)
            hs.append(h)
        opts["block"] = ("middle", 0)
        h = self.middle_block(h, emb, context, opts)
        for j, module in enumerate(self.output_blocks):
            opts["block"] = ("output", j)
            hsp = hs.pop()
            for p in patches.get("output_block_patch", ()):
                h, hsp = p(h, hsp, opts)
            h = torch.cat([h, hsp], dim=1)
            h = module(h, emb, context, opts, hs[-1].shape if hs else None)
        return self.out(h)


class Executor:
    """comfy.patcher_extension.WrapperExecutor's shape: class_obj + call the original."""

    def __init__(self, unet: TinyUNet) -> None:
        self.class_obj = unet

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.class_obj._forward(*args, **kwargs)


def deep_calls(unet: TinyUNet, depth: int) -> int:
    n = len(unet.output_blocks)
    blocks = list(unet.input_blocks[depth:]) + [unet.middle_block] + list(unet.output_blocks[: n - depth])
    return sum(b.calls for b in blocks)


def run(unet, hooks, xs, sigmas, opts_extra=None, control=None, forward=None):
    """One 'sampling run': a model call per step with x = xs[i]; returns the outputs. forward(*args): the U-Net's
    forward (default: the hooks' wrapper around _forward, as UNetModel.forward dispatches it)."""
    outs = []
    for i, x in enumerate(xs):
        opts = {
            "patches": {"output_block_patch": [hooks.output_block_patch]} if hooks else {},
            "sigmas": sigmas[i : i + 1],
            "sample_sigmas": sigmas,
            "uuids": ["c"],
            "cond_or_uncond": [0],
            **(opts_extra or {}),
        }
        args = (x, sigmas[i : i + 1] * 10, None, None, control[i] if isinstance(control, list) else control, opts)
        if forward is not None:
            outs.append(forward(*args))
        else:
            outs.append(hooks.diffusion_model_wrapper(Executor(unet), *args) if hooks else Executor(unet)(*args))
    return outs


def hooks_for(interval=3, depth=2, threshold=0.0):
    h = build_step_cache(interval, depth, threshold, embed, StepCacheKeys(PLAN_KEY, DISABLED_KEY))
    h.state.reset()
    return h


SIGMAS = torch.linspace(10.0, 1.0, 10).tolist() + [0.0]


def latents(n: int = 10, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(2, 4, 16, 16, generator=g)
    return [base + 0.05 * k * torch.randn(2, 4, 16, 16, generator=g) for k in range(n)]


# -------------------------------------------------------------------------------------------------- pure parts
def test_full_step_plan_interval_first_last_and_window() -> None:
    inside = [True] * 10
    assert plan_full_steps(10, 3, inside) == [True, False, False, True, False, False, True, False, False, True]
    assert plan_full_steps(10, 2, inside) == [i % 2 == 0 or i == 9 for i in range(10)]
    assert all(plan_full_steps(10, 1, inside)) and all(plan_full_steps(10, 0, inside))
    window = [3 <= i < 7 for i in range(10)]  # outside the window every step is full
    assert plan_full_steps(10, 3, window) == [True, True, True, False, False, True, False, True, True, True]


def test_step_index_maps_exact_and_intermediate_sigmas() -> None:
    sigmas = [14.6, 8.0, 4.0, 2.0, 0.0]
    assert [step_index(s, sigmas) for s in sigmas[:4]] == [0, 1, 2, 3]
    assert step_index(6.0, sigmas) == 1  # a second-order sampler's midpoint belongs to the step it started
    assert step_index(0.5, sigmas) == 3 and step_index(99.0, sigmas) == 0
    assert step_index(8.0 * (1 + 5e-5), sigmas) == 1  # float32 round-off still lands on its step


def test_face_drift_counts_only_face_tokens() -> None:
    ref = torch.ones(1, 4, 4, 4)
    x = ref.clone()
    x[..., :2, :] += 1.0  # top half changes
    face_bottom = torch.zeros(1, 16)
    face_bottom[:, 8:] = 1.0
    assert face_drift(x, ref, face_bottom) == 0.0
    assert face_drift(x, ref, None) == pytest.approx(0.5)
    assert face_drift(x, ref, 1.0 - face_bottom) == pytest.approx(1.0)


def test_schedule_cache_fields_validate_and_round_trip() -> None:
    s = parse_schedule_text('{"cache_interval": 3, "cache_depth": 3, "cache_end_percent": 0.9}', Schedule())
    assert s.cache_on and s.is_off  # the cache is a strategy of its own: tokens can stay off
    assert Schedule.from_dict(s.to_dict()) == s and hash(s) == hash(Schedule.from_dict(s.to_dict()))
    assert not Schedule(cache_interval=1).cache_on
    assert not Schedule(cache_interval=3, cache_start_percent=0.5, cache_end_percent=0.5).cache_on
    assert not preset_schedule("balanced").cache_on  # no preset turns the cache on behind the user's back
    for bad, name in (
        ({"cache_interval": 11}, "cache_interval"),
        ({"cache_interval": 2.5}, "cache_interval"),
        ({"cache_depth": 0}, "cache_depth"),
        ({"cache_start_percent": 0.6, "cache_end_percent": 0.5}, "cache_end_percent"),
        ({"cache_threshold": -0.1}, "cache_threshold"),
    ):
        with pytest.raises(ScheduleError, match=re.escape(f"'{name}'")):
            Schedule(**bad)


# ------------------------------------------------------------------------------------- hooks on a U-Net shape
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_cached_steps_skip_deep_blocks_and_full_steps_equal_unpatched(depth: int) -> None:
    unet = TinyUNet().eval()
    xs = latents()
    sig = torch.tensor(SIGMAS)
    with torch.no_grad():
        ref = run(unet, None, xs, sig)
        for b in [*unet.input_blocks, unet.middle_block, *unet.output_blocks]:
            b.calls = 0
        hooks = hooks_for(interval=3, depth=depth)
        got = run(unet, hooks, xs, sig)
    full = plan_full_steps(10, 3, [True] * 10)
    for i, is_full in enumerate(full):
        if is_full:
            assert torch.equal(got[i], ref[i]), f"full step {i} differs from the unpatched model"
        else:
            assert not torch.allclose(got[i], ref[i]), f"cached step {i} should differ (deep features reused)"
            assert torch.isfinite(got[i]).all()
    n_full = sum(full)
    per_full = 2 * (len(unet.input_blocks) - depth) + 1  # deep blocks of one full call
    assert deep_calls(unet, depth) == n_full * per_full  # cached steps never ran a deep block
    assert unet.input_blocks[0].calls == 10 and unet.output_blocks[-1].calls == 10  # shallow ones every step
    assert (hooks.state.full_calls, hooks.state.cached_calls) == (n_full, 10 - n_full)


class WrappedForward(nn.Module):
    """UNetModel.forward's shape: the DIFFUSION_MODEL wrapper dispatched around _forward (what TorchCompileModel
    compiles, the wrapper included)."""

    def __init__(self, unet: TinyUNet, wrapper: Any) -> None:
        super().__init__()
        self.unet, self.wrapper = unet, wrapper

    def forward(self, *args: Any) -> Any:
        return self.wrapper(Executor(self.unet), *args)


def test_under_torch_compile_same_outputs_and_no_graph_per_step() -> None:
    """The per-call bookkeeping runs eagerly under torch.compile: traced, dynamo guarded on the per-step state and
    compiled a graph per step (then hit its recompile limit). Two graphs for 10 steps, full and cached; the same
    outputs as eager. The counting backend runs dynamo's graphs as traced (no C compiler, fast)."""
    unet = TinyUNet().eval()
    xs, sig = latents(), torch.tensor(SIGMAS)
    with torch.no_grad():
        ref = run(unet, hooks_for(), xs, sig)
    graphs: list[Any] = []

    def counting(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    hooks = hooks_for()
    torch._dynamo.reset()
    compiled = torch.compile(WrappedForward(unet, hooks.diffusion_model_wrapper), backend=counting)
    with torch.no_grad():
        got = run(unet, hooks, xs, sig, forward=compiled)
    torch._dynamo.reset()
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {i}")
    n_full = sum(plan_full_steps(10, 3, [True] * 10))
    assert (hooks.state.full_calls, hooks.state.cached_calls) == (n_full, 10 - n_full)
    assert len(graphs) == 2, f"{len(graphs)} graphs for 10 steps"


def test_shallow_forward_equals_full_forward_on_the_same_input() -> None:
    """With the same x and timestep as the full step, the reused deep feature is exact: cached == full forward."""
    unet = TinyUNet().eval()
    x = latents(1)[0]
    sig = torch.tensor([3.0, 2.0, 1.0, 0.0])
    t = torch.tensor([500.0])
    hooks = hooks_for(interval=2, depth=2)
    outs = []
    with torch.no_grad():
        ref = Executor(unet)(x, t, None, None, None, {})
        for i in range(3):
            opts = {"patches": {"output_block_patch": [hooks.output_block_patch]}, "sigmas": sig[i : i + 1]}
            opts["sample_sigmas"] = sig
            outs.append(hooks.diffusion_model_wrapper(Executor(unet), x, t, None, None, None, opts))
    assert (hooks.state.full_calls, hooks.state.cached_calls) == (2, 1)
    torch.testing.assert_close(outs[1], ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(outs[0], ref) and torch.equal(outs[2], ref)


def test_threshold_refreshes_only_on_face_changes() -> None:
    """Region-aware refresh: a change outside the plan's face tokens (reset background) keeps the cached step; the
    same change on the face promotes it to a full step."""
    unet = TinyUNet().eval()
    imp = torch.full((1, 16, 16), 0.1)
    imp[:, 4:12, 4:12] = 1.0  # the face in the middle
    plan = TokenPlan(importance=imp, image_size=(16, 16))
    sig = torch.tensor(SIGMAS[:4] + [0.0])
    x0 = latents(1)[0]
    background = x0.clone()
    background[..., :2, :] += 3.0
    face = x0.clone()
    face[..., 6:10, 6:10] += 3.0
    with torch.no_grad():
        # face: step 1 moved (refresh), step 2 moved back (refresh again); background: both steps stay cached
        for moved, want_cached in ((background, 2), (face, 0)):
            hooks = hooks_for(interval=4, depth=2, threshold=0.2)
            run(unet, hooks, [x0, moved, x0, x0], sig, {PLAN_KEY: plan})
            assert hooks.state.cached_calls == want_cached, moved is face
            assert hooks.state.refreshed == 2 - want_cached
        hooks = hooks_for(interval=4, depth=2, threshold=0.2)  # no plan: every token counts, background refreshes
        run(unet, hooks, [x0, background, x0, x0], sig)
        assert hooks.state.refreshed == 2


def test_stands_aside_for_controlnet_disabled_flag_and_too_deep() -> None:
    unet = TinyUNet().eval()
    xs, sig = latents(), torch.tensor(SIGMAS)
    with torch.no_grad():
        ref = run(unet, None, xs, sig)
        hooks = hooks_for()
        got = run(unet, hooks, xs, sig, control={"input": []})
        assert hooks.state.cached_calls == 0 and "ControlNet" in hooks.state.summary()
        assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
        # a ControlNet whose window ends (end_percent < 1), or on the cond only (the uncond calls have none): after the
        # first call with control the run stays full; the log and summary said "every step full" while later calls
        # were cached (review)
        hooks = hooks_for(interval=2)
        run(unet, hooks, xs, sig, control=[{"input": []}] * 3 + [None] * 7)
        assert hooks.state.cached_calls == 0 and "full from a call on: a ControlNet" in hooks.state.summary()
        hooks = hooks_for(interval=2)
        run(unet, hooks, xs, sig, control=[None] * 5 + [{"input": []}] * 5)  # start_percent > 0: cached before it
        assert 0 < hooks.state.cached_calls and hooks.state.full_calls >= 5
        hooks = hooks_for(depth=4)  # as deep as the model: nothing left to cache
        run(unet, hooks, xs, sig)
        assert hooks.state.cached_calls == 0 and "cache_depth 4" in hooks.state.fallback
        hooks = hooks_for()
        run(unet, hooks, xs, sig, {DISABLED_KEY: True})  # "TokenFuse off" rerun
        assert hooks.state.cached_calls == 0


def test_separate_cond_calls_keep_separate_caches_and_reset_drops_features() -> None:
    """cond and uncond sampled in separate calls (low memory) each reuse their own deep feature."""
    unet = TinyUNet().eval()
    sig = torch.tensor(SIGMAS[:3] + [0.0])
    hooks = hooks_for(interval=3, depth=2)
    x = latents(1)[0]
    with torch.no_grad():
        for i in range(3):
            for cond in (0, 1):
                opts = {
                    "patches": {"output_block_patch": [hooks.output_block_patch]},
                    "sigmas": sig[i : i + 1],
                    "sample_sigmas": sig,
                    "uuids": [f"u{cond}"],
                    "cond_or_uncond": [cond],
                }
                hooks.diffusion_model_wrapper(Executor(unet), x + cond, sig[i : i + 1], None, None, None, opts)
    assert (hooks.state.full_calls, hooks.state.cached_calls) == (4, 2)
    assert len(hooks.state.entries) == 2
    assert "4 full / 2 cached" in hooks.state.summary()
    hooks.state.reset()
    assert not hooks.state.entries and hooks.state.full_calls == 0
