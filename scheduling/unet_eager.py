"""The eager U-Net attn1 patches: per attention call a lookup in the call table, then the strategy's reduction.

attn1_patch(n, ctx, val, extra_options) -> (n, ctx, val) and attn1_output_patch(n, extra_options) -> n, as
patches.py documents them. The host work of a call is a lookup in the current `Row` (unet_table.py), picked once per
model call (`repick`); its entries are built once (`entry_for`) with what the strategy settles for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from . import calibrate
from .adaptive import adapt_ratio
from .downsample import kernel_for_ratio
from .keys import DISABLED_KEY, NEIGHBOURS_KEY, PLAN_KEY, UNMERGE_KEY
from .neighbours import stands_aside
from .schedule import MAX_RATIO
from .unet_state import ModelCall, UnetState
from .unet_table import Call, Row, block_label, infer_grid

AttnPatch = Callable[[torch.Tensor, Any, Any, dict[str, Any]], tuple[torch.Tensor, Any, Any]]
OutputPatch = Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]

_MISSING: Any = object()


def repick(st: UnetState, options: dict[str, Any], shape: Any = _MISSING) -> ModelCall:
    """The model call of these options becomes the one in force, with its row of the call table."""
    shape = options.get("original_shape") if shape is _MISSING else shape
    plan = options.get(PLAN_KEY)
    info = st.steps(options)
    key = (
        tuple(int(d) for d in shape) if isinstance(shape, (list, tuple)) else None,
        st.schedule.active_at(info.progress),
        id(plan),
    )
    if plan is not st.call.plan:
        st.rows.clear()  # a new plan: its ids may be reused later, never serve an old plan's row
    row: Row = st.rows.get_or(key, Row)
    st.call = ModelCall(shape, options.get("sigmas"), options.get("sample_sigmas"), plan, row, info)
    return st.call


def elsewhere(st: UnetState, n: torch.Tensor, options: dict[str, Any]) -> bool:
    """A call to leave alone whatever the table says: tiles of another patch (HyperTile: a batch of tiles, whose
    token count can equal a coarser level's), or a block whose neighbours need its own K/V (Neighbours)."""
    shape = options.get("original_shape")
    if shape is not None and len(shape) > 0 and n.shape[0] != shape[0]:
        st.warn_once(
            "tiles",
            "TokenFuse: attention calls with a batch of %d for a latent batch of %d (another node tiles them, e.g. "
            "HyperTile) are left unreduced",
            n.shape[0],
            shape[0],
        )
        return True
    nb = options.get(NEIGHBOURS_KEY)
    if nb is None or not stands_aside(nb, options, st.strategy.keeps_grid):
        return False
    if nb.followed and not st.strategy.keeps_grid:
        st.warn_once(
            "followed",
            "TokenFuse: another attn1 patch runs after TokenFuse (e.g. HyperTile) and needs the keys/values as a grid: "
            "strategy %s leaves attention unreduced (todo keeps a grid; or apply that node before "
            "TokenSchedulerController)",
            st.schedule.strategy,
        )
    else:
        st.warn_once(
            "replaced",
            "TokenFuse: attention of blocks another node replaces (e.g. PAG, SAG: %s) left unreduced: the replacement "
            "needs the block's own keys/values",
            sorted(nb.replaced, key=str),
        )
    return True


def entry_for(st: UnetState, n: torch.Tensor, options: dict[str, Any]) -> Call | None:
    """Build (once) what a call with n's token count at its transformer index does in the current row."""
    grid = infer_grid(n.shape[1], options.get("original_shape"))
    if grid is None and options.get("original_shape") is not None:  # once per table row and token count
        st.warn_once(
            "grid",
            "TokenFuse: an attention call with %d tokens matches no latent grid of this image (another node merged "
            "tokens before TokenFuse, e.g. ComfyUI's TomePatchModel applied first?); TokenFuse leaves those calls "
            "alone. Apply TomePatchModel after TokenSchedulerController, or use one of them.",
            n.shape[1],
        )
    if grid is None:
        return None
    level, h, w = grid
    schedule, info = st.schedule, st.call.info
    t = int(options.get("transformer_index", options.get("block_index", 0)) or 0)
    ratio = schedule.ratio_for(level, t) if schedule.active_at(info.progress) else 0.0
    call = Call(block_label(options), level, h, w, ratio, None)
    if ratio > 0.0 and schedule.adaptive == 0.0 and not st.strategy.per_step:  # per step: settled eagerly per call
        call = settled(st, call, n, ratio, info.step)
    if ratio > 0.0 and schedule.device_aware and not calibrated(st, n, options, call, info.step):
        call = call._replace(ratio=0.0, fn=None, parts=None)
    return call


def settled(st: UnetState, call: Call, n: torch.Tensor, ratio: float, step: int) -> Call:
    """call at this ratio with what its reduction needs in the current row (around its plan's protected tokens)."""
    if ratio <= 0.0:
        return call._replace(ratio=ratio)
    return st.strategy.settle(st.reduce_state, call, n, st.call.plan, ratio, step)


def calibrated(st: UnetState, n: torch.Tensor, options: dict[str, Any], call: Call, step: int) -> bool:
    """Device-aware schedules: whether reducing this level pays here (measured once per shape, see calibrate.py)."""
    level, h, w, ratio, fn = call.level, call.h, call.w, call.ratio, call.fn

    def kv_of(x: torch.Tensor) -> torch.Tensor:
        if fn is not None:
            out: torch.Tensor = fn(x)
            return out
        return st.strategy.reduce(st.reduce_state, x, x, x, dict(options), level, h, w, ratio, step)[1]  # type: ignore[no-any-return]

    heads = int(options.get("n_heads") or 8)
    dim_head = int(options.get("dim_head") or max(1, n.shape[2] // heads))
    key = (st.schedule.strategy, kernel_for_ratio(ratio), options.get(PLAN_KEY) is not None)
    check = calibrate.check_level(n, kv_of, level, heads, dim_head, key)
    st.telemetry.note_level(check)
    return check.kept


def reduced(  # noqa: PLR0913 - hot path: called per attention call the table does not settle; a per-call argument object would allocate
    st: UnetState, call: Call, row: Row, n: torch.Tensor, ctx: Any, val: Any, options: dict[str, Any]
) -> tuple[torch.Tensor, Any, Any]:
    """(n, ctx, val) of a call the table does not settle for shared K/V: the adaptive ratio (lowvram presets) and the
    strategy's reduction; while a compiled row learns, what it reduced by is held for the step window."""
    schedule, info = st.schedule, st.call.info
    try:
        ratio = call.ratio
        if schedule.adaptive > 0.0:
            key = (call.level, n.shape[0])
            c = st.complexity(key, st.call.sample_sigmas, info.step, info.sigma, n, call.h, call.w, now=row.learning)
            ratio = adapt_ratio(ratio, c, schedule.adaptive, MAX_RATIO)
        if row.learning and (schedule.adaptive > 0.0 or st.strategy.per_step):
            row.held[(n.shape[1], options.get("transformer_index"))] = settled(st, call, n, ratio, info.step)
        if ratio > 0.0:
            return st.strategy.reduce(
                st.reduce_state, n, ctx, val, options, call.level, call.h, call.w, ratio, info.step
            )
    except Exception as exc:  # a shape we did not foresee: run this call unreduced, never crash sampling
        skipped(st, exc)
    return n, ctx, val


def skipped(st: UnetState, exc: Exception) -> None:
    """A reduction that raised: the call runs unreduced (warned once)."""
    st.warn_once(
        "reduce", "TokenFuse: token reduction skipped (%s: %s); attention runs unchanged", type(exc).__name__, exc
    )


def eager_attn1_patch(st: UnetState) -> AttnPatch:
    """The eager attn1_patch of a patched model (patches.py registers it, or calls it from the traced one)."""
    strategy, telemetry, static_off, timing = st.schedule.strategy, st.telemetry, st.static_off, st.timing

    def attn1_patch(
        n: torch.Tensor, ctx: Any, val: Any, extra_options: dict[str, Any]
    ) -> tuple[torch.Tensor, Any, Any]:
        if static_off or n.ndim != 3 or extra_options.get(DISABLED_KEY):
            return n, ctx, val
        t0 = time.perf_counter() if timing else 0.0
        mc = st.call
        if (
            extra_options.get("sigmas") is not mc.sigmas
            or extra_options.get("original_shape") is not mc.shape
            or extra_options.get(PLAN_KEY) is not mc.plan
            or extra_options.get("sample_sigmas") is not mc.sample_sigmas
        ):
            mc = repick(st, extra_options)
        shape = mc.shape
        if ((shape is not None and n.shape[0] != shape[0]) or NEIGHBOURS_KEY in extra_options) and elsewhere(
            st, n, extra_options
        ):
            return n, ctx, val
        row, n_tok, tidx = mc.row, n.shape[1], extra_options.get("transformer_index")
        by_tidx = row.calls.get(n_tok)
        if by_tidx is None:
            by_tidx = row.calls[n_tok] = {}
        call = by_tidx.get(tidx, _MISSING)
        if call is _MISSING:
            call = by_tidx[tidx] = entry_for(st, n, extra_options)
            row.frozen = None  # a call the frozen table missed (its learning call skipped blocks): learn it again
        if call is None:
            return n, ctx, val
        out = (n, ctx, val)
        if call.ratio > 0.0:
            if call.fn is not None and ctx is n and val is n:  # the common todo case: one pool, shared K/V
                try:
                    kv = call.fn(n)
                    out = (n, kv, kv)
                except Exception as exc:  # as in `reduced`: never crash sampling
                    skipped(st, exc)
            else:
                out = reduced(st, call, row, n, ctx, val, extra_options)
        new_ctx, q_out = out[1], out[0].shape[1]
        kv_in = ctx.shape[1] if isinstance(ctx, torch.Tensor) and ctx.ndim == 3 else n_tok
        kv_out = new_ctx.shape[1] if isinstance(new_ctx, torch.Tensor) and new_ctx.ndim == 3 else q_out
        if row.learning:
            row.replay.append(
                ((n_tok, tidx), extra_options.get("block"), (call.label, call.level, n_tok, q_out, kv_in, kv_out))
            )
        info, seconds = mc.info, (time.perf_counter() - t0) if timing else None
        telemetry.record(call.label, call.level, info.step, info.sigma, n_tok, q_out, kv_in, kv_out, strategy, seconds)
        return out

    return attn1_patch


def eager_attn1_output_patch(st: UnetState) -> OutputPatch:
    """The eager attn1_output_patch: restores N tokens after a merge, from the unmerge attn1_patch left in
    extra_options (a fresh dict per BasicTransformerBlock call, so concurrent blocks never mix them up)."""
    telemetry, timing = st.telemetry, st.timing

    def attn1_output_patch(n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        entry = extra_options.pop(UNMERGE_KEY, None)
        if entry is None:
            return n
        unmerge, merged_len = entry
        if n.ndim != 3 or n.shape[1] != merged_len:
            st.warn_once(
                "unmerge",
                "TokenFuse: attention output has %s tokens, expected %d (another patch changed it); left as is",
                tuple(n.shape),
                merged_len,
            )
            return n
        t0 = time.perf_counter() if timing else 0.0
        out: torch.Tensor = unmerge(n)
        if timing:
            telemetry.add_seconds(time.perf_counter() - t0)
        return out

    return attn1_output_patch
