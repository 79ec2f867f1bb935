"""ToMe bipartite matching: identity fallbacks, shapes on odd grids, ROI protection, seeded partitions."""

from __future__ import annotations

import pytest
import torch
from tokenfuse.devkit.partition_ref import mask_partition
from tokenfuse.scheduling import merge as merge_mod
from tokenfuse.scheduling.merge import (
    TomeDraw,
    bipartite_soft_matching_2d,
    do_nothing,
    max_merge_count,
    random_partition,
    tome_functions,
)


def _grid_tokens(b: int, h: int, w: int, c: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, h * w, c, generator=gen)


def test_ratio_zero_and_degenerate_grids_are_identity() -> None:
    x = _grid_tokens(2, 8, 8, 16)
    for h, w, ratio in ((8, 8, 0.0), (1, 64, 0.5), (64, 1, 0.5)):
        m, u = tome_functions(x, h, w, ratio)
        assert m is do_nothing and u is do_nothing
        assert m(x) is x


@pytest.mark.parametrize("h,w", [(8, 8), (7, 5), (9, 12), (3, 11), (13, 13)])
def test_merge_unmerge_shapes_on_odd_and_non_square_grids(h: int, w: int) -> None:
    x = _grid_tokens(2, h, w, 24)
    m, u = tome_functions(x, h, w, 0.5, TomeDraw(seed=3))
    y = m(x)
    r = h * w - y.shape[1]
    assert r == min(int(h * w * 0.5), len(random_partition(h, w, 2, 2, 3)[0]))
    assert y.shape == (2, h * w - r, 24)
    assert u(y).shape == x.shape


def test_unmerge_restores_unmerged_tokens_exactly_and_merged_ones_to_their_group_mean() -> None:
    h, w = 10, 6
    x = _grid_tokens(2, h, w, 8, seed=1)
    src, dst = random_partition(h, w, 2, 2, seed=5)
    merge, unmerge = bipartite_soft_matching_2d(x, src, dst, r=20)
    z = unmerge(merge(x))
    changed = (z != x).any(-1)  # [B, N]
    # merged src tokens and their destinations change; every other token is bit-identical
    assert int(changed.sum(1).max()) <= 20 + dst.numel()
    assert int((~changed).sum(1).min()) >= h * w - 20 - dst.numel()
    # tokens that all look alike merge back to themselves
    flat = torch.ones(2, h * w, 8)
    m2, u2 = bipartite_soft_matching_2d(flat, src, dst, r=20)
    assert torch.equal(u2(m2(flat)), flat)


def test_protected_tokens_are_never_merged() -> None:
    h, w = 12, 12
    x = _grid_tokens(2, h, w, 16, seed=2)
    protected = torch.zeros(2, h * w, dtype=torch.bool)
    face = torch.zeros(h, w, dtype=torch.bool)
    face[3:8, 4:9] = True
    protected[:] = face.flatten()
    protected[1, :10] = True  # the two images may differ
    m, u = tome_functions(x, h, w, 0.7, TomeDraw(seed=4, protected=protected))
    y = m(x)
    assert y.shape[1] < h * w
    z = u(y)
    assert torch.equal(z[protected], x[protected])


def test_merge_count_cap_keeps_protection_when_ratio_asks_for_more() -> None:
    h, w = 8, 8
    src, dst = random_partition(h, w, 2, 2, 0)
    protected = torch.ones(1, h * w, dtype=torch.bool)
    assert max_merge_count(protected, src, dst) == 0
    protected[0, src[:5]] = False
    assert max_merge_count(protected, src, dst) == 0  # no free destination: nothing may merge
    protected[0, dst[0]] = False
    assert max_merge_count(protected, src, dst) == 5
    x = _grid_tokens(1, h, w, 4)
    m, u = tome_functions(x, h, w, 0.75, TomeDraw(protected=protected))
    assert m(x).shape[1] == h * w - 5
    assert torch.equal(u(m(x))[protected], x[protected])


def test_seeded_partition_is_deterministic_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a = random_partition(16, 16, 2, 2, seed=7)
    b = random_partition(16, 16, 2, 2, seed=7)
    c = random_partition(16, 16, 2, 2, seed=8)
    x = _grid_tokens(2, 16, 16, 8)
    y1 = tome_functions(x, 16, 16, 0.5, TomeDraw(seed=7))[0](x)
    y2 = tome_functions(x, 16, 16, 0.5, TomeDraw(seed=7))[0](x)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])
    assert torch.equal(y1, y2)
    # one destination per 2x2 cell, every token exactly once
    assert a[1].numel() == 64 and torch.equal(torch.sort(torch.cat(a)).values, torch.arange(256))


def test_cond_and_uncond_share_one_partition() -> None:
    half = _grid_tokens(1, 9, 9, 8, seed=9)
    x = torch.cat([half, half])  # CFG batch: identical halves must merge identically
    m, u = tome_functions(x, 9, 9, 0.5, TomeDraw(seed=1))
    y = m(x)
    assert torch.equal(y[0], y[1])
    assert torch.equal(u(y)[0], u(y)[1])


def test_chunked_scores_match_one_shot(monkeypatch: pytest.MonkeyPatch) -> None:
    h, w = 16, 12
    x = _grid_tokens(2, h, w, 96, seed=3)  # > METRIC_DIM channels: exercises the reduced metric too
    src, dst = random_partition(h, w, 2, 2, 2)
    ref = bipartite_soft_matching_2d(x, src, dst, r=60)[0](x)
    monkeypatch.setattr(merge_mod, "CHUNK_ELEMS", 100)  # several src chunks; never an N x N matrix
    assert torch.equal(bipartite_soft_matching_2d(x, src, dst, r=60)[0](x), ref)


@pytest.mark.parametrize("h,w,sx,sy", [(16, 16, 2, 2), (9, 7, 2, 2), (13, 11, 3, 3), (6, 5, 1, 2), (5, 8, 2, 1)])
def test_partition_has_one_dst_per_full_cell_and_cached_layouts_stay_untouched(
    h: int, w: int, sx: int, sy: int
) -> None:
    """random_partition builds indices arithmetically from a cached per-grid layout: the same index sets as the mask
    way (one dst per full sy x sx cell, tokens outside full cells always src), and writing into a returned partition
    must not change the next one drawn (no view of the cached layout escapes)."""
    for seed in range(4):
        src, dst = random_partition(h, w, sx, sy, seed)
        assert src.dtype == dst.dtype == torch.int64
        assert src.numel() + dst.numel() == h * w
        ref_src, ref_dst = mask_partition(h, w, sx, sy, seed)
        assert torch.equal(src.sort().values, ref_src) and torch.equal(dst.sort().values, ref_dst)
    src, dst = random_partition(h, w, sx, sy, 1)
    again = [t.clone() for t in random_partition(h, w, sx, sy, 1)]
    src.fill_(-1)
    dst.fill_(-1)
    later = random_partition(h, w, sx, sy, 1)
    assert torch.equal(later[0], again[0]) and torch.equal(later[1], again[1])
