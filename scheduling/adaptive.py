"""Content-adaptive ratio: flat token maps merge more, busy ones less. One cheap statistic per level and step."""

from __future__ import annotations

import torch

COMPLEXITY_DIM = 64


def token_complexity(x: torch.Tensor, h: int, w: int) -> float:
    """Neighbour-difference energy of a token grid relative to its variance, in [0, 1].

    x: [B, h*w, C]. 0 = flat (neighbours equal), ~1 = no spatial structure (white noise). Reads a channel slice
    only; returns a host float, i.e. one device sync (the caller caches it per level and step).
    """
    if h < 2 or w < 2:
        return 0.5
    with torch.no_grad():
        t = x[..., :COMPLEXITY_DIM].float().reshape(x.shape[0], h, w, -1)
        diff = (t[:, :, 1:] - t[:, :, :-1]).pow(2).mean() + (t[:, 1:] - t[:, :-1]).pow(2).mean()
        var = t.var(dim=(1, 2)).mean().clamp_min(1e-12)
        return float((diff / (4.0 * var)).clamp(0.0, 1.0))


def adapt_ratio(ratio: float, complexity: float, strength: float, cap: float) -> float:
    """Scale ratio by 1 + strength * (1 - 2 * complexity): up to (1 + strength) when flat, (1 - strength) when busy."""
    if ratio <= 0.0 or strength <= 0.0:
        return ratio
    return max(0.0, min(cap, ratio * (1.0 + strength * (1.0 - 2.0 * complexity))))
