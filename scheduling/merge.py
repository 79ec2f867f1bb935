"""ToMe for diffusion: bipartite soft matching on a 2D strided partition -> (merge, unmerge) closures.

Shapes: x [B, N, C] tokens in row-major order of an h x w grid (N = h * w).
The partition (one destination per sy x sx cell, chosen by a seeded CPU generator) is shared by the whole batch, so
cond and uncond halves use one partition, and the sampler's global RNG is never touched. Matching is computed once
under no_grad on a reduced channel slice, chunked over source rows so only src x dst (never N x N) scores exist.
Ratio advice: <= 0.5 per level keeps quality (ToMe-SD); 0.75 is the hard maximum with a 2x2 stride.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .transfer import to_device
from .vocabulary import do_nothing as do_nothing  # re-exported: callers test `fn is do_nothing`

MergeFn = Callable[[torch.Tensor], torch.Tensor]
METRIC_DIM = 64  # channels used for similarity: cheap and enough to rank neighbours
CHUNK_ELEMS = 1 << 24  # max src x dst scores alive at once per batch


@functools.lru_cache(maxsize=64)
def _cell_layout(h: int, w: int, sx: int, sy: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a grid's partitions share (CPU int64, read only): each full cell's first token [Nd], the token offsets
    within a cell [sy*sx], per choice of dst the offsets of the other tokens [sy*sx, sy*sx - 1], and the tokens
    outside every full cell (odd grids) [M]."""
    hsy, wsx = h // sy, w // sx
    base = ((torch.arange(hsy) * sy * w).unsqueeze(1) + torch.arange(wsx) * sx).flatten()
    offsets = (torch.arange(sy).unsqueeze(1) * w + torch.arange(sx)).flatten()
    others = torch.stack([torch.cat([offsets[:i], offsets[i + 1 :]]) for i in range(sy * sx)])
    full = torch.zeros(h, w, dtype=torch.bool)
    full[: hsy * sy, : wsx * sx] = True
    return base, offsets, others, full.flatten().logical_not().nonzero().flatten()


def random_partition(h: int, w: int, sx: int, sy: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split an h x w grid into (src_idx [Ns], dst_idx [Nd]) CPU int64 token indices, one random dst per full cell.

    Tokens outside the last full cell row/column (odd grids) are always src. Same seed -> same partition. Indices
    come cell by cell (not sorted: the matching does not need it); drawn by arithmetic on the grid's cached layout,
    since ToMe re-draws a partition every step and grid (half the host time of a mask and two `nonzero`s).
    """
    base, offsets, others, rest = _cell_layout(h, w, sx, sy)
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    pick = torch.randint(sy * sx, (base.numel(),), generator=gen)
    src = (base.unsqueeze(1) + others[pick]).flatten()
    return (torch.cat([src, rest]) if rest.numel() else src), base + offsets[pick]


def max_merge_count(protected: torch.Tensor | None, src_idx: torch.Tensor, dst_idx: torch.Tensor) -> int:
    """Largest r that never merges a protected token: min over the batch of unprotected src (0 if no free dst).

    protected: CPU bool [B, N] or None. Computed on the host so the device never has to sync.
    """
    if protected is None:
        return int(src_idx.numel())
    free_src = (~protected[:, src_idx]).sum(1)
    free_dst = (~protected[:, dst_idx]).sum(1)
    return int(torch.where(free_dst > 0, free_src, torch.zeros_like(free_src)).min())


def _reduce_metric(x: torch.Tensor) -> torch.Tensor:
    """[B, N, C] -> [B, N, <=METRIC_DIM] by averaging channel groups (keeps every channel's signal, costs one read)."""
    c = x.shape[-1]
    if c <= METRIC_DIM:
        return x
    if c % METRIC_DIM == 0:
        return x.reshape(*x.shape[:-1], METRIC_DIM, c // METRIC_DIM).mean(-1)
    return x[..., :METRIC_DIM]


def bipartite_soft_matching_2d(
    metric: torch.Tensor,
    src_idx: torch.Tensor,
    dst_idx: torch.Tensor,
    r: int,
    protected: torch.Tensor | None = None,
) -> tuple[MergeFn, MergeFn]:
    """Merge the r src tokens most similar to a dst token into it (mean); return (merge, unmerge).

    metric: [B, N, C] tokens to match on (the block input). src_idx/dst_idx: from `random_partition`, on metric's
    device. protected: bool [B, N] on metric's device; protected tokens are neither merged away nor merged into.
    The caller caps r with `max_merge_count` so a protected token is never picked. merge: [B, N, C'] ->
    [B, N - r, C']; unmerge: [B, N - r, C'] -> [B, N, C'] (merged tokens copy their destination's value).
    """
    b, n, _ = metric.shape
    ns, nd = src_idx.numel(), dst_idx.numel()
    r = min(int(r), ns)
    if r <= 0 or nd == 0:
        return do_nothing, do_nothing
    with torch.no_grad():
        m = F.normalize(_reduce_metric(metric), dim=-1, eps=1e-6)
        a = m.index_select(1, src_idx)
        bd = m.index_select(1, dst_idx).transpose(1, 2)
        dst_block = protected[:, dst_idx].unsqueeze(1) if protected is not None else None
        rows = max(1, CHUNK_ELEMS // max(1, nd))
        best = []
        for s in range(0, ns, rows):  # chunks of src rows, not tokens: one iteration at U-Net sizes
            scores = a[:, s : s + rows] @ bd
            if dst_block is not None:
                scores = scores.masked_fill(dst_block, float("-inf"))
            best.append(scores.max(dim=-1))
        node_max = best[0].values if len(best) == 1 else torch.cat([c.values for c in best], 1)
        node_idx = best[0].indices if len(best) == 1 else torch.cat([c.indices for c in best], 1)
        if protected is not None:
            node_max = node_max.masked_fill(protected[:, src_idx], float("-inf"))
        order = node_max.argsort(dim=-1, descending=True)  # merged src first (most similar), then kept src
        src_tok = src_idx[order]  # [B, ns] token index of each src in that order
        mrg_dst = node_idx.gather(1, order[:, :r])  # [B, r] position in dst of each merged src's target
        # unmerge layout: [merged src (copies of their dst), kept src, dst] -> tokens
        out_tok = torch.cat([src_tok, dst_idx.expand(b, nd)], dim=1)

    n_unm = ns - r

    def merge(x: torch.Tensor) -> torch.Tensor:
        c = x.shape[-1]
        src = x.gather(1, src_tok.unsqueeze(-1).expand(b, ns, c))
        dst = x.index_select(1, dst_idx)
        dst = dst.scatter_reduce(1, mrg_dst.unsqueeze(-1).expand(b, r, c), src[:, :r], reduce="mean", include_self=True)
        return torch.cat([src[:, r:], dst], dim=1)

    def unmerge(y: torch.Tensor) -> torch.Tensor:
        c = y.shape[-1]
        dst = y[:, n_unm:]
        full = torch.cat([dst.gather(1, mrg_dst.unsqueeze(-1).expand(b, r, c)), y], dim=1)
        return torch.empty(b, n, c, device=y.device, dtype=y.dtype).scatter_(
            1, out_tok.unsqueeze(-1).expand(b, n, c), full
        )

    return merge, unmerge


@dataclass(frozen=True)
class TomeDraw:
    """How `tome_functions` draws its merge: the seed of the src/dst partition and the tokens that never merge
    (protected: CPU bool [B, N], from the ROI plan, or None)."""

    seed: int = 0
    protected: torch.Tensor | None = None


def tome_functions(
    x: torch.Tensor, h: int, w: int, ratio: float, draw: TomeDraw | None = None
) -> tuple[MergeFn, MergeFn]:
    """(merge, unmerge) for x [B, h*w, C] removing ~ratio*N tokens over 2x2 cells; identity when nothing can be
    merged. draw: the partition's seed and the protected tokens (None: seed 0, none protected). A grid of width or
    height 1 gives identity.
    """
    sx = sy = 2
    seed, protected = (draw.seed, draw.protected) if draw is not None else (0, None)
    n = x.shape[1]
    if ratio <= 0.0 or n != h * w or h < sy or w < sx:
        return do_nothing, do_nothing
    src_cpu, dst_cpu = random_partition(h, w, sx, sy, seed)
    r = min(int(n * ratio), max_merge_count(protected, src_cpu, dst_cpu))
    if r <= 0:
        return do_nothing, do_nothing
    dev = x.device
    prot = to_device(protected, dev) if protected is not None else None
    return bipartite_soft_matching_2d(x, to_device(src_cpu, dev), to_device(dst_cpu, dev), r, prot)
