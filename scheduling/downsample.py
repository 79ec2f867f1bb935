"""ToDo: K/V-only spatial downsampling of a token grid. Queries keep every token, so no unmerge is needed.

Shapes: x [B, N, C] tokens of an h x w grid in row-major order (N = h * w) -> [B, N', C] keys/values.
Advice: a 2x2 kernel (ratio 0.75) is the validated setting (ToDo, Smith et al. 2024); 3x3 is aggressive.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .vocabulary import do_nothing as do_nothing  # re-exported: callers test `fn is do_nothing`

KVFn = Callable[[torch.Tensor], torch.Tensor]
# (ky, kx) kernels by the fraction of tokens they remove; ratios snap down to the strongest kernel not above them.
KERNELS: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 2), (2, 3), (3, 3))


def kernel_for_ratio(ratio: float) -> tuple[int, int]:
    """Strongest pooling kernel whose reduction 1 - 1/(ky*kx) does not exceed ratio (0.5 -> 1x2, 0.75 -> 2x2)."""
    best = (1, 1)
    for ky, kx in KERNELS:
        if 1.0 - 1.0 / (ky * kx) <= ratio + 1e-3:
            best = (ky, kx)
    return best


def pool_tokens(x: torch.Tensor, h: int, w: int, kernel: tuple[int, int], mode: str = "avg") -> torch.Tensor:
    """[B, h*w, C] -> [B, ceil(h/ky)*ceil(w/kx), C]; edge cells of odd grids average only their real tokens."""
    ky, kx = kernel
    b, n, c = x.shape
    if mode == "nearest":
        return x.view(b, h, w, c)[:, ::ky, ::kx].reshape(b, -1, c)
    if h % ky == 0 and w % kx == 0:  # the common case: a view and one reduction, no permute copies
        return x.view(b, h // ky, ky, w // kx, kx, c).mean(dim=(2, 4)).reshape(b, -1, c)
    grid = x.transpose(1, 2).reshape(b, c, h, w)
    pooled = F.avg_pool2d(grid, kernel, stride=kernel, ceil_mode=True)
    return pooled.flatten(2).transpose(1, 2)


def protected_cell_tokens(
    protected: torch.Tensor, h: int, w: int, kernel: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which pooled cells to keep at full resolution, from a CPU bool [B, h*w] ROI mask (union over the batch).

    Returns (free_cells [M] indices of pooled cells that stay pooled, full_tokens [K] token indices inside protected
    cells), CPU int64. One set for the whole batch keeps K/V lengths equal across images (cond/uncond share it).
    """
    ky, kx = kernel
    hc, wc = math.ceil(h / ky), math.ceil(w / kx)
    any_prot = protected.any(0).view(h, w)
    pad = torch.zeros(hc * ky, wc * kx, dtype=torch.bool)
    pad[:h, :w] = any_prot
    cell_prot = pad.view(hc, ky, wc, kx).any(dim=3).any(dim=1)  # [hc, wc]
    tok_cell = cell_prot.repeat_interleave(ky, 0).repeat_interleave(kx, 1)[:h, :w]
    return (~cell_prot).flatten().nonzero().flatten(), tok_cell.flatten().nonzero().flatten()


def kv_downsample_functions(
    h: int,
    w: int,
    ratio: float,
    mode: str = "avg",
    keep: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> KVFn:
    """A closure reducing K/V tokens [B, h*w, C] by ~ratio; identity when the kernel is 1x1 or the grid too small.

    keep: (free_cells, full_tokens) from `protected_cell_tokens`, on the tokens' device: protected cells keep their
    full-resolution tokens and only the background is pooled. Pooled background tokens then carry less softmax mass
    than the tokens they stand for, which shifts attention slightly toward the face; acceptable for face refinement.
    """
    kernel = kernel_for_ratio(ratio)
    if kernel == (1, 1) or h < kernel[0] or w < kernel[1]:
        return do_nothing
    if keep is None:
        return lambda x: pool_tokens(x, h, w, kernel, mode)
    free_cells, full_tokens = keep
    if full_tokens.numel() == 0:
        return lambda x: pool_tokens(x, h, w, kernel, mode)
    if free_cells.numel() == 0:  # the ROI covers every cell: nothing to pool
        return do_nothing

    return lambda x: pool_keeping(x, h, w, kernel, mode, free_cells, full_tokens)


def pool_keeping(  # noqa: PLR0913 - hot path: the K/V pooling of every attention call (eager closure and traced); a per-call argument object would allocate
    x: torch.Tensor,
    h: int,
    w: int,
    kernel: tuple[int, int],
    mode: str,
    free_cells: torch.Tensor,
    full_tokens: torch.Tensor,
) -> torch.Tensor:
    """[B, h*w, C] -> [B, M + K, C]: the M pooled cells outside the ROI, then the K full-resolution ROI tokens
    (free_cells / full_tokens from `protected_cell_tokens`, on x's device)."""
    pooled = pool_tokens(x, h, w, kernel, mode).index_select(1, free_cells)
    return torch.cat([pooled, x.index_select(1, full_tokens)], dim=1)
