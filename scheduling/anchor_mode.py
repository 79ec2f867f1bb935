"""The cross-frame anchor attention setting (torch-free: the node's INPUT_TYPES import it at start-up).

off: no cross-frame attention. full: a track's crops attend to the anchor key frame's attn1 tokens as they are
(K/V 2x, memory: every site's tokens per step). pooled: the anchor's tokens 2x2 average-pooled on the latent grid
(K/V 1.25x, a quarter of the memory). See scheduling/anchor_attention.py.
"""

from __future__ import annotations

from typing import Literal

AnchorMode = Literal["off", "full", "pooled"]
ANCHOR_POOL: dict[str, int] = {"off": 0, "full": 1, "pooled": 2}


def pool_for(mode: str) -> int:
    """The pooling factor of an AnchorMode (0 = off); ValueError naming the choices for anything else."""
    if mode not in ANCHOR_POOL:
        raise ValueError(f"anchor_attention must be one of {list(ANCHOR_POOL)}, got {mode!r}")
    return ANCHOR_POOL[mode]
