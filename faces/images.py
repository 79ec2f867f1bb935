"""Frames in and out of ComfyUI's IMAGE layout ([B, H, W, C] float in 0..1), whatever channels/dtype arrive."""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger(__name__)


def as_rgb_float(image: torch.Tensor) -> np.ndarray:
    """[B, H, W, C] any float/int dtype, C in {1, 2, 3, 4} -> [B, H, W, 3] float32 (gray repeated, alpha dropped).

    Integer tensors (8/16-bit data that skipped normalisation) are scaled by their dtype's maximum.
    """
    if image.ndim == 3:
        image = image.unsqueeze(-1) if image.shape[-1] not in (1, 3, 4) else image.unsqueeze(0)
    if image.ndim != 4:
        raise ValueError(f"IMAGE must be [batch, height, width, channels], got shape {tuple(image.shape)}")
    arr = image.detach().cpu()
    if not arr.is_floating_point():
        arr = arr.float() / float(torch.iinfo(image.dtype).max)
    rgb: np.ndarray = arr.float().numpy()
    c = rgb.shape[-1]
    if c in (1, 2):
        rgb = np.repeat(rgb[..., :1], 3, axis=-1)
    elif c >= 3:
        rgb = rgb[..., :3]
    else:
        raise ValueError(f"IMAGE has {c} channels: expected 1 (gray), 3 (RGB) or 4 (RGBA)")
    return np.ascontiguousarray(rgb, dtype=np.float32)


def warn_out_of_range(frames: np.ndarray, node: str) -> None:
    """One warning when an IMAGE holds values outside [0, 1] (an HDR load, an exposure node): faces are refined and
    pasted in [0, 1], so inside them those values come out clipped (a darker or flatter patch) while the rest of the
    frame keeps them."""
    low, high = float(np.nanmin(frames)), float(np.nanmax(frames))
    if low < -1e-3 or high > 1.0 + 1e-3:
        log.warning(
            "%s: IMAGE values span %.3g..%.3g, outside 0..1 (HDR or an exposure node?): faces are refined and pasted "
            "in 0..1, so they come out clipped; tone-map the image into 0..1 first",
            node,
            low,
            high,
        )


def to_uint8(frame: np.ndarray) -> np.ndarray:
    """[H, W, 3] float 0..1 -> uint8 (non-finite values become 0)."""
    u8: np.ndarray = (np.clip(np.nan_to_num(frame), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return u8
