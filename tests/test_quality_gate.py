"""The issue-14 quality gate in CI: every preset on the project's trained face model, without ComfyUI.

ScheduledFusion's node code runs with a plain-torch backend (face_model/torch_sampling.py: the committed
weights in a torch re-implementation of ComfyUI's UNetModel / AutoencoderKL, SD1.5's schedule, ComfyUI's euler with a
noise mask; tests/integration/test_torch_face_model.py checks it against ComfyUI's classes) and the pack's real
attention patches. Face: skimage's public-domain astronaut (never in training), FACES built by hand (no detector).

CI settings, cheaper than the bench (bench/quality.py: guide 512, 20 steps, ComfyUI): guide 256 (a 32x32 latent,
1 024 top-level tokens), 8 steps at denoise 0.45, seed 0, cfg 1, euler/normal. Gate: PSNR >= 30 dB and SSIM >= 0.95
of each preset's face vs the unscheduled one; with dlib installed, balanced's identity distance to the input face at
most 0.05 above the unscheduled run's. A deliberately broken patch (balanced with its pooled K/V summed instead
of averaged, i.e. a pooling that forgets to divide by the kernel area) must fail the same gate, so the gate can see
damage on this model.

That absolute gate is too forgiving here (no self-attention at all: 36.5 dB; V shuffled against K: 40.4 dB), so two
relative checks sharpen it, each against references measured in the same run on the same input (devkit/face_model/
gate.py, broken.py, attention_probe.py; thresholds and the held-out measurements in docs/quality.md):
- image: each preset's face MSE vs unscheduled <= 0.7 x that of the model without self-attention;
- attention: on the unscheduled trajectory, each preset's (and tome's, top-k's; with and without a TokenPlan)
  attention structure error <= 0.7 x that of V shuffled against K; and every deliberately broken patch (pooled K/V
  summed, V shifted by one pooled token, V reversed, no self-attention) fails it.
About 45-60 s on 2 shared CPU cores.
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
    from tokenfuse.devkit.face_model import gate
    from tokenfuse.devkit.face_model import quality as q
    from tokenfuse.face_model import loader, torch_sampling

    if not loader.weights_present():
        pytest.skip(f"trained face model weights not found in {loader.WEIGHTS_DIR}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core box one thread is faster than two
    model = torch_sampling.load_torch_face_model()
    photo = gate.astronaut_photo(tokenfuse)
    params = q.FusionParams(**PARAMS)
    base = gate.fuse_torch(tokenfuse, model, photo, params)
    yield SimpleNamespace(
        pack=tokenfuse, model=model, photo=photo, params=params, base=base, gate=gate, q=q, runs={}, probes={}
    )
    torch.set_num_threads(threads)


def _output(st: SimpleNamespace, preset: str) -> Any:
    """The preset's FaceRun (cached: the gate and the identity test share it)."""
    from tokenfuse.face_model.torch_sampling import scheduled

    if preset not in st.runs:
        st.runs[preset] = st.gate.fuse_torch(st.pack, scheduled(st.model, preset), st.photo, st.params)
    return st.runs[preset]


def test_unscheduled_output_is_a_refined_face(st: SimpleNamespace) -> None:
    crop, photo, q = st.base.crop, st.photo, st.q
    assert np.isfinite(crop).all()
    changed = q.psnr(crop, photo.input_crop, photo.mask)
    assert 10.0 < changed < 40.0, f"PSNR vs the input face {changed:.1f} dB: a no-op or a destroyed face"
    border = float(np.abs(crop[:8] - photo.input_crop[:8]).mean())
    assert border < 0.02, f"the crop border changed ({border:.3f}): the noise mask leaked"


def _off_mse(st: SimpleNamespace) -> float:
    """Face MSE vs unscheduled of the model without self-attention (every attn1 output zeroed): the image reference."""
    from tokenfuse.devkit.face_model.broken import broken_model

    if "attn_off" not in st.runs:
        st.runs["attn_off"] = st.gate.fuse_torch(st.pack, broken_model(st.model, "attn_off"), st.photo, st.params)
    return st.gate.face_mse(st.runs["attn_off"], st.base, st.photo)


@pytest.mark.parametrize("preset", ["balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb"])
def test_preset_passes_the_quality_gate(st: SimpleNamespace, preset: str) -> None:
    run = _output(st, preset)
    res = st.gate.compare(run, st.base, st.photo)
    assert res.psnr < st.q.PSNR_CAP, f"{preset} left the face bit-identical: its patches never ran"
    assert res.passed, f"{preset}: PSNR {res.psnr:.2f} dB, SSIM {res.ssim:.4f} vs unscheduled (gate 30 dB, 0.95)"
    frac = st.gate.face_mse(run, st.base, st.photo) / _off_mse(st)
    assert frac <= st.gate.GATE_OFF_FRACTION, (
        f"{preset} changes the face by {frac:.2f} x what removing self-attention does (gate 0.7)"
    )


def _probe(st: SimpleNamespace, with_plan: bool) -> tuple[dict[str, Any], Any]:
    """Attention structure error of every preset strategy and every break, on one unscheduled run (cached)."""
    if with_plan not in st.probes:
        from tokenfuse.devkit.face_model.attention_probe import patches_of
        from tokenfuse.devkit.face_model.broken import BREAKS, broken_patches
        from tokenfuse.face_model.torch_sampling import scheduled
        from tokenfuse.fusion.crops import crop_plan

        variants = {p: patches_of(scheduled(st.model, p)) for p in st.gate.PRESETS}
        for strategy in ("tome", "topk"):
            variants[f"balanced/{strategy}"] = patches_of(scheduled(st.model, "balanced", strategy))
        variants.update({f"BROKEN {b}": broken_patches(st.model, b) for b in BREAKS})
        plan = crop_plan(st.photo.mask[None]) if with_plan else None
        st.probes[with_plan] = st.gate.attention_fidelity(
            st.pack, st.model, st.photo, st.params, st.gate.Probe(variants, plan)
        )
    return st.probes[with_plan]


@pytest.mark.parametrize("with_plan", [False, True], ids=["no-plan", "token-plan"])
def test_every_preset_keeps_the_attention_and_every_break_loses_it(st: SimpleNamespace, with_plan: bool) -> None:
    stats, run = _probe(st, with_plan)
    # the probe follows the unscheduled trajectory: its output is the unscheduled face
    assert float(np.abs(run.crop - st.base.crop).max()) == 0.0
    ref = stats["BROKEN v_perm"].structure_error
    assert ref > 0.8, f"shuffled V kept the attention's structure ({ref:.3f}): the reference is not a break"
    limit = st.gate.GATE_STRUCTURE_FRACTION * ref
    table = {name: (round(s.structure_error, 3), s.changed) for name, s in stats.items()}
    for name, s in stats.items():
        assert s.changed > 0, f"{name} changed no attention call: its patches never ran ({table})"
        if name.startswith("BROKEN"):
            assert s.structure_error > limit, f"{name} passed the attention gate ({limit:.3f}): {table}"
        else:
            assert s.structure_error <= limit, f"{name} fails the attention gate ({limit:.3f}): {table}"


def test_a_broken_patch_fails_the_quality_gate(st: SimpleNamespace) -> None:
    from tokenfuse.face_model.torch_sampling import scheduled, with_patches

    balanced = scheduled(st.model, "balanced")
    real = balanced.options["patches"]["attn1_patch"][0]

    def summed_pooling(n: Any, ctx: Any, val: Any, extra: dict[str, Any]) -> tuple[Any, Any, Any]:
        n2, ctx2, val2 = real(n, ctx, val, extra)
        if ctx2 is ctx:  # a call balanced leaves unreduced stays correct
            return n2, ctx2, val2
        k = n.shape[1] / ctx2.shape[1]  # tokens per pooled cell (4 for 2x2)
        return n2, ctx2 * k, val2 * k

    run = st.gate.fuse_torch(st.pack, with_patches(st.model, [summed_pooling], []), st.photo, st.params)
    res = st.gate.compare(run, st.base, st.photo)
    assert not res.passed, f"a K/V pooling that sums instead of averaging passed the gate ({res.psnr:.2f} dB)"
    frac = st.gate.face_mse(run, st.base, st.photo) / _off_mse(st)
    assert frac > st.gate.GATE_OFF_FRACTION, f"summed pooling passed the relative image gate ({frac:.2f})"


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


def test_a_nan_face_reads_as_the_worst_psnr_not_as_identical() -> None:
    """psnr() once returned PSNR_CAP (100 dB, "identical") for a NaN output: min(100, nan) is 100. The gate still
    failed it through SSIM, but bench/quality.py's tables and JSON reported a NaN face as a perfect match."""
    from tokenfuse.devkit.face_model import quality as q

    mask = np.zeros((16, 16), np.float32)
    mask[4:12, 4:12] = 1.0
    good = np.full((16, 16, 3), 0.5, np.float32)
    broken = good.copy()
    broken[6, 6] = np.nan
    assert q.psnr(good, good, mask) == q.PSNR_CAP
    assert q.psnr(broken, good, mask) == 0.0
    assert q.psnr(good, np.full_like(good, np.inf), mask) == 0.0
