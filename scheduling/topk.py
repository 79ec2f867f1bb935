"""Top-K keys/values: keep the K most important K/V tokens (ROI weight + a cheap per-token saliency).

Queries keep every token, so no unmerge is needed. Cost is one channel-slice read and a top-k (O(N log K)); no score
matrix is formed. Saliency is a token's distance from the mean token: tokens like the average carry little that the
softmax over the rest does not already give. Advice: drop <= 0.5 of K/V.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .vocabulary import do_nothing as do_nothing  # re-exported: callers test `fn is do_nothing`

KVFn = Callable[[torch.Tensor], torch.Tensor]
SALIENCY_DIM = 64


def saliency(x: torch.Tensor, token_dim: int = 1) -> torch.Tensor:
    """Per-token saliency in [0, 1]: squared distance from the mean token over a channel slice.

    x: [B, N, C] (token_dim=1) or [B, H, N, D] (token_dim=2, first head used). Returns float32 [B, N].
    """
    with torch.no_grad():
        t = x[:, 0] if x.ndim == 4 else x  # [B, H, N, D]: the first head is a cheap, representative slice
        t = t[..., :SALIENCY_DIM].float()
        d = (t - t.mean(dim=1, keepdim=True)).pow(2).sum(-1)
        return d / d.amax(dim=1, keepdim=True).clamp_min(1e-12)


def topk_indices(
    x: torch.Tensor, keep: int, importance: torch.Tensor | None = None, token_dim: int = 1
) -> torch.Tensor:
    """Indices [B, keep] of the K/V tokens to keep, in ascending token order.

    importance: float [B, N] on x's device (ROI weight in [0, 1], protected tokens >= threshold get +2 and so are
    always kept while keep >= their count; the caller guarantees it) or None.
    """
    score = saliency(x, token_dim)
    if importance is not None:
        score = score + importance.to(score.dtype)
    idx = score.topk(keep, dim=1, sorted=False).indices
    return idx.sort(dim=1).values


def gather_tokens(x: torch.Tensor, idx: torch.Tensor, token_dim: int = 1) -> torch.Tensor:
    """x [B, N, C] or [B, H, N, D] -> the same with N replaced by idx's [B, K] tokens."""
    if x.ndim == 3:
        return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    hh, dd = x.shape[1], x.shape[3]
    return x.gather(2, idx[:, None, :, None].expand(-1, hh, -1, dd))


def keep_count(n: int, ratio: float, min_keep: int = 0) -> int:
    """Tokens kept when dropping ~ratio of n, never fewer than min_keep (e.g. the protected count) and never 0."""
    return min(n, max(1, min_keep, math.ceil(n * (1.0 - ratio))))


def topk_kv_functions(x: torch.Tensor, ratio: float, importance: torch.Tensor | None = None, min_keep: int = 0) -> KVFn:
    """A closure that keeps the top (1 - ratio) of x's tokens [B, N, C]; identity when nothing would be dropped.

    Indices are chosen from x (the block input), then applied to any tensor with the same token layout (k and v).
    importance: ROI bonus [B, N] on x's device: pass 2.0 for protected tokens and set min_keep to their max count.
    """
    n = x.shape[1]
    keep = keep_count(n, ratio, min_keep)
    if keep >= n:
        return do_nothing
    idx = topk_indices(x, keep, importance)
    return lambda t: gather_tokens(t, idx)
