"""topk: keep the most salient K/V tokens; q keeps every token. Math: scheduling/topk.py.

A plan's importance adds a bonus (protected tokens always win). The kept tokens are no grid, so a later attn1 patch
that tiles K/V (HyperTile) makes this strategy stand aside (`keeps_grid=False` in the registry).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..keys import PLAN_KEY
from ..reducers import ReduceState, kv_targets
from ..schedule import Schedule
from ..topk import gather_tokens, keep_count, topk_indices, topk_kv_functions
from ..unet_table import EAGER, Call, TraceAction


class TopK(NamedTuple):
    """A traced top-K K/V call: how many tokens to keep and the plan's ROI bonus [B, N] (None without a plan)."""

    keep: int
    bonus: torch.Tensor | None


def reduce(  # noqa: PLR0913 - hot path: Reducer, called per attention call; a per-call argument object would allocate
    state: ReduceState,
    n: torch.Tensor,
    ctx: Any,
    val: Any,
    options: dict[str, Any],
    level: int,
    h: int,
    w: int,
    ratio: float,
    step: int,
) -> tuple[torch.Tensor, Any, Any]:
    """Keep the most salient K/V tokens (plan importance adds a bonus; protected tokens are always kept)."""
    plan = options.get(PLAN_KEY)
    bonus, min_keep = (None, 0) if plan is None else state.topk_bonus(plan, h, w, n.shape[0], n.device)
    fn = topk_kv_functions(n, ratio, bonus, min_keep)
    new_ctx, new_val = kv_targets(n, ctx, val, fn)
    return n, new_ctx, new_val


def settle(state: ReduceState, call: Call, n: torch.Tensor, plan: Any, ratio: float, step: int) -> Call:  # noqa: PLR0913 - hot path: Settle, called from the attention patch per settled call; a per-call argument object would allocate
    """The call with its kept count and ROI bonus (the selection itself is data-dependent: made per call)."""
    h, w = call.h, call.w
    bonus, min_keep = (None, 0) if plan is None else state.topk_bonus(plan, h, w, n.shape[0], n.device)
    return call._replace(ratio=ratio, parts=TopK(keep_count(h * w, ratio, min_keep), bonus))


def action(call: Call, schedule: Schedule) -> TraceAction:
    """The settled TopK, None when it keeps every token, EAGER while unsettled."""
    if call.parts is None:
        return EAGER
    topk: TopK = call.parts
    return None if topk.keep >= call.h * call.w else topk


def traced(action: TopK, n: torch.Tensor, ctx: Any, val: Any, options: dict[str, Any]) -> tuple[torch.Tensor, Any, Any]:
    """The top-K selection in the graph (a fixed count)."""
    idx = topk_indices(n, action.keep, action.bonus)
    return (n, *kv_targets(n, ctx, val, lambda t: gather_tokens(t, idx)))
