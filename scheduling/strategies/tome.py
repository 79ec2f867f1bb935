"""tome: merge the most similar tokens (ToMe for SD): q, k and v shrink, attn1_output_patch restores N tokens.

The src/dst partition is re-drawn every step (seeded by it), so eager calls settle per step; compiled ones hold the
learning call's partition for the step window. Protected plan tokens never merge. Math: scheduling/merge.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..keys import PLAN_KEY, TRACED_UNMERGE_KEY, UNMERGE_KEY
from ..merge import bipartite_soft_matching_2d, do_nothing, max_merge_count, random_partition
from ..reducers import ReduceState, kv_targets
from ..schedule import Schedule
from ..transfer import to_device
from ..unet_table import EAGER, Call, TraceAction

TOME_MAX_RATIO = 0.75  # a 2x2 stride leaves 3/4 of tokens as src: more cannot be merged


class Tome(NamedTuple):
    """A traced tome call: the src/dst partition and protected tokens on the device, and the merge count r."""

    src: torch.Tensor
    dst: torch.Tensor
    r: int
    protected: torch.Tensor | None


PartitionKey = tuple[int, int, int, int, int, torch.device]  # (h, w, sx, sy, seed, device): the partitions cache key


def _partition(key: PartitionKey) -> tuple[torch.Tensor, ...]:
    """(src, dst) on the CPU and on the device of a cache key (the key itself: no argument object on a miss)."""
    h, w, sx, sy, seed, device = key
    src, dst = random_partition(h, w, sx, sy, seed)
    return src, dst, to_device(src, device), to_device(dst, device)


def tome_parts(  # noqa: PLR0913 - hot path: called per attention call (reduce and settle); a per-call argument object would allocate
    state: ReduceState, n: torch.Tensor, plan: Any, h: int, w: int, ratio: float, step: int
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
    """(src indices, dst indices, merge count r, protected [B, N] bool or None) of a tome call, all on n's device.

    The src/dst partition is re-drawn every step (seeded by it); r is capped on the host so that a protected plan
    token is never merged (no device sync)."""
    schedule, batch, dev = state.schedule, n.shape[0], n.device
    sx, sy = schedule.sx, schedule.sy
    seed = (schedule.seed * 1_000_003 + max(step, 0)) & 0x7FFF_FFFF
    key: PartitionKey = (h, w, sx, sy, seed, dev)
    src_cpu, dst_cpu, src_dev, dst_dev = state.partitions.get_or(key, lambda: _partition(key))
    prot_cpu = prot_dev = None
    if plan is not None:
        prot_cpu = state.roi(plan, h, w, batch)[1]
        prot_dev = state.on_device(plan, ("prot", h, w, batch), lambda: state.roi(plan, h, w, batch)[1], dev)
    r = min(int(n.shape[1] * min(ratio, TOME_MAX_RATIO)), max_merge_count(prot_cpu, src_cpu, dst_cpu))
    return src_dev, dst_dev, r, prot_dev


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
    """Merge the most similar src tokens into dst tokens (protected plan tokens never merge); q, k and v shrink."""
    merge, unmerge = bipartite_soft_matching_2d(n, *tome_parts(state, n, options.get(PLAN_KEY), h, w, ratio, step))
    if merge is do_nothing:
        return n, ctx, val
    merged = merge(n)
    new_ctx, new_val = kv_targets(n, ctx, val, merge, merged)
    options[UNMERGE_KEY] = (unmerge, merged.shape[1])
    return merged, new_ctx, new_val


def settle(state: ReduceState, call: Call, n: torch.Tensor, plan: Any, ratio: float, step: int) -> Call:  # noqa: PLR0913 - hot path: Settle, called from the attention patch per settled call; a per-call argument object would allocate
    """The call with this step's partition and r (held for a compiled step window)."""
    return call._replace(ratio=ratio, parts=Tome(*tome_parts(state, n, plan, call.h, call.w, ratio, step)))


def action(call: Call, schedule: Schedule) -> TraceAction:
    """The settled Tome, None when it merges nothing, EAGER while unsettled."""
    if call.parts is None:
        return EAGER
    tome: Tome = call.parts
    return tome if 0 < tome.r and tome.dst.numel() > 0 else None


def traced(action: Tome, n: torch.Tensor, ctx: Any, val: Any, options: dict[str, Any]) -> tuple[torch.Tensor, Any, Any]:
    """The merge in the graph; the unmerge goes to the traced output patch in options[TRACED_UNMERGE_KEY]."""
    merge, unmerge = bipartite_soft_matching_2d(n, action.src, action.dst, action.r, action.protected)
    merged = merge(n)
    options[TRACED_UNMERGE_KEY] = (unmerge, merged.shape[1])
    return (merged, *kv_targets(n, ctx, val, merge, merged))
