"""Cross-frame attention to a track's anchor key frame (video): the anchor's self-attention tokens joined to K/V.

Text2Video-Zero / Rerender-style, training-free: in every U-Net self-attention (attn1) of every sampling step, a face
crop of a video track attends to its own tokens **and** to the tokens of the track's anchor crop (its first
refined key frame) at the same layer and step, so later key frames borrow the anchor's appearance and flicker less.
Only K/V grow; Q keeps N tokens, so no unmerge is needed (DESIGN.md §5: K/V may have more or fewer tokens than Q).

How the anchor's tokens are obtained: the anchor crop is sampled like any other key frame (usually in the first
batch of its track). While it is, `attn1_patch` captures its `n` (norm1 output [N, C], before the K/V projections)
per (site, step, cond/uncond), optionally 2x2 average-pooled on the latent grid, into an `AnchorStore`; the capture
is committed when that sampler call returns with finite tokens (an OOM retry recaptures). Later calls look the
tokens up by the same key. Key frames of the anchor's own batch use the tokens captured in the same call.

    K/V of item i = concat(ctx_i, A_track(i))      A: [M, C], M = N (full) or ~N/4 (pooled)

The anchor itself attends to concat(ctx, A_self); with `pool=1` that is its own tokens twice, which leaves softmax
attention exactly unchanged (every key duplicated: same weights after normalisation), so the anchor refines exactly
as without the feature. With pooling every crop of a track (the anchor included) sees "own tokens + pooled anchor".

Memory: one anchor holds sum over attn1 sites of N_site x C_site values per step and per cond/uncond row. SD1.5 at
512 px: 11.5 M values per step (5 sites of 4096x320, 5 of 1024x640, 5 of 256x1280, 64x1280), so 20 steps with cfg
(2 rows) in fp16 are ~0.92 GB full and ~0.24 GB pooled; the project's face model (32 base channels) ~1/10 of that.
`AnchorStore.nbytes` reports what is held; at most `max_tracks` anchors are kept (least recently used dropped:
a track whose anchor was dropped recaptures at its next key frame). Attention cost: K/V 2x (full) / 1.25x (pooled).

Pure torch, no ComfyUI import: the node layer installs `build_anchor_patch(store)` on its own model clone and sets
`store.active` around each sampler call (`store.begin(tracks)` ... `store.end(ok)`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .anchor_mode import AnchorMode, pool_for

log = logging.getLogger(__name__)

__all__ = ["AnchorMode", "AnchorBatch", "AnchorStore", "build_anchor_patch", "grid_of", "pool_for", "pool_tokens"]

SiteKey = tuple[Any, ...]  # (block, block_index, n_tokens)
TokenKey = tuple[SiteKey, float, int]  # (site, sigma, cond_or_uncond row type)

AttnPatch = Any  # (n, ctx, val, extra_options) -> (n, ctx, val), as scheduling/patches.py


def grid_of(n_tokens: int, original_shape: Any) -> tuple[int, int] | None:
    """(h, w) of a U-Net level's token grid from the latent shape (…, H, W): ceil halving per level; None if none."""
    if original_shape is None or len(original_shape) < 2:
        return None
    h, w = int(original_shape[-2]), int(original_shape[-1])
    for _ in range(4):
        if h * w == n_tokens:
            return h, w
        h, w = (h + 1) // 2, (w + 1) // 2
    return None


def pool_tokens(x: torch.Tensor, grid: tuple[int, int] | None, pool: int) -> torch.Tensor:
    """x [B, N, C] -> [B, M, C]: average-pooled pool x pool on the (h, w) token grid (ceil: edges pooled partially).

    pool 1, an unknown grid or a grid smaller than the pool returns x itself (no copy)."""
    if pool <= 1 or grid is None or min(grid) < pool:
        return x
    h, w = grid
    b, _, c = x.shape
    img = x.transpose(1, 2).reshape(b, c, h, w)
    out = F.avg_pool2d(img, pool, stride=pool, ceil_mode=True, count_include_pad=False)
    return out.flatten(2).transpose(1, 2)


@dataclass
class AnchorBatch:
    """One sampler call: per batch item the track it belongs to (None: no anchor attention for it) and whether it
    is the track's anchor (captures its tokens); `captured` collects the anchors' tokens until `AnchorStore.end`."""

    tracks: tuple[Hashable | None, ...]
    capture: tuple[bool, ...]
    captured: dict[Hashable, dict[TokenKey, torch.Tensor]] = field(default_factory=dict)
    joined: int = 0  # attention calls that joined anchor tokens
    missing: int = 0  # item lookups with no anchor tokens at that key (own pooled tokens used instead)


class AnchorStore:
    """The anchors' captured tokens of one video run, per track (see module docstring); `active` is the sampler call
    in progress (None: the patch passes everything through)."""

    def __init__(self, pool: int = 1, max_tracks: int = 8) -> None:
        if pool < 1:
            raise ValueError(f"pool must be >= 1, got {pool}")
        self.pool = int(pool)
        self.max_tracks = max(1, int(max_tracks))
        self.tokens: OrderedDict[Hashable, dict[TokenKey, torch.Tensor]] = OrderedDict()
        self.active: AnchorBatch | None = None
        self.peak_bytes = 0
        self.calls_joined = 0
        self.anchors = 0  # anchors committed (recaptures after eviction included)

    def has(self, track: Hashable) -> bool:
        return track in self.tokens

    def begin(self, tracks: Sequence[Hashable | None]) -> AnchorBatch:
        """Start a sampler call over items of `tracks`: the first item of a track with no stored anchor captures."""
        capture, seen = [], set()
        for t in tracks:
            first = t is not None and t not in self.tokens and t not in seen
            capture.append(first)
            if t is not None:
                seen.add(t)
                if t in self.tokens:
                    self.tokens.move_to_end(t)
        self.active = AnchorBatch(tuple(tracks), tuple(capture))
        return self.active

    def end(self, ok: bool) -> None:
        """Finish the active call: on success commit the captured anchors whose tokens are all finite."""
        batch, self.active = self.active, None
        if batch is None:
            return
        self.calls_joined += batch.joined
        if not ok:
            return
        for track, toks in batch.captured.items():
            if toks and all(bool(torch.isfinite(t).all()) for t in toks.values()):
                self.tokens[track] = toks
                self.tokens.move_to_end(track)
                self.anchors += 1
            else:
                log.warning("TokenFuse: anchor tokens of track %s are not finite; not kept", track)
        while len(self.tokens) > self.max_tracks:
            self.tokens.popitem(last=False)
        self.peak_bytes = max(self.peak_bytes, self.nbytes)

    def drop(self, track: Hashable) -> None:
        self.tokens.pop(track, None)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for toks in self.tokens.values() for t in toks.values())


def _site(options: dict[str, Any], n_tok: int) -> SiteKey:
    block = options.get("block")
    return (tuple(block) if isinstance(block, (list, tuple)) else block, options.get("block_index"), n_tok)


def _sigma(options: dict[str, Any]) -> float | None:
    sig = options.get("sigmas")
    if sig is None:
        return None
    if isinstance(sig, torch.Tensor):
        return float(sig.reshape(-1)[0])
    return float(sig)


def _anchor_row(store: AnchorStore, batch: AnchorBatch, own: torch.Tensor, row: int, i: int, key: Any) -> torch.Tensor:  # noqa: PLR0913 - hot path: called per batch row of every attention call; a per-call argument object would allocate
    """The anchor tokens [M, C] joined to row `row` (item i of the batch) at this (site, sigma, cond kind) key: the
    store's (an earlier call's anchors), else captured in this call, else the row's own pooled tokens (no track, or
    none recorded: counted missing). Capturing items record their own tokens first."""
    track = batch.tracks[i]
    if batch.capture[i]:
        batch.captured.setdefault(track, {})[key] = own[row].detach().clone()
    tok = None
    if track is not None:
        tok = store.tokens.get(track, {}).get(key)
        if tok is None:
            tok = batch.captured.get(track, {}).get(key)
        if tok is None:
            batch.missing += 1
    if tok is None or tok.shape != own.shape[1:]:
        tok = own[row]
    return tok


def build_anchor_patch(store: AnchorStore) -> AttnPatch:
    """attn1_patch closure: f(n, ctx, val, extra_options) -> (n, ctx', val') with the anchors' tokens joined to K/V.

    n: [R*B, N, C], R = len(extra_options["cond_or_uncond"]) row types (cond / uncond chunks of B items each, in
    that order), B = len(store.active.tracks). ctx / val: K/V sources (n itself, or already reduced by TokenFuse's
    scheduler: any token count); both grow by the same M anchor tokens. Passes everything through unchanged (same
    objects) when no call is active, no item has a track, or the batch layout does not match.
    """
    warned: set[str] = set()
    last: list[Any] = [None, None]  # sigmas object, its float (one host sync per model call, not per site)

    def warn_once(key: str, msg: str, *args: Any) -> None:
        if key not in warned:
            warned.add(key)
            log.warning(msg, *args)

    def attn1_patch(n: torch.Tensor, ctx: Any, val: Any, extra_options: dict[str, Any]) -> tuple[Any, Any, Any]:
        batch = store.active
        if batch is None or n.ndim != 3 or not any(t is not None for t in batch.tracks):
            return n, ctx, val
        rows = list(extra_options.get("cond_or_uncond") or [0])
        b = len(batch.tracks)
        if n.shape[0] != len(rows) * b:
            warn_once("layout", "TokenFuse: anchor attention skipped (batch %d != %d x %d)", n.shape[0], len(rows), b)
            return n, ctx, val
        if not all(isinstance(t, torch.Tensor) and t.ndim == 3 and t.shape[0] == n.shape[0] for t in (ctx, val)):
            return n, ctx, val
        sig = extra_options.get("sigmas")
        if sig is not last[0]:
            last[:] = [sig, _sigma(extra_options)]
        sigma = last[1]
        if sigma is None:
            warn_once("sigma", "TokenFuse: anchor attention skipped (no sigmas in transformer_options)")
            return n, ctx, val
        site = _site(extra_options, n.shape[1])
        grid = grid_of(n.shape[1], extra_options.get("original_shape"))
        own = pool_tokens(n, grid, store.pool)  # [R*B, M, C] (n itself when pool 1)
        parts = [
            _anchor_row(store, batch, own, r * b + i, i, (site, sigma, int(kind))).to(device=n.device, dtype=n.dtype)
            for r, kind in enumerate(rows)
            for i in range(b)
        ]
        extra = torch.stack(parts)
        batch.joined += 1
        new_ctx = torch.cat([ctx, extra], dim=1)
        new_val = new_ctx if val is ctx else torch.cat([val, extra], dim=1)
        return n, new_ctx, new_val

    attn1_patch.tokenfuse_any_kv = True  # type: ignore[attr-defined]  # joins any K/V: top-K before it may stay
    return attn1_patch
