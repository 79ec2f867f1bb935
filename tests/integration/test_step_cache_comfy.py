"""The step cache (Schedule.cache_*) inside real ComfyUI sampling on random-weight SD1.5 / SDXL U-Nets.

Checks: on cached steps no deep block runs (forward hooks on the real blocks count the calls); every full call's output
equals the unpatched U-Net's on the same input (replayed on the bare module); the shallow forward reproduces
ComfyUI's UNetModel._forward exactly when the deep feature is current; the input MODEL (options, wrappers, module
hooks, weights) is never mutated; "scheduling off" (strip_tokenfuse) removes the cache; one summary line per run.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from tokenfuse.nodes.model_patching import strip_tokenfuse
from tokenfuse.nodes.scheduler_node import TokenSchedulerController
from tokenfuse.scheduling.keys import DISABLED_KEY, PLAN_KEY
from tokenfuse.scheduling.step_cache import StepCacheKeys, build_step_cache, plan_full_steps

pytestmark = pytest.mark.integration
NODE = TokenSchedulerController()
SIZE = 128  # px: latent 16x16
STEPS = 4  # interval 3: full, cached, cached, full (the last step is always full)
CACHE = '{"cache_interval": 3, "cache_depth": 2}'


def ksample(comfy: SimpleNamespace, model, family: str, steps: int = STEPS, cfg: float = 2.0) -> torch.Tensor:
    pos = comfy.models.conditioning(family, seed=1, tiny=True)
    neg = comfy.models.conditioning(family, seed=2, tiny=True)
    latent = {"samples": torch.zeros(1, comfy.models.latent_channels(family), SIZE // 8, SIZE // 8)}
    (out,) = comfy.nodes.common_ksampler(model, 0, steps, cfg, "euler", "normal", pos, neg, latent)
    assert torch.isfinite(out["samples"]).all()
    return out["samples"]


class BlockCounter:
    """Forward hooks on the deep blocks of a U-Net (input blocks from `depth`, middle, output blocks before n-depth)
    and a record of every U-Net call's inputs/output; removed on exit so the shared module is left as it was."""

    def __init__(self, unet: torch.nn.Module, depth: int) -> None:
        n = len(unet.output_blocks)
        blocks = [*unet.input_blocks[depth:], unet.middle_block, *unet.output_blocks[: n - depth]]
        # UNetModel._forward runs a block's layers through forward_timestep_embed, not the block's __call__: hook them
        self.deep = [layer for block in blocks for layer in block]
        self.unet, self.calls, self.deep_calls, self.handles = unet, [], 0, []

    def __enter__(self) -> BlockCounter:
        def count(*_: object) -> None:
            self.deep_calls += 1

        def pre(_m, args, kwargs):
            self.calls.append({"args": args, "kwargs": dict(kwargs)})

        def post(_m, _args, _kwargs, out):
            self.calls[-1]["out"] = out
            self.calls[-1]["deep_after"] = self.deep_calls

        self.handles = [b.register_forward_hook(count) for b in self.deep]
        self.handles.append(self.unet.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(self.unet.register_forward_hook(post, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()


def snapshot(model) -> tuple[str, str, int, float]:
    unet = model.model.diffusion_model
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in unet.modules())
    weights = float(sum(p.detach().double().sum() for p in unet.parameters()))
    return repr(model.model_options), repr(model.wrappers), hooks, weights


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_cached_steps_skip_deep_blocks_and_full_steps_equal_unpatched(comfy, random_model, caplog, family) -> None:
    model = random_model(family)
    unet = model.model.diffusion_model
    before = snapshot(model)
    base = ksample(comfy, model, family)
    patched, report = NODE.apply(model, "off", "preset", 0.0, schedule_text=CACHE)
    assert "step cache every 3 steps, depth 2" in report
    with caplog.at_level(logging.INFO), BlockCounter(unet, depth=2) as counter, torch.inference_mode():
        out = ksample(comfy, patched, family)
    assert snapshot(model) == before, "the input MODEL was mutated"
    assert not torch.equal(out, base)  # cached steps reuse deep features: the result moves (a little)

    full = plan_full_steps(STEPS, 3, [True] * STEPS)
    assert len(counter.calls) == STEPS  # cfg 2: cond + uncond in one batched call per step
    per_full = len(counter.deep)
    deep_before = 0
    for i, (call, is_full) in enumerate(zip(counter.calls, full, strict=True)):
        ran = call["deep_after"] - deep_before
        deep_before = call["deep_after"]
        assert ran == (per_full if is_full else 0), f"step {i}: {ran} deep block calls"
        if is_full:  # replay the same inputs on the bare U-Net (no wrappers, no patches): bit-identical
            with torch.inference_mode():
                args, kwargs = call["args"], dict(call["kwargs"])
                kwargs["transformer_options"] = {}
                ref = unet(*args, **kwargs)
            assert torch.equal(call["out"], ref), f"full step {i} differs from the unpatched U-Net"
    lines = [r.getMessage() for r in caplog.records if "step cache" in r.getMessage()]
    assert len(lines) == 1 and f"{sum(full)} full / {STEPS - sum(full)} cached U-Net calls" in lines[0]

    off = strip_tokenfuse(patched)  # ScheduledFusion's "scheduling off" rerun drops the cache too
    assert not off.model_options["transformer_options"].get("patches", {}).get("output_block_patch")
    assert torch.equal(ksample(comfy, off, family), base)


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_shallow_forward_reproduces_comfy_forward(comfy, random_model, family) -> None:
    """Same x and timestep as the full step: the cached call (shallow blocks on the kept deep feature) equals
    ComfyUI's own UNetModel._forward, from the shallowest to the deepest cache depth (SDXL also exercises the label
    embedding y)."""
    import comfy.patcher_extension as pe
    from comfy.ldm.modules.diffusionmodules.util import timestep_embedding

    unet = random_model(family).model.diffusion_model
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 16, generator=g)
    t = torch.tensor([500.0, 500.0])
    ctx = comfy.models.conditioning(family, seed=1, tiny=True)[0][0].repeat(2, 1, 1)
    # UNetModel keeps no adm_in_channels attribute: SDXL's label embedding is Sequential(Sequential(Linear(adm, ..)))
    y = torch.randn(2, unet.label_emb[0][0].in_features, generator=g) if unet.num_classes is not None else None
    sig = torch.tensor([3.0, 2.0, 1.0, 0.0])
    with torch.inference_mode():
        ref = unet(x, t, context=ctx, y=y, transformer_options={})
        n = len(unet.input_blocks)
        for depth in sorted({1, 2, n // 2, n - 1}):  # shallowest, default, middle, deepest
            hooks = build_step_cache(2, depth, 0.0, timestep_embedding, StepCacheKeys(PLAN_KEY, DISABLED_KEY))
            hooks.state.reset()
            outs = []
            for i in range(3):
                opts = {"patches": {"output_block_patch": [hooks.output_block_patch]}, "sigmas": sig[i : i + 1]}
                opts.update(sample_sigmas=sig, uuids=["a", "b"], cond_or_uncond=[0, 1])
                # registered the way ModelPatcher.add_wrapper_with_key does, dispatched by UNetModel.forward itself
                opts["wrappers"] = {pe.WrappersMP.DIFFUSION_MODEL: {"tokenfuse": [hooks.diffusion_model_wrapper]}}
                outs.append(unet(x, t, context=ctx, y=y, control=None, transformer_options=opts))
            assert hooks.state.cached_calls == 1, depth
            assert torch.equal(outs[0], ref)
            torch.testing.assert_close(outs[1], ref, rtol=1e-5, atol=1e-5, msg=f"depth {depth}")


def test_cache_composes_with_balanced_tokens_and_a_token_plan(comfy, random_model, caplog) -> None:
    """ours (both): the balanced attention patches run on the shallow blocks of cached steps too, and the face-drift
    threshold keeps a step whose face moved little cached and refreshes one whose face moved a lot."""
    from tokenfuse.scheduling.plan import TokenPlan

    model = random_model("sd15")
    imp = torch.full((1, SIZE, SIZE), 0.1)
    imp[:, 32:96, 32:96] = 1.0
    plan = TokenPlan(importance=imp, image_size=(SIZE, SIZE))
    # Steps 1 and 2 are cached by the interval; the threshold compares each with step 0's model input on the 64 face
    # tokens (8x8 of 16x16) per image. This random-weight U-Net's eps is large, so the scaled input grows (mean |x| 0.81
    # -> 4.3 -> 9.9): face drift 4.5 at step 1 (kept cached) and 11.6 at step 2 (refreshed: full).
    text = '{"cache_interval": 3, "cache_threshold": 8.0}'
    patched, _ = NODE.apply(model, "balanced", "preset", 0.0, token_plan=plan, schedule_text=text)
    assert patched.model_options["transformer_options"][PLAN_KEY] is plan
    with caplog.at_level(logging.INFO):
        ksample(comfy, patched, "sd15")
    (line,) = [r.getMessage() for r in caplog.records if "tokens saved" in r.getMessage()]
    assert "attention calls reduced" in line and "step cache 3 full / 1 cached" in line and "8: 1 refreshed" in line


def test_cached_steps_apply_freeu_once_like_the_full_step(comfy, random_model) -> None:
    """ComfyUI's FreeU / FreeU_V2 scale the feature entering an output block in place, through an output_block_patch.
    The cache kept that feature by reference after FreeU had scaled it, and each cached step ran FreeU on it again:
    0.35 off the full forward at cache depth 3, growing with every cached step. Ours now runs first, keeps a copy,
    and a cached step applies FreeU to a fresh copy: every cached call equals the full forward."""
    import comfy.patcher_extension as pe
    from comfy.ldm.modules.diffusionmodules.util import timestep_embedding
    from comfy_extras.nodes_freelunch import FreeU_V2

    model = random_model("sd15")
    freeu = FreeU_V2().patch(model, 1.3, 1.4, 0.9, 0.2)[0]
    (freeu_patch,) = freeu.model_options["transformer_options"]["patches"]["output_block_patch"]
    # the node puts the cache's patch first even when FreeU came before it in the graph
    scheduled, _ = NODE.apply(freeu, "balanced", "preset", 0.0, schedule_text='{"cache_interval": 3}')
    listed = scheduled.model_options["transformer_options"]["patches"]["output_block_patch"]
    assert listed[0].__module__.endswith(".scheduling.step_cache") and listed[1] is freeu_patch

    unet = model.model.diffusion_model
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 16, generator=g)
    t = torch.tensor([500.0, 500.0])
    ctx = comfy.models.conditioning("sd15", seed=1, tiny=True)[0][0].repeat(2, 1, 1)
    sig = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.0])
    with torch.inference_mode():
        ref = unet(x, t, context=ctx, transformer_options={"patches": {"output_block_patch": [freeu_patch]}})
        for depth in (2, 3, len(unet.input_blocks) - 1):  # depth >= 3 reaches FreeU's channel counts
            hooks = build_step_cache(3, depth, 0.0, timestep_embedding, StepCacheKeys(PLAN_KEY, DISABLED_KEY))
            hooks.state.reset()
            outs = []
            for i in range(3):
                opts = {"patches": {"output_block_patch": [hooks.output_block_patch, freeu_patch]}}
                opts.update(sigmas=sig[i : i + 1], sample_sigmas=sig, uuids=["a", "b"], cond_or_uncond=[0, 1])
                opts["wrappers"] = {pe.WrappersMP.DIFFUSION_MODEL: {"tokenfuse": [hooks.diffusion_model_wrapper]}}
                outs.append(unet(x, t, context=ctx, control=None, transformer_options=opts))
            assert hooks.state.cached_calls == 2, depth
            for out in outs:
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=f"depth {depth}")
