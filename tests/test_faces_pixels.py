"""faces/pixels.py: the table and in-place conversions give the NumPy one-liners' values bit for bit."""

from __future__ import annotations

import numpy as np
from tokenfuse.faces.pixels import to_u8_, unit_float


def test_unit_float_equals_astype_divide_on_views_too() -> None:
    u8 = np.random.default_rng(0).integers(0, 256, (120, 161, 3), dtype=np.uint8)
    for view in (u8, u8[7:90, 11:150]):
        got = unit_float(view)
        assert got.dtype == np.float32 and np.array_equal(got, view.astype(np.float32) / 255.0)


def test_to_u8_rounds_half_up_and_clips_like_numpy() -> None:
    x = np.random.default_rng(1).random((64, 257, 3), dtype=np.float32) * 1.4 - 0.2
    x[0, :256, 0] = (np.arange(256, dtype=np.float32) + 0.5) / 255.0  # halves: rounded up
    x[1, :3, 0] = [-5.0, 2.0, 1.0]
    want = (np.clip(x, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    assert np.array_equal(to_u8_(x.copy()), want)
