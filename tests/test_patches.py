"""Patch closures driven the way ComfyUI's BasicTransformerBlock / wrap_attn drive them (DESIGN.md §5 keys)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from tokenfuse.scheduling.dit_override import build_attention_override
from tokenfuse.scheduling.keys import UNMERGE_KEY
from tokenfuse.scheduling.patches import build_unet_patches
from tokenfuse.scheduling.plan import TokenPlan
from tokenfuse.scheduling.schedule import Schedule, preset_schedule
from tokenfuse.scheduling.telemetry import RunTelemetry
from tokenfuse.scheduling.unet_table import infer_grid

SAMPLE_SIGMAS = torch.linspace(14.6, 0.0, 11)


def extra_options(
    latent_hw: tuple[int, int], batch: int = 2, step: int = 0, transformer_index: int = 4, plan: TokenPlan | None = None
) -> dict:
    """The keys a real KSampler run puts in extra_options (DESIGN.md §5)."""
    opts = {
        "original_shape": [batch, 4, *latent_hw],
        "activations_shape": [batch, 320, *latent_hw],
        "block": ("input", 1),
        "block_index": 0,
        "transformer_index": transformer_index,
        "n_heads": 8,
        "dim_head": 40,
        "attn_precision": None,
        "cond_or_uncond": [0, 1][:batch],
        "uuids": [],
        "sigmas": SAMPLE_SIGMAS[step : step + 1].expand(batch).clone(),
        "sample_sigmas": SAMPLE_SIGMAS,
        "wrappers": {},
        "callbacks": {},
    }
    if plan is not None:
        opts["tokenfuse_plan"] = plan
    return opts


def attention(n: torch.Tensor, ctx: torch.Tensor, val: torch.Tensor, heads: int = 4) -> torch.Tensor:
    b, c = n.shape[0], n.shape[-1]
    q, k, v = (t.view(b, -1, heads, c // heads).transpose(1, 2) for t in (n, ctx, val))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, c)


def block(f, g, n: torch.Tensor, opts: dict) -> torch.Tensor:
    """BasicTransformerBlock's order: attn1_patch on norm1(x), attention, attn1_output_patch."""
    n2, ctx, val = f(n, n, n, opts)
    return g(attention(n2, ctx, val), opts)


def tokens(b: int, h: int, w: int, c: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, h * w, c, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "n,shape,expected",
    [
        (96 * 96, (96, 96), (8, 96, 96)),
        (48 * 48, (96, 96), (16, 48, 48)),
        (12 * 12, (96, 96), (64, 12, 12)),
        (49 * 38, (97, 75), (16, 49, 38)),
        (13 * 10, (97, 75), (64, 13, 10)),
        (5000, (96, 96), None),
    ],
)
def test_infer_grid_rounds_up_like_comfy_downsampling(n: int, shape: tuple[int, int], expected) -> None:
    assert infer_grid(n, [2, 4, *shape]) == expected


@pytest.mark.parametrize(
    "schedule",
    [
        preset_schedule("off"),
        Schedule(ratios={8: 0.0, 16: 0.5}),
        Schedule(ratios={8: 0.75}, protect_blocks=5),
        Schedule(ratios={8: 0.75}, start_percent=0.5),
    ],
)
def test_inactive_calls_return_the_same_objects(schedule: Schedule) -> None:
    f, g = build_unet_patches(schedule, RunTelemetry())
    n = tokens(2, 16, 12)
    opts = extra_options((16, 12), step=1)
    out = f(n, n, n, opts)
    assert all(a is n for a in out)
    assert UNMERGE_KEY not in opts
    y = attention(n, n, n)
    assert g(y, opts) is y


@pytest.mark.parametrize("strategy,ratio", [("tome", 0.5), ("todo", 0.75), ("topk", 0.5)])
def test_each_strategy_reduces_and_restores_token_count(strategy: str, ratio: float) -> None:
    tel = RunTelemetry()
    f, g = build_unet_patches(Schedule(strategy=strategy, ratios={8: ratio}, protect_blocks=0), tel)
    h, w = 15, 11  # odd, non-square
    n = tokens(2, h, w)
    opts = extra_options((h, w))
    n2, ctx, val = f(n, n, n, opts)
    if strategy == "tome":
        assert n2.shape[1] == h * w - int(h * w * ratio) and ctx is n2 and val is n2
        assert UNMERGE_KEY in opts
    else:
        assert n2 is n and ctx is val and ctx.shape[1] < h * w
    out = g(attention(n2, ctx, val), opts)
    assert out.shape == n.shape and torch.isfinite(out).all()
    assert UNMERGE_KEY not in opts  # consumed: a stale unmerge can never leak into another call
    assert tel.summary()["reduced_calls"] == 1


@pytest.mark.parametrize("strategy", ["tome", "todo", "topk"])
def test_tiles_and_blocks_other_nodes_need_whole_stay_alone(strategy: str) -> None:
    """HyperTile's tiles (a bigger batch, a coarser level's token count), a block with an attn1 replace (PAG / SAG:
    they get the K/V we return and need the block's own), and top-K before another attn1 patch (HyperTile tiles K/V
    as a grid): identity, the same objects. Found by review: each crashed sampling."""
    from tokenfuse.scheduling.keys import NEIGHBOURS_KEY
    from tokenfuse.scheduling.neighbours import Neighbours, neighbours_of

    f, _ = build_unet_patches(Schedule(strategy=strategy, ratios={8: 0.5, 16: 0.5}, protect_blocks=0), RunTelemetry())
    tile = tokens(8, 8, 8)  # 4 tiles of a 16x16 latent (batch 2): the token count of /16
    assert all(a is tile for a in f(tile, tile, tile, extra_options((16, 16))))
    n = tokens(2, 16, 16)
    opts = extra_options((16, 16)) | {NEIGHBOURS_KEY: Neighbours(frozenset({("input", 1, 0)}), False)}
    assert all(a is n for a in f(n, n, n, opts))  # the replaced block
    other = extra_options((16, 16)) | {NEIGHBOURS_KEY: Neighbours(frozenset({("middle", 0, 0)}), False)}
    assert f(n, n, n, other)[1].shape[1] < 256  # another block is reduced
    followed = extra_options((16, 16)) | {NEIGHBOURS_KEY: Neighbours(frozenset(), True)}
    kept = f(n, n, n, followed)
    assert all(a is n for a in kept) if strategy == "topk" else kept[1].shape[1] < 256

    def ours(*a: object) -> None: ...

    def theirs(*a: object) -> None: ...

    assert neighbours_of({"patches": {"attn1_patch": [theirs, ours]}}, ours) is None
    assert neighbours_of({"patches": {"attn1_patch": [ours, theirs]}}, ours) == Neighbours(frozenset(), True)
    theirs.tokenfuse_any_kv = True  # type: ignore[attr-defined]  # e.g. the video's anchor attention: joins any K/V
    assert neighbours_of({"patches": {"attn1_patch": [ours, theirs]}}, ours) is None
    pag = {"patches_replace": {"attn1": {("middle", 0, 0): theirs}}}
    assert neighbours_of(pag, ours) == Neighbours(frozenset({("middle", 0, 0)}), False)


def test_cross_attention_context_is_left_alone() -> None:
    """disable_self_attn blocks pass text context as ctx: K/V strategies skip it, tome merges queries only."""
    n, text = tokens(2, 8, 8), torch.randn(2, 77, 32)
    for strategy in ("todo", "topk", "tome"):
        f, g = build_unet_patches(Schedule(strategy=strategy, ratios={8: 0.5}, protect_blocks=0), RunTelemetry())
        opts = extra_options((8, 8))
        n2, ctx, val = f(n, text, text, opts)
        assert ctx is text and val is text
        assert g(attention(n2, ctx, val), opts).shape == n.shape


def test_composes_with_a_patch_registered_before_ours() -> None:
    """Another pack concatenating reference tokens into ctx/val: we must not pool those (they are not our grid)."""
    n = tokens(2, 8, 8)
    ref = torch.cat([n, tokens(2, 8, 8, seed=1)], dim=1)
    f, _ = build_unet_patches(Schedule(strategy="todo", ratios={8: 0.75}, protect_blocks=0), RunTelemetry())
    n2, ctx, val = f(n, ref, ref, extra_options((8, 8)))
    assert n2 is n and ctx is ref and val is ref


def test_unexpected_output_length_is_passed_through() -> None:
    f, g = build_unet_patches(Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0), RunTelemetry())
    n = tokens(2, 8, 8)
    opts = extra_options((8, 8))
    f(n, n, n, opts)
    odd = torch.zeros(2, 7, 32)
    assert g(odd, opts) is odd


def test_plan_protects_face_tokens_under_tome() -> None:
    h, w = 16, 16
    imp = torch.full((1, 128, 128), 0.1)
    imp[:, 32:96, 40:104] = 1.0
    plan = TokenPlan(importance=imp, image_size=(128, 128))
    f, g = build_unet_patches(Schedule(strategy="tome", ratios={8: 0.75}, protect_blocks=0), RunTelemetry())
    n = tokens(2, h, w)
    opts = extra_options((h, w), plan=plan)
    n2, _, _ = f(n, n, n, opts)
    assert n2.shape[1] < h * w
    restored = g(n2, opts)  # identity "attention": what was merged shows up as changed tokens
    face = plan.level_importance(h, w, 2) >= plan.protect_threshold
    assert face.any() and torch.equal(restored[face], n[face])


def test_plan_keeps_face_kv_at_full_resolution_under_todo_and_topk() -> None:
    h, w = 16, 16
    imp = torch.full((1, 64, 64), 0.1)
    imp[:, 16:32, 16:32] = 1.0
    plan = TokenPlan(importance=imp, image_size=(64, 64))
    n = tokens(2, h, w)
    face_idx = (plan.level_importance(h, w, 1)[0] >= 0.5).nonzero().flatten()
    for strategy, ratio in (("todo", 0.75), ("topk", 0.75)):
        f, _ = build_unet_patches(Schedule(strategy=strategy, ratios={8: ratio}, protect_blocks=0), RunTelemetry())
        _, ctx, _ = f(n, n, n, extra_options((h, w), plan=plan))
        assert ctx.shape[1] < h * w
        for i in face_idx.tolist():  # every face token survives verbatim
            assert (ctx == n[:, i : i + 1]).all(-1).any(1).all()


def test_sigma_window_and_protected_blocks_follow_extra_options() -> None:
    tel = RunTelemetry()
    s = Schedule(strategy="todo", ratios={8: 0.75}, protect_blocks=2, end_percent=0.5)
    f, _ = build_unet_patches(s, tel)
    n = tokens(2, 8, 8)
    assert f(n, n, n, extra_options((8, 8), step=1, transformer_index=0))[1] is n  # protected block
    assert f(n, n, n, extra_options((8, 8), step=1, transformer_index=2))[1].shape[1] == 16
    assert f(n, n, n, extra_options((8, 8), step=6, transformer_index=2))[1] is n  # 60% done: window closed
    summary = tel.summary()
    assert summary["calls"] == 3 and summary["reduced_calls"] == 1 and summary["steps"] == 2


def test_global_rng_untouched_and_results_deterministic() -> None:
    state = torch.get_rng_state()
    outs = []
    for _ in range(2):
        f, g = build_unet_patches(Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0, seed=3), RunTelemetry())
        outs.append(block(f, g, tokens(2, 12, 12), extra_options((12, 12))))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(torch.get_rng_state(), state)


def test_adaptive_ratio_merges_flat_content_more() -> None:
    """A step adapts to what the previous step measured at its level (read a step late: no device sync), so the first
    step keeps the base ratio and the second merges flat content more and busy content less."""
    s = Schedule(strategy="tome", ratios={8: 0.4}, protect_blocks=0, adaptive=0.5)
    h, w = 16, 16
    flat = torch.linspace(0, 1, h * w).view(1, h * w, 1).expand(2, h * w, 32).contiguous()
    noise = tokens(2, h, w)
    base = h * w - int(h * w * 0.4)
    sizes = []
    for x in (flat, noise):
        f, _ = build_unet_patches(s, RunTelemetry())
        sizes.append([f(x, x, x, extra_options((h, w), step=step))[0].shape[1] for step in (0, 1)])
    assert sizes[0][0] == sizes[1][0] == base, sizes
    assert sizes[0][1] < base < sizes[1][1], sizes


def test_adaptive_ratio_reads_the_previous_steps_content() -> None:
    """Flat tokens at step 0 and noise at step 1: step 1 still merges as for flat content (it read step 0's statistic),
    step 2 as for noise; every block at a level adapts alike within a step; a new run (a new sample_sigmas) starts
    again at the base ratio."""
    s = Schedule(strategy="tome", ratios={8: 0.4}, protect_blocks=0, adaptive=0.5)
    h, w = 16, 16
    flat = torch.linspace(0, 1, h * w).view(1, h * w, 1).expand(2, h * w, 32).contiguous()
    noise = tokens(2, h, w)
    base = h * w - int(h * w * 0.4)
    f, _ = build_unet_patches(s, RunTelemetry())
    merged = [f(x, x, x, extra_options((h, w), step=step))[0].shape[1] for step, x in enumerate((flat, noise, flat))]
    assert merged[0] == base and merged[1] < base < merged[2], merged
    again = f(noise, noise, noise, extra_options((h, w), step=2, transformer_index=5))[0].shape[1]
    assert again == merged[2], "a second block of the step read a different statistic"
    fresh = extra_options((h, w), step=3)
    fresh["sample_sigmas"] = SAMPLE_SIGMAS.clone()
    assert f(flat, flat, flat, fresh)[0].shape[1] == base, "a new sampling run read the last run's statistic"


def _override_call(override, q, k, v, heads=4, **kw):
    seen = {}

    def func(q, k, v, heads, mask=None, skip_reshape=False, **kwargs):
        seen.update(q=q, k=k, v=v)
        return q

    override(func, q, k, v, heads, **kw)
    return seen


def test_attention_override_identity_and_reduction() -> None:
    topts = {"sigmas": SAMPLE_SIGMAS[:1], "sample_sigmas": SAMPLE_SIGMAS}
    q = k = v = torch.randn(1, 256, 64)
    off = build_attention_override(preset_schedule("off", "dit"), RunTelemetry())
    seen = _override_call(off, q, k, v, transformer_options=topts)
    assert seen["k"] is k and seen["v"] is v
    tel = RunTelemetry()
    on = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0), tel)
    seen = _override_call(on, q, k, v, transformer_options=topts)
    assert seen["q"] is q and seen["k"].shape == (1, 128, 64) and seen["v"].shape == (1, 128, 64)
    q4 = torch.randn(1, 4, 256, 16)
    seen = _override_call(on, q4, q4, q4, transformer_options=topts, skip_reshape=True)
    assert seen["k"].shape == (1, 4, 128, 16)
    seen = _override_call(on, q, k, v, transformer_options=topts, mask=torch.zeros(256, 256))
    assert seen["k"] is k  # masks are never reduced: pass through
    late = {"sigmas": SAMPLE_SIGMAS[9:10], "sample_sigmas": SAMPLE_SIGMAS}
    windowed = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0, end_percent=0.5), tel)
    assert _override_call(windowed, q, k, v, transformer_options=late)["k"] is k
    # every eligible call is counted, the one outside the window unreduced (the summary said 2/2 reduced, over the
    # window's steps only); the masked call never reaches the schedule
    summary = tel.summary()
    assert summary["calls"] == 3 and summary["reduced_calls"] == 2, summary


def test_real_comfy_transformer_block(comfyui_path) -> None:
    """The closures inside ComfyUI's own BasicTransformerBlock: identity when off, finite and shaped when on."""
    sys.path.insert(0, str(comfyui_path))
    import comfy.cli_args

    if "comfy.model_management" not in sys.modules:
        comfy.cli_args.args.cpu = True
        comfy.cli_args.args.use_pytorch_cross_attention = True
    from comfy.ldm.modules.attention import BasicTransformerBlock

    torch.manual_seed(0)
    blk = BasicTransformerBlock(32, 4, 8, context_dim=16)
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x, text = tokens(2, 9, 7), torch.randn(2, 5, 16)
    base_opts = extra_options((9, 7))
    with torch.no_grad():
        ref = blk(x, context=text, transformer_options=dict(base_opts))
        for schedule, exact in (
            (preset_schedule("off"), True),
            (Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0), False),
            (preset_schedule("balanced"), False),
        ):
            f, g = build_unet_patches(schedule, RunTelemetry())
            opts = {**base_opts, "patches": {"attn1_patch": [f], "attn1_output_patch": [g]}}
            out = blk(x, context=text, transformer_options=opts)
            assert out.shape == ref.shape and torch.isfinite(out).all()
            assert torch.equal(out, ref) == exact


def test_disabled_flag_turns_every_patch_into_identity() -> None:
    """ScheduledFusion's "scheduling off" rerun sets tokenfuse_disabled; patches wrapped by other packs honour it."""
    f, g = build_unet_patches(Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0), RunTelemetry())
    n = tokens(2, 16, 12)
    opts = {**extra_options((16, 12)), "tokenfuse_disabled": True}
    out = f(n, n, n, opts)
    assert out[0] is n and out[1] is n and out[2] is n
    assert g(n, opts) is n
    override = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0), RunTelemetry())
    seen = []
    q = torch.randn(1, 256, 32)
    override(
        lambda *a, **kw: seen.append(a[1].shape[1]),
        q,
        q,
        q,
        4,
        transformer_options={"tokenfuse_disabled": True, "sigmas": SAMPLE_SIGMAS[:1], "sample_sigmas": SAMPLE_SIGMAS},
    )
    assert seen == [256]


def _flux_call(wrapper, override, x: torch.Tensor, text: int, extra: int, opts: dict) -> set[int]:
    """One Flux-style model call through the plan wrapper: attention over [text, ceil(H/2) x ceil(W/2) image tokens,
    extra reference tokens]; returns the token indices the override kept in K. K's saliency channels are 0 for text
    tokens and for the image tokens of the top-left quarter (the face), large elsewhere, so saliency alone drops them;
    channel 64 carries each token's index."""
    gh, gw = -(-x.shape[2] // 2), -(-x.shape[3] // 2)
    n = text + gh * gw + extra
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(x.shape[0], n, 72, generator=gen) * 10
    face = [text + r * gw + c for r in range(gh // 2) for c in range(gw // 2)]
    k[:, :text, :64] = 0.0
    k[:, face, :64] = 0.0
    k[:, :, 64] = torch.arange(n, dtype=k.dtype)
    kept: list[set[int]] = []

    def func(q, k, v, heads, **kw):
        kept.append({int(i) for i in k[0, :, 64].tolist()})
        return q

    def model(x, timestep, context, y, guidance, ref_latents, control, transformer_options):
        override(func, k.clone(), k, k.clone(), 2, transformer_options=transformer_options)

    wrapper(model, x, None, torch.zeros(x.shape[0], text, 8), None, None, None, None, opts)
    return kept[0], set(range(text)), set(face)


def test_a_token_plan_reaches_the_flux_joint_sequence() -> None:
    """On Flux the TOKEN_PLAN was ignored: the top-K K/V dropped face tokens and the prompt's text tokens whenever
    saliency ranked them low. Mapped onto [text, 2x2-patchified latent] (odd latent: the grid rounds up), the text and
    the face tokens are always kept, references after them only by saliency; without a plan nothing changes."""
    from tokenfuse.scheduling.dit_override import build_plan_wrapper
    from tokenfuse.scheduling.keys import PLAN_KEY

    imp = torch.full((1, 168, 152), 0.1)
    imp[:, :80, :72] = 1.0  # the face: the top-left quarter of the image's 10 x 10 token grid (rows/cols 0-4)
    plan = TokenPlan(importance=imp, image_size=(168, 152))
    topts = {"sigmas": SAMPLE_SIGMAS[:1], "sample_sigmas": SAMPLE_SIGMAS}
    x = torch.zeros(2, 16, 21, 19)  # cond + uncond; latent grid ceil(21/2) x ceil(19/2) = 11 x 10
    override = build_attention_override(Schedule(dit_ratio=0.6, protect_blocks=0), RunTelemetry())
    wrapper = build_plan_wrapper(2)
    kept, text, face = _flux_call(wrapper, override, x, 12, 6, {**topts, PLAN_KEY: plan})
    assert text <= kept and face <= kept, (sorted(text - kept), sorted(face - kept))
    kept_off, _, _ = _flux_call(wrapper, override, x, 12, 6, dict(topts))
    assert not (text <= kept_off) and not (face <= kept_off)


def test_the_override_reduces_sd3s_joint_attention() -> None:
    """SD3's MMDiT (ComfyUI 0.3.64) calls the override with q, k as [B, N, H*D] and v as [B, N, H, D]: the override
    passed every call through (k and v shapes differ). It keeps the same top-K tokens of both, v flattened as the
    attention function reads it."""
    topts = {"sigmas": SAMPLE_SIGMAS[:1], "sample_sigmas": SAMPLE_SIGMAS}
    q = k = torch.randn(2, 256, 64)
    v = k.clone().reshape(2, 256, 4, 16).transpose(1, 2).transpose(1, 2)  # a 4-D view, as split_qkv leaves it
    tel = RunTelemetry()
    override = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0), tel)
    seen = _override_call(override, q, k, v, transformer_options=topts)
    assert seen["k"].shape == (2, 128, 64) and torch.equal(seen["v"], seen["k"])
    assert tel.summary()["reduced_calls"] == 1


def test_an_unmapped_plan_on_a_dit_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    """ScheduledFusion's crop plan on SD3 / Wan (no sequence mapping) was silently ignored while the fusion report
    said "plan keeps ~N": the override warns once per patched model; a mapped plan (Flux) does not warn."""
    import logging

    from tokenfuse.scheduling.dit_override import DitPlan
    from tokenfuse.scheduling.keys import DIT_PLAN_KEY, PLAN_KEY

    plan = TokenPlan(importance=torch.ones(1, 16, 16), image_size=(16, 16))
    topts = {"sigmas": SAMPLE_SIGMAS[:1], "sample_sigmas": SAMPLE_SIGMAS, PLAN_KEY: plan}
    q = torch.randn(1, 256, 64)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        mapped = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0), RunTelemetry())
        _override_call(mapped, q, q, q, transformer_options={**topts, DIT_PLAN_KEY: DitPlan(torch.zeros(1, 256), 0)})
        assert not caplog.records
        override = build_attention_override(Schedule(dit_ratio=0.5, protect_blocks=0), RunTelemetry())
        for _ in range(3):
            _override_call(override, q, q, q, transformer_options=topts)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "TOKEN_PLAN is not used" in warned[0], warned
