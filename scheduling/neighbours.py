"""Other nodes' attention patches that reduced keys/values would break, seen per model call.

ComfyUI hands the attention patches `extra_options` without its patch lists, so TokenFuse's DIFFUSION_MODEL wrapper
reads them from the model call's transformer_options and passes what matters (NEIGHBOURS_KEY, scheduling/keys.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Neighbours(NamedTuple):
    """Other nodes' attention patches in a model call that reduced K/V would break (set per model call by the
    DIFFUSION_MODEL wrapper: extra_options, which the attention patches get, lacks ComfyUI's patch lists).

    replaced: blocks with an attn1 *replace* (PerturbedAttentionGuidance, SelfAttentionGuidance on the middle block):
    ComfyUI hands the replace the K/V our attn1_patch returned, and it expects the block's own (PAG returns V as the
    output; SAG reshapes the N x N map). followed: another attn1_patch runs after ours (HyperTile tiles K/V as a grid):
    top-K's selected K/V are no grid, so top-K leaves those calls alone (pooled K/V stay a grid; after tome's merge
    HyperTile and ComfyUI's TomePatchModel see no grid of q and leave the call alone)."""

    replaced: frozenset[Any]
    followed: bool


def neighbours_of(options: dict[str, Any], ours: Callable[..., Any]) -> Neighbours | None:
    """The Neighbours of a model call's transformer_options; None when there are none (the common case)."""
    replaced = (options.get("patches_replace") or {}).get("attn1") or {}
    chain = (options.get("patches") or {}).get("attn1_patch") or []
    mine = next((i for i, p in enumerate(chain) if p is ours), None)
    followed = mine is not None and any(not getattr(p, "tokenfuse_any_kv", False) for p in chain[mine + 1 :])
    if not replaced and not followed:
        return None
    return Neighbours(frozenset(replaced), followed)


def stands_aside(nb: Neighbours, options: dict[str, Any], keeps_grid: bool) -> bool:
    """Whether this attention call must keep the block's own K/V (see Neighbours); keeps_grid: the strategy's reduced
    K/V are still a token grid (strategies.StrategyParts)."""
    if nb.followed and not keeps_grid:
        return True
    block = options.get("block")
    if not nb.replaced or block is None:
        return False
    return (block[0], block[1], options.get("block_index", 0)) in nb.replaced or tuple(block) in nb.replaced
