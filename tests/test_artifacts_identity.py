"""The artifact check's identity criteria: a score names its embedder, dlib's threshold catches far identities, and
the model-free structure rule catches another person's face.

Issue 14: the check's identity floor (0.35) is an ArcFace cosine similarity; no ArcFace weights exist offline, and
dlib's 128-d descriptors (face-recognition-models) live on another scale (L2 distance, lower = same person). So an
IdentityScore carries its embedder and only meets that embedder's threshold. The dlib threshold was calibrated on the
trained face model's real outputs of 20 held-out faces (bench/quality.py, docs/quality.md): 0.76, above
the worst good output (0.731). Here it is checked on other real photos: the astronaut's real output (trained model,
CI settings of tests/test_quality_gate.py; dlib distance 0.629) passes, and with t1.jpg's second and third faces
pasted through its mask (0.786, 0.864) it fails. Known misses, as on the held-out faces (other people pasted there
score 0.41-0.75): Tom Hanks (0.748) and t1.jpg's first face (0.693) pass; dlib cannot tell them from this model's
identity drift. Together the tests pin the threshold between 0.629 and 0.786: dlib's own 0.6 or anything >= 0.79
fails them. The dlib tests skip without the test-only packages dlib-bin + face-recognition-models.

What catches every one of them is model-free, and opt-in: the structure rule (the output's low-passed face vs the
crop it was sampled from, fusion/artifacts.structure_similarity). Held-out calibration (guide 512, 20 steps): good
outputs >= 0.898 at denoise 0.45 and >= 0.848 at 0.6, other people pasted <= 0.772, floor 0.81. Here: the
astronaut's output 0.92 passes; all four donors, pasted or whole, fail (<= 0.36). It is off by default: the same
model's good refines of a blurry 176x144 face score 0.74-0.80 (docs/quality.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenfuse.fusion.artifacts import ArtifactThresholds, IdentityScore, check_crop

CI_PARAMS = dict(steps=8, denoise=0.45, guide=256, seed=0)  # tests/test_quality_gate.py's CI settings


def _crop_and_mask() -> tuple[np.ndarray, np.ndarray]:
    from skimage.data import astronaut

    crop = astronaut()[:256, 128:384].astype(np.float32) / 255.0
    mask = np.zeros(crop.shape[:2], np.float32)
    mask[64:192, 64:192] = 1.0
    return crop, mask


def test_a_score_is_read_on_its_own_embedders_scale() -> None:
    """0.9 is a good ArcFace similarity but a far dlib distance; 0.2 the reverse: the embedder picks the rule."""
    crop, mask = _crop_and_mask()
    assert check_crop(crop, mask, IdentityScore("arcface", 0.9)).ok
    assert check_crop(crop, mask, 0.9).ok  # a plain float is an ArcFace similarity, as before
    far = check_crop(crop, mask, IdentityScore("dlib", 0.9))
    assert not far.ok and "dlib distance" in far.reasons[0], far.reasons
    assert check_crop(crop, mask, IdentityScore("dlib", 0.2)).ok
    low = check_crop(crop, mask, IdentityScore("arcface", 0.2))
    assert not low.ok and "similarity" in low.reasons[0], low.reasons
    stats = dict(check_crop(crop, mask, IdentityScore("dlib", 0.2)).stats)
    assert stats["identity_dlib_distance"] == pytest.approx(0.2) and "identity" not in stats
    assert not check_crop(crop, mask, IdentityScore("dlib", float("nan"))).ok


def test_embeddings_of_different_embedders_are_never_compared() -> None:
    rng = np.random.default_rng(0)
    arc, dl = rng.normal(size=512), rng.normal(size=128)
    with pytest.raises(ValueError, match="same embedder|must both come"):
        IdentityScore.between("dlib", dl, arc)
    with pytest.raises(ValueError, match="must both come"):
        IdentityScore.between("arcface", arc, dl)
    with pytest.raises(ValueError, match="must both come"):
        IdentityScore.between("dlib", arc, arc)  # a 512-d pair is not dlib's
    with pytest.raises(ValueError, match="unknown identity embedder"):
        IdentityScore("facenet", 0.5)  # type: ignore[arg-type]
    assert IdentityScore.between("dlib", dl, dl).value == pytest.approx(0.0)
    assert IdentityScore.between("dlib", dl, dl + 0.1).value == pytest.approx(0.1 * np.sqrt(128))
    assert IdentityScore.between("arcface", arc, arc).value == pytest.approx(1.0)


# ------------------------------------------------------------------------------------ real photos
DONORS = (("t1.jpg", 0), ("t1.jpg", 1), ("t1.jpg", 2), ("Tom_Hanks_54745.png", 0))


@pytest.fixture(scope="module")
def fused() -> Iterator[SimpleNamespace]:
    """The astronaut's real output (trained face model, CI settings) and other people's aligned faces (insightface's
    test photos) as donors."""
    pytest.importorskip("skimage")
    import tokenfuse
    import torch
    from tokenfuse.devkit.face_model import gate
    from tokenfuse.devkit.face_model import quality as q
    from tokenfuse.face_model import loader, torch_sampling

    if not loader.weights_present():
        pytest.skip(f"trained face model weights not found in {loader.WEIGHTS_DIR}")
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no donor photos")
    images = Path(next(iter(spec.submodule_search_locations)), "data", "images")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    photo = gate.astronaut_photo(tokenfuse)
    out = gate.fuse_torch(tokenfuse, torch_sampling.load_torch_face_model(), photo, q.FusionParams(**CI_PARAMS))
    donors = {}
    for file, index in DONORS:
        rgb = q.read_photo(images / file)
        donor = None if rgb is None else q.prepare_photo(tokenfuse, file, rgb, 512, index)
        if donor is None:
            pytest.skip(f"no face {index} detected in insightface's {file}")
        donors[f"{file}#{index}"] = donor.input_crop
    yield SimpleNamespace(photo=photo, out=out.crop, donors=donors)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def real(fused: SimpleNamespace) -> SimpleNamespace:
    from tokenfuse.devkit.face_model import quality as q

    ident, note = q.identity_backend()
    if ident is None:
        pytest.skip(note)
    return SimpleNamespace(**vars(fused), ident=ident, ref=ident.embed(fused.photo.input_crop))


def _dlib(real: SimpleNamespace, crop: np.ndarray) -> IdentityScore:
    return IdentityScore.between("dlib", real.ref, real.ident.embed(crop))


def test_the_same_faces_real_output_passes(real: SimpleNamespace) -> None:
    score = _dlib(real, real.out)
    res = check_crop(real.out, real.photo.mask, score)
    assert res.ok, f"the astronaut's own output flagged: {res.reasons}"
    assert dict(res.stats)["identity_dlib_distance"] == pytest.approx(score.value)


@pytest.mark.parametrize("donor", ["t1.jpg#1", "t1.jpg#2"])
def test_another_persons_face_fails(real: SimpleNamespace, donor: str) -> None:
    from tokenfuse.devkit.face_model.identity_check import paste_face

    wrong = paste_face(real.out, real.donors[donor], real.photo.mask)
    res = check_crop(wrong, real.photo.mask, _dlib(real, wrong))
    assert not res.ok, f"{donor}'s face pasted into the astronaut's output passed: {dict(res.stats)}"
    assert [r for r in res.reasons if "dlib distance" in r] == list(res.reasons), res.reasons  # identity alone


def test_a_threshold_on_the_wrong_scale_is_caught(real: SimpleNamespace) -> None:
    """dlib's own "same person" cut (0.6) and ArcFace's floor (0.35) read as a dlib ceiling both flag the astronaut's
    real output: the calibrated default is neither."""
    good = _dlib(real, real.out)
    assert 0.6 < good.value < ArtifactThresholds().max_identity_distance_dlib, good
    assert not check_crop(real.out, real.photo.mask, good, ArtifactThresholds(max_identity_distance_dlib=0.6)).ok
    t = ArtifactThresholds()
    mixed = ArtifactThresholds(max_identity_distance_dlib=t.min_identity)
    assert not check_crop(real.out, real.photo.mask, good, mixed).ok


# ------------------------------------------------------------------ structure: model-free, catches every donor
def test_the_real_output_keeps_the_sampled_faces_structure(fused: SimpleNamespace) -> None:
    """The trained model's real refine of the astronaut (0.92) clears the structure floor (0.81; held-out outputs
    at guide 512: >= 0.898) with no embedder at all."""
    from tokenfuse.fusion.artifacts import STRUCTURE_FLOOR, structure_similarity

    value = structure_similarity(fused.photo.input_crop, fused.out, fused.photo.mask)
    assert value > STRUCTURE_FLOOR + 0.05, value
    on = ArtifactThresholds(min_structure=STRUCTURE_FLOOR)
    res = check_crop(fused.out, fused.photo.mask, thresholds=on, reference=fused.photo.input_crop)
    assert res.ok, res.reasons


@pytest.mark.parametrize("donor", [f"{f}#{i}" for f, i in DONORS])
@pytest.mark.parametrize("kind", ["paste", "whole"])
def test_another_persons_face_is_not_the_sampled_face(fused: SimpleNamespace, donor: str, kind: str) -> None:
    """Every donor, including the two dlib cannot tell from this model's drift (t1.jpg#0 at 0.693, Tom Hanks at
    0.748), fails the structure rule: pasted through the output's mask or as a whole other face."""
    from tokenfuse.devkit.face_model.identity_check import paste_face
    from tokenfuse.fusion.artifacts import STRUCTURE_FLOOR

    face = fused.donors[donor]
    wrong = paste_face(fused.out, face, fused.photo.mask) if kind == "paste" else face
    on = ArtifactThresholds(min_structure=STRUCTURE_FLOOR)
    res = check_crop(wrong, fused.photo.mask, thresholds=on, reference=fused.photo.input_crop)
    assert not res.ok, f"{donor} ({kind}) passed: {dict(res.stats)}"
    assert any(r.startswith("not the sampled face") for r in res.reasons), res.reasons
