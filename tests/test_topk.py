"""Top-K K/V: counts, ROI tokens always kept, token order preserved, both tensor layouts."""

from __future__ import annotations

import torch
from tokenfuse.scheduling.topk import do_nothing, gather_tokens, keep_count, saliency, topk_indices, topk_kv_functions


def test_keep_count_bounds() -> None:
    assert keep_count(100, 0.5) == 50
    assert keep_count(100, 0.0) == 100
    assert keep_count(100, 0.9, min_keep=30) == 30
    assert keep_count(3, 0.99) == 1


def test_ratio_zero_is_identity() -> None:
    x = torch.randn(2, 64, 8)
    assert topk_kv_functions(x, 0.0) is do_nothing


def test_salient_and_protected_tokens_are_kept_in_order() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 100, 16, generator=gen) * 0.01
    x[:, 17] += 5.0  # an outlier token is salient
    importance = torch.full((2, 100), 0.1)
    importance[:, 60:70] = 1.0 + 2.0  # ROI weight plus the protection bonus
    idx = topk_indices(x, 20, importance)
    assert idx.shape == (2, 20)
    for row in idx.tolist():
        assert row == sorted(row)
        assert 17 in row and set(range(60, 70)) <= set(row)
    kv = topk_kv_functions(x, 0.8, importance, min_keep=10)(x)
    assert kv.shape == (2, 20, 16)
    assert torch.equal(kv, gather_tokens(x, idx))


def test_heads_layout_gathers_same_tokens_in_every_head() -> None:
    k = torch.randn(2, 4, 50, 8, generator=torch.Generator().manual_seed(1))
    idx = topk_indices(k, 10, token_dim=2)
    out = gather_tokens(k, idx, token_dim=2)
    assert out.shape == (2, 4, 10, 8)
    assert torch.equal(out[1, 3], k[1, 3, idx[1]])
    s = saliency(k, token_dim=2)
    assert s.shape == (2, 50) and float(s.max()) == 1.0
