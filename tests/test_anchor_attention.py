"""Cross-frame anchor attention (scheduling/anchor_attention.py) at the attention level, without ComfyUI.

`attention` below is what ComfyUI's BasicTransformerBlock does with attn1_patch's output: q from n, k from ctx,
v from val (separate projections), multi-head softmax attention. The real U-Net path is in
tests/integration/test_video_anchor_comfy.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from tokenfuse.scheduling.anchor_attention import AnchorStore, build_anchor_patch, grid_of, pool_for, pool_tokens

C, HEADS = 32, 4
GRID = (6, 10)  # level-8 grid of a 48x80 px crop: non-square, so a transposed reshape would show
N = GRID[0] * GRID[1]


def _weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(C, C, generator=g) / math.sqrt(C) for _ in range(3))  # type: ignore[return-value]


W = _weights()


def attention(n: torch.Tensor, ctx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """[B, N, C] queries over [B, M, C] keys/values, HEADS heads (ComfyUI's attn1 after the patch)."""
    q, k, v = n @ W[0], ctx @ W[1], val @ W[2]
    b = n.shape[0]

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, t.shape[1], HEADS, C // HEADS).transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
    return out.transpose(1, 2).reshape(b, -1, C)


def options(rows: list[int], sigma: float, block: tuple[str, int] = ("input", 1)) -> dict:
    return {
        "cond_or_uncond": rows,
        "sigmas": torch.tensor([sigma]),
        "block": block,
        "block_index": 0,
        "original_shape": [len(rows) * 2, 4, *GRID],
    }


def tokens(batch: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, N, C, generator=torch.Generator().manual_seed(seed))


def run(patch, n: torch.Tensor, opts: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n2, ctx, val = patch(n, n, n, opts)
    return attention(n2, ctx, val), ctx, val


def test_inactive_store_passes_the_same_objects_through() -> None:
    store = AnchorStore()
    patch = build_anchor_patch(store)
    n = tokens(2, 0)
    out = patch(n, n, n, options([0], 1.0))
    assert all(o is n for o in out)
    store.begin([None, None])  # items without a track: nothing to join
    assert all(o is n for o in patch(n, n, n, options([0], 1.0)))


def test_full_anchor_refines_exactly_as_without_the_feature() -> None:
    """pool 1: the anchor sees its own tokens twice, which leaves softmax attention unchanged."""
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    n = tokens(2, 1)
    batch = store.begin(["a", "b"])
    assert batch.capture == (True, True)
    out, ctx, val = run(patch, n, options([0], 3.0))
    assert ctx.shape == (2, 2 * N, C) and val is ctx
    torch.testing.assert_close(out, attention(n, n, n), rtol=1e-5, atol=1e-5)
    store.end(True)
    assert store.has("a") and store.has("b") and store.anchors == 2


def test_a_later_key_frame_attends_to_the_stored_anchor_tokens() -> None:
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    anchor = tokens(1, 2)
    store.begin(["a"])
    patch(anchor, anchor, anchor, options([0], 5.0))
    store.end(True)
    later = tokens(1, 3)
    store.begin(["a"])
    out, ctx, _ = run(patch, later, options([0], 5.0))
    store.end(True)
    expected_kv = torch.cat([later, anchor], dim=1)
    torch.testing.assert_close(ctx, expected_kv)
    torch.testing.assert_close(out, attention(later, expected_kv, expected_kv))
    assert (out - attention(later, later, later)).abs().max() > 1e-3, "the anchor's tokens change the result"


def test_key_frames_in_the_anchors_own_batch_use_its_tokens_of_the_same_call() -> None:
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    n = tokens(3, 4)  # items: anchor of a, another frame of a, anchor of b
    batch = store.begin(["a", "a", "b"])
    assert batch.capture == (True, False, True)
    _, ctx, _ = run(patch, n, options([0], 2.0))
    torch.testing.assert_close(ctx[1], torch.cat([n[1], n[0]]))
    torch.testing.assert_close(ctx[2], torch.cat([n[2], n[2]]))


def test_tokens_are_keyed_by_site_step_and_cond_row() -> None:
    """cond and uncond rows of a cfg batch (in either order) and each step and site keep their own anchor tokens."""
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    first = tokens(2, 5)  # rows: uncond (1) then cond (0), one item each
    store.begin(["a"])
    patch(first, first, first, options([1, 0], 7.0))
    patch(first[:, :-4], first[:, :-4], first[:, :-4], options([1, 0], 7.0, ("output", 3)))  # another site
    store.end(True)
    later = tokens(2, 6)
    store.begin(["a"])
    _, ctx, _ = run(patch, later, options([0, 1], 7.0))  # cond first this time
    torch.testing.assert_close(ctx[0, N:], first[1])  # cond row gets the anchor's cond tokens
    torch.testing.assert_close(ctx[1, N:], first[0])
    assert store.active is not None and store.active.missing == 0
    _, ctx, _ = run(patch, later, options([0, 1], 6.0))  # a step the anchor never had: own tokens, counted
    torch.testing.assert_close(ctx[:, N:], later)
    assert store.active.missing == 2


def test_pooled_anchor_is_the_2x2_mean_of_its_token_grid() -> None:
    grid = (5, 7)  # odd sides: the last row / column pool over what is there
    x = torch.randn(2, grid[0] * grid[1], 3)
    out = pool_tokens(x, grid, 2)
    assert out.shape == (2, 3 * 4, 3)
    img = x.reshape(2, *grid, 3)
    torch.testing.assert_close(out[:, 0], img[:, 0:2, 0:2].mean((1, 2)))
    torch.testing.assert_close(out[:, 3], img[:, 0:2, 6:7].mean((1, 2)))  # last column: 2 tokens, not 4
    torch.testing.assert_close(out[:, -1], img[:, 4:5, 6:7].mean((1, 2)))
    assert pool_tokens(x, None, 2) is x and pool_tokens(x, grid, 1) is x
    assert grid_of(35, [1, 4, 10, 14]) == (5, 7) and grid_of(36, [1, 4, 10, 14]) is None
    assert [pool_for(m) for m in ("off", "full", "pooled")] == [0, 1, 2]


def test_pooled_mode_joins_a_quarter_of_the_tokens_to_every_item() -> None:
    store = AnchorStore(pool=2)
    patch = build_anchor_patch(store)
    n = tokens(2, 7)
    store.begin(["a", "a"])
    _, ctx, _ = run(patch, n, options([0], 1.0))
    store.end(True)
    m = 3 * 5
    assert ctx.shape == (2, N + m, C)
    pooled = pool_tokens(n[:1], GRID, 2)[0]
    torch.testing.assert_close(ctx[0, N:], pooled)
    torch.testing.assert_close(ctx[1, N:], pooled)
    assert store.nbytes == m * C * 4


def test_reduced_kv_from_the_scheduler_grows_by_the_anchor_tokens() -> None:
    """TokenFuse's scheduler (todo) may hand a shorter ctx/val (one object for both): both grow by the same M."""
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    n = tokens(1, 8)
    kv = n[:, ::4].clone()
    store.begin(["a"])
    _, ctx, val = patch(n, kv, kv, options([0], 1.0))
    assert ctx.shape == (1, N // 4 + N, C) and val is ctx
    other = kv + 1
    _, ctx, val = patch(n, kv, other, options([0], 1.0))
    assert val is not ctx and val.shape == ctx.shape
    torch.testing.assert_close(val[:, N // 4 :], n)


def test_failed_or_non_finite_calls_keep_no_anchor() -> None:
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    n = tokens(1, 9)
    store.begin(["a"])
    patch(n, n, n, options([0], 1.0))
    store.end(False)  # an OOM in the sampler: the retry recaptures
    assert not store.has("a") and store.active is None
    bad = n.clone()
    bad[0, 0, 0] = float("nan")
    store.begin(["a"])
    patch(bad, bad, bad, options([0], 1.0))
    store.end(True)
    assert not store.has("a")
    assert store.begin(["a"]).capture == (True,)


def test_layout_mismatch_passes_through() -> None:
    store = AnchorStore(pool=1)
    patch = build_anchor_patch(store)
    n = tokens(3, 10)
    store.begin(["a", "b"])  # 3 rows cannot be 1 x 2 items
    assert all(o is n for o in patch(n, n, n, options([0], 1.0)))


def test_at_most_max_tracks_anchors_are_kept_least_recently_used_first() -> None:
    store = AnchorStore(pool=1, max_tracks=2)
    patch = build_anchor_patch(store)
    for t, seed in (("a", 11), ("b", 12)):
        n = tokens(1, seed)
        store.begin([t])
        patch(n, n, n, options([0], 1.0))
        store.end(True)
    store.begin(["a"])  # touches a: b is now the oldest
    store.end(True)
    n = tokens(1, 13)
    store.begin(["c"])
    patch(n, n, n, options([0], 1.0))
    store.end(True)
    assert store.has("a") and store.has("c") and not store.has("b")
    assert store.nbytes == 2 * N * C * 4 and store.peak_bytes == store.nbytes


def test_invalid_pool() -> None:
    with pytest.raises(ValueError, match="pool"):
        AnchorStore(pool=0)
