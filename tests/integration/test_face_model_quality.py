"""The quality gate on the project's trained face model (face_model/weights) through real ComfyUI.

Held-out faces that training never saw (devkit/face_model/data.NEVER_TRAIN): skimage's astronaut and the two largest
faces of insightface's t1.jpg. ScheduledFusion runs unscheduled and with `balanced`, same seed, fewer steps than the
bench (8 steps at denoise 0.45 = 4 sampled steps, guide 512: SD1.5's 4 096 top-level tokens). `balanced` must stay
>= 30 dB PSNR and >= 0.95 SSIM vs the unscheduled output on the face, so a scheduler change that damages a trained
model's output fails here. Also checks that the trained attention is not a no-op (scheduling changes the output).
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_face_model_quality.py
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest

PARAMS = dict(steps=8, denoise=0.45, guide=512, seed=0)


def _t1() -> np.ndarray | None:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / "t1.jpg"
    bgr = cv2.imread(str(path))
    return None if bgr is None else bgr[..., ::-1].astype(np.float32) / 255.0


@pytest.fixture(scope="module")
def stack(comfy: SimpleNamespace) -> Iterator[SimpleNamespace]:
    import comfy.utils
    import tokenfuse
    import torch
    from tokenfuse.devkit.face_model import quality as q
    from tokenfuse.face_model import loader

    if not loader.weights_present():
        pytest.skip(f"trained face model weights not found in {loader.WEIGHTS_DIR}")
    comfy.utils.PROGRESS_BAR_ENABLED = False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core box one thread is many times faster than two
    fm = loader.load_face_model()
    photos = []
    astronaut = pytest.importorskip("skimage.data").astronaut().astype(np.float32) / 255.0
    photos.append(q.prepare_photo(tokenfuse, "astronaut", astronaut))
    t1 = _t1()
    if t1 is not None:
        photos += [q.prepare_photo(tokenfuse, f"t1 face {i}", t1, index=i) for i in range(2)]
    photos = [p for p in photos if p is not None]
    assert photos, "no held-out face detected"
    yield SimpleNamespace(pack=tokenfuse, fm=fm, q=q, photos=photos, params=q.FusionParams(**PARAMS), cache={})
    torch.set_num_threads(threads)


def _runs(st: SimpleNamespace, preset: str | None, photos: int | None = None) -> list[Any]:
    """ScheduledFusion outputs of the first `photos` held-out faces (all by default), cached per preset."""
    chosen = st.photos[:photos]
    key = (preset, len(chosen))
    if key not in st.cache:
        model = st.fm.model if preset is None else st.q.scheduled(st.pack, st.fm.model, preset)
        cond = st.fm.conditioning()
        st.cache[key] = [
            st.q.fuse(st.pack, st.q.ComfyStack(model, st.fm.vae, cond), p, st.params, st.fm.model) for p in chosen
        ]
    return st.cache[key]


@pytest.fixture(scope="module")
def unscheduled(stack: SimpleNamespace) -> list[Any]:
    return _runs(stack, None)


def test_trained_model_refines_the_face_and_keeps_the_rest(stack: SimpleNamespace, unscheduled: list[Any]) -> None:
    q = stack.q
    for photo, run in zip(stack.photos, unscheduled, strict=True):
        assert np.isfinite(run.crop).all()
        changed = q.psnr(run.crop, photo.input_crop, photo.mask)
        assert 10.0 < changed < q.PSNR_CAP, f"{photo.name}: PSNR vs input {changed:.1f} dB (no-op or destroyed)"
        border = np.abs(run.crop[:8] - photo.input_crop[:8]).mean()
        assert border < 0.02, f"{photo.name}: the crop border changed ({border:.3f}), the noise mask leaked"


def test_balanced_passes_the_quality_gate(stack: SimpleNamespace, unscheduled: list[Any]) -> None:
    q = stack.q
    ours = _runs(stack, "balanced")
    psnrs = [q.psnr(o.crop, u.crop, p.mask) for o, u, p in zip(ours, unscheduled, stack.photos, strict=True)]
    ssims = [q.ssim(o.crop, u.crop, p.mask) for o, u, p in zip(ours, unscheduled, stack.photos, strict=True)]
    assert min(psnrs) < q.PSNR_CAP, "balanced left every face bit-identical: the attention patches did not apply"
    assert np.mean(psnrs) >= 30.0 and np.mean(ssims) >= 0.95, (psnrs, ssims)


def test_off_is_bit_identical(stack: SimpleNamespace, unscheduled: list[Any]) -> None:
    off = _runs(stack, "off", photos=1)
    for o, u in zip(off, unscheduled[:1], strict=True):
        assert np.array_equal(o.crop, u.crop)


def test_aggressive_preset_changes_more_than_balanced(stack: SimpleNamespace, unscheduled: list[Any]) -> None:
    """A trained model must register the strength of the reduction (random weights cannot show this)."""
    q = stack.q
    photo, base = stack.photos[0], unscheduled[0]
    bal = _runs(stack, "balanced")[0]
    low = _runs(stack, "lowvram_4gb", photos=1)[0]
    assert q.psnr(low.crop, base.crop, photo.mask) < q.psnr(bal.crop, base.crop, photo.mask)
