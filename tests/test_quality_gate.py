"""The issue-14 quality gate in CI: every preset on the project's trained face model, without ComfyUI.

ScheduledFusion's node code runs with a plain-torch backend (devkit/face_model/torch_sampling.py: the committed
weights in a torch re-implementation of ComfyUI's UNetModel / AutoencoderKL, SD1.5's schedule, ComfyUI's euler with a
noise mask; tests/integration/test_torch_face_model.py checks it against ComfyUI's classes) and the pack's real
attention patches. Face: skimage's public-domain astronaut (never in training), FACES built by hand (no detector).

CI settings, cheaper than the bench (bench/quality.py: guide 512, 20 steps, ComfyUI): guide 256 (a 32x32 latent,
1 024 top-level tokens), 8 steps at denoise 0.45, seed 0, cfg 1, euler/normal. Gate: PSNR >= 30 dB and SSIM >= 0.95
of each preset's face vs the unscheduled one; with dlib installed, balanced's identity distance to the input face at
most 0.05 above the unscheduled run's. A deliberately broken patch (balanced with its pooled K/V summed instead
of averaged, i.e. a pooling that forgets to divide by the kernel area) must fail the same gate, so the gate can see
damage on this model. About 30-40 s on 2 shared CPU cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("skimage")

PARAMS = dict(steps=8, denoise=0.45, guide=256, seed=0)


@pytest.fixture(scope="module")
def st() -> Iterator[SimpleNamespace]:
    import tokenfuse
    import torch
    from tokenfuse.devkit.face_model import gate, loader, torch_sampling
    from tokenfuse.devkit.face_model import quality as q

    if not loader.weights_present():
        pytest.skip(f"trained face model weights not found in {loader.WEIGHTS_DIR}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core box one thread is faster than two
    model = torch_sampling.load_torch_face_model()
    photo = gate.astronaut_photo(tokenfuse)
    params = q.FusionParams(**PARAMS)
    base = gate.fuse_torch(tokenfuse, model, photo, params)
    yield SimpleNamespace(pack=tokenfuse, model=model, photo=photo, params=params, base=base, gate=gate, q=q, runs={})
    torch.set_num_threads(threads)


def _output(st: SimpleNamespace, preset: str) -> Any:
    """The preset's FaceRun (cached: the gate and the identity test share it)."""
    from tokenfuse.devkit.face_model.torch_sampling import scheduled

    if preset not in st.runs:
        st.runs[preset] = st.gate.fuse_torch(st.pack, scheduled(st.model, preset), st.photo, st.params)
    return st.runs[preset]


def _run(st: SimpleNamespace, model: Any) -> Any:
    return st.gate.compare(st.gate.fuse_torch(st.pack, model, st.photo, st.params), st.base, st.photo)


def test_unscheduled_output_is_a_refined_face(st: SimpleNamespace) -> None:
    crop, photo, q = st.base.crop, st.photo, st.q
    assert np.isfinite(crop).all()
    changed = q.psnr(crop, photo.input_crop, photo.mask)
    assert 10.0 < changed < 40.0, f"PSNR vs the input face {changed:.1f} dB: a no-op or a destroyed face"
    border = float(np.abs(crop[:8] - photo.input_crop[:8]).mean())
    assert border < 0.02, f"the crop border changed ({border:.3f}): the noise mask leaked"


@pytest.mark.parametrize("preset", ["balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb"])
def test_preset_passes_the_quality_gate(st: SimpleNamespace, preset: str) -> None:
    res = st.gate.compare(_output(st, preset), st.base, st.photo)
    assert res.psnr < st.q.PSNR_CAP, f"{preset} left the face bit-identical: its patches never ran"
    assert res.passed, f"{preset}: PSNR {res.psnr:.2f} dB, SSIM {res.ssim:.4f} vs unscheduled (gate 30 dB, 0.95)"


def test_a_broken_patch_fails_the_quality_gate(st: SimpleNamespace) -> None:
    from tokenfuse.devkit.face_model.torch_sampling import scheduled, with_patches

    balanced = scheduled(st.model, "balanced")
    real = balanced.options["patches"]["attn1_patch"][0]

    def summed_pooling(n: Any, ctx: Any, val: Any, extra: dict[str, Any]) -> tuple[Any, Any, Any]:
        n2, ctx2, val2 = real(n, ctx, val, extra)
        if ctx2 is ctx:  # a call balanced leaves unreduced stays correct
            return n2, ctx2, val2
        k = n.shape[1] / ctx2.shape[1]  # tokens per pooled cell (4 for 2x2)
        return n2, ctx2 * k, val2 * k

    res = _run(st, with_patches(st.model, [summed_pooling], []))
    assert not res.passed, f"a K/V pooling that sums instead of averaging passed the gate ({res.psnr:.2f} dB)"


def test_balanced_keeps_identity(st: SimpleNamespace) -> None:
    """dlib's 128-d face distance to the input face (same person < 0.6) grows by <= 0.05 under balanced (skipped
    without the test-only packages dlib-bin + face-recognition-models)."""
    ident, note = st.q.identity_backend()
    if ident is None:
        pytest.skip(note)
    ref = ident.embed(st.photo.input_crop)
    base = float(np.linalg.norm(ident.embed(st.base.crop) - ref))
    ours = float(np.linalg.norm(ident.embed(_output(st, "balanced").crop) - ref))
    assert ours <= base + 0.05, f"identity distance {ours:.3f} vs unscheduled {base:.3f}"
