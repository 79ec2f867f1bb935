"""ToMe's src/dst partition drawn the plain way: a dst mask from the generator draw, then two `nonzero`s.

The reference for scheduling/merge.py `random_partition` (same generator draw, so the same index sets, sorted here):
tests/test_merge.py compares the sets, bench/patch_overhead.py times both. Not imported by the pack.
"""

from __future__ import annotations

import torch


def mask_partition(h: int, w: int, sx: int, sy: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_idx [Ns], dst_idx [Nd]) CPU int64, each sorted: one dst per full sy x sx cell of an h x w grid, tokens
    outside every full cell always src."""
    hsy, wsx = h // sy, w // sx
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    pick = torch.randint(sy * sx, (hsy, wsx), generator=gen)
    is_dst = torch.zeros(hsy, wsx, sy * sx, dtype=torch.bool)
    is_dst.scatter_(2, pick.unsqueeze(-1), True)
    is_dst = is_dst.view(hsy, wsx, sy, sx).transpose(1, 2).reshape(hsy * sy, wsx * sx)
    full = torch.zeros(h, w, dtype=torch.bool)
    full[: hsy * sy, : wsx * sx] = is_dst
    flat = full.flatten()
    return flat.logical_not().nonzero().flatten(), flat.nonzero().flatten()
