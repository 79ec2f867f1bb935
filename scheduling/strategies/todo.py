"""todo: pool K/V spatially (ToDo, token downsampling); q keeps every token. Math: scheduling/downsample.py.

Cells holding protected plan tokens keep full resolution. The pooling closure is prebuilt per (grid, kernel) (and
per plan, batch and device with a plan), so an eager call with shared K/V is one call of `Call.fn`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..downsample import kernel_for_ratio, pool_keeping, pool_tokens
from ..keys import PLAN_KEY
from ..reducers import ReduceState, kv_targets
from ..schedule import Schedule
from ..unet_table import EAGER, Call, TraceAction

# The traced action: (h, w, kernel, pool mode, free cells, full-resolution tokens), the last two None without a plan
# (downsample.pool_tokens / pool_keeping)
Pool = tuple[int, int, tuple[int, int], str, torch.Tensor | None, torch.Tensor | None]


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
    """Pool K/V spatially (kernel snapped from the ratio); cells holding protected plan tokens keep full resolution."""
    plan = options.get(PLAN_KEY)
    if plan is None:
        fn = state.pool_fn(h, w, ratio)
    else:
        fn = state.plan_pool_fn(plan, h, w, n.shape[0], ratio, n.device)
    new_ctx, new_val = kv_targets(n, ctx, val, fn)
    return n, new_ctx, new_val


def settle(state: ReduceState, call: Call, n: torch.Tensor, plan: Any, ratio: float, step: int) -> Call:  # noqa: PLR0913 - hot path: Settle, called from the attention patch per settled call; a per-call argument object would allocate
    """The call with its prebuilt K/V pooling (`fn`) and, with a plan, (free cells, full-resolution tokens)."""
    h, w = call.h, call.w
    if plan is None:
        return call._replace(ratio=ratio, fn=state.pool_fn(h, w, ratio))
    fn = state.plan_pool_fn(plan, h, w, n.shape[0], ratio, n.device)
    keep = state.plan_keep(plan, h, w, n.shape[0], kernel_for_ratio(ratio), n.device)
    return call._replace(ratio=ratio, fn=fn, parts=keep)


def action(call: Call, schedule: Schedule) -> TraceAction:
    """The pooling as a Pool tuple, EAGER while unsettled (no `fn` yet: adaptive ratios)."""
    if call.fn is None:
        return EAGER
    keep = call.parts
    free, full = keep if keep is not None and keep[1].numel() > 0 else (None, None)
    return (call.h, call.w, kernel_for_ratio(call.ratio), schedule.pool, free, full)


def traced(action: Pool, n: torch.Tensor, ctx: Any, val: Any, options: dict[str, Any]) -> tuple[torch.Tensor, Any, Any]:
    """K/V pooled in the graph, around the plan's protected cells when it has any."""
    h, w, kernel, mode, free, full = action
    if free is None or full is None:  # both or neither (`action`)
        return (n, *kv_targets(n, ctx, val, lambda t: pool_tokens(t, h, w, kernel, mode)))
    return (n, *kv_targets(n, ctx, val, lambda t: pool_keeping(t, h, w, kernel, mode, free, full)))
