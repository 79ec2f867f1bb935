"""ToDo K/V pooling: kernels, odd grids, ROI cells kept at full resolution, identity fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tokenfuse.scheduling.downsample import (
    do_nothing,
    kernel_for_ratio,
    kv_downsample_functions,
    pool_tokens,
    protected_cell_tokens,
)


@pytest.mark.parametrize(
    "ratio,kernel",
    [
        (0.0, (1, 1)),
        (0.3, (1, 1)),
        (0.5, (1, 2)),
        (0.74, (1, 2)),
        (0.75, (2, 2)),
        (0.8, (2, 2)),
        (0.89, (3, 3)),
        (0.9, (3, 3)),
    ],
)
def test_kernel_for_ratio(ratio: float, kernel: tuple[int, int]) -> None:
    assert kernel_for_ratio(ratio) == kernel


def test_ratio_zero_or_tiny_grid_is_identity() -> None:
    assert kv_downsample_functions(4, 4, 0.0) is do_nothing
    assert kv_downsample_functions(1, 16, 0.75) is do_nothing


@pytest.mark.parametrize("h,w", [(8, 6), (7, 5), (9, 12)])
def test_average_pool_matches_avg_pool2d_including_odd_edges(h: int, w: int) -> None:
    x = torch.randn(2, h * w, 16, generator=torch.Generator().manual_seed(0))
    out = pool_tokens(x, h, w, (2, 2))
    grid = x.transpose(1, 2).reshape(2, 16, h, w)
    ref = F.avg_pool2d(grid, 2, 2, ceil_mode=True).flatten(2).transpose(1, 2)
    assert out.shape == (2, ((h + 1) // 2) * ((w + 1) // 2), 16)
    torch.testing.assert_close(out, ref)
    ones = pool_tokens(torch.ones(1, h * w, 4), h, w, (2, 2))
    torch.testing.assert_close(ones, torch.ones_like(ones))  # edge cells average only their real tokens


def test_nearest_takes_cell_corners() -> None:
    h, w = 5, 4
    x = torch.arange(h * w, dtype=torch.float32).view(1, h * w, 1)
    out = pool_tokens(x, h, w, (2, 2), mode="nearest").flatten()
    assert out.tolist() == [0.0, 2.0, 8.0, 10.0, 16.0, 18.0]


def test_protected_cells_keep_full_resolution_tokens() -> None:
    h, w = 8, 8
    x = torch.randn(2, h * w, 4, generator=torch.Generator().manual_seed(1))
    protected = torch.zeros(2, h * w, dtype=torch.bool)
    protected[0, 2 * w + 3] = True  # one token (row 2, col 3) in cell (1, 1)
    free, full = protected_cell_tokens(protected, h, w, (2, 2))
    assert sorted(full.tolist()) == [2 * w + 2, 2 * w + 3, 3 * w + 2, 3 * w + 3]
    assert free.numel() == 15
    kv = kv_downsample_functions(h, w, 0.75, keep=(free, full))(x)
    assert kv.shape == (2, 15 + 4, 4)
    assert torch.equal(kv[:, 15:], x[:, full])
    all_prot = torch.ones(1, h * w, dtype=torch.bool)
    assert kv_downsample_functions(h, w, 0.75, keep=protected_cell_tokens(all_prot, h, w, (2, 2))) is do_nothing
