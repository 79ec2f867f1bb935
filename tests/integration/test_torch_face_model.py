"""The plain-torch face model (face_model/torch_*.py, what CI's quality gate runs) against ComfyUI's classes.

Same committed weights, same inputs: the U-Net forward with the pack's attention patches (no preset, balanced, an
aggressive adaptive preset, tome (the attn1_output_patch path), topk, and balanced with a crop-space TokenPlan), the
VAE encode/decode, and the whole ScheduledFusion path (ComfyUI's sampler vs the torch sampler, noise mask, cfg 1,
euler/normal) must agree within float32 round-off (measured: bit-identical on CPU with SDPA).
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_torch_face_model.py
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

ATOL = 1e-5


@pytest.fixture(scope="module")
def st(comfy: SimpleNamespace) -> Iterator[SimpleNamespace]:
    import comfy.utils
    import tokenfuse
    import torch
    from tokenfuse.devkit.face_model import gate
    from tokenfuse.devkit.face_model import quality as q
    from tokenfuse.face_model import loader, torch_sampling

    if not loader.weights_present():
        pytest.skip(f"trained face model weights not found in {loader.WEIGHTS_DIR}")
    comfy.utils.PROGRESS_BAR_ENABLED = False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SimpleNamespace(
        pack=tokenfuse,
        fm=loader.load_face_model(),
        tm=torch_sampling.load_torch_face_model(),
        ts=torch_sampling,
        gate=gate,
        q=q,
    )
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "preset,strategy,with_plan",
    [
        (None, "preset", False),
        ("balanced", "preset", False),
        ("lowvram_4gb", "preset", False),
        ("balanced", "tome", False),
        ("balanced", "topk", False),
        ("balanced", "preset", True),
    ],
)
def test_unet_forward_matches_comfy(st: SimpleNamespace, preset: str | None, strategy: str, with_plan: bool) -> None:
    import torch
    from tokenfuse.fusion.crops import crop_plan
    from tokenfuse.scheduling.keys import PLAN_KEY

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 32, 32, generator=gen) * 4.0
    sigma = torch.tensor([3.5, 3.5])
    sample_sigmas = torch.tensor([3.5, 1.2, 0.0])
    comfy_model = st.fm.model if preset is None else st.q.scheduled(st.pack, st.fm.model, preset, strategy)
    torch_model = st.tm if preset is None else st.ts.scheduled(st.tm, preset, strategy)
    options = dict(comfy_model.model_options.get("transformer_options", {}))
    if with_plan:
        masks = np.zeros((2, 256, 256), np.float32)
        masks[:, 60:200, 70:190] = 1.0
        plan = crop_plan(masks, floor=0.1, protect_threshold=0.5)
        options[PLAN_KEY] = plan
        torch_model = torch_model.with_options(**{PLAN_KEY: plan})
    options.update(sigmas=sigma, sample_sigmas=sample_sigmas, cond_or_uncond=[0], uuids=[0])
    with torch.no_grad():
        ref = comfy_model.model.apply_model(
            x, sigma, c_crossattn=st.fm.context.expand(2, -1, -1), transformer_options=options
        )
    ours = torch_model.denoise(x, sigma, sample_sigmas)
    assert torch.isfinite(ours).all()
    assert (ours - ref).abs().max().item() <= ATOL
    if preset is not None:  # the patches ran: the output differs from the plain model's
        plain = st.tm.denoise(x, sigma, sample_sigmas)
        assert (ours - plain).abs().max().item() > 1e-4


def test_vae_matches_comfy(st: SimpleNamespace) -> None:
    import torch

    px = torch.rand(2, 256, 256, 3, generator=torch.Generator().manual_seed(1))
    ref = st.fm.vae.encode(px)
    ours = st.tm.vae.encode(px)
    assert ours.shape == ref.shape == (2, 4, 32, 32)
    assert (ours - ref).abs().max().item() <= ATOL
    assert (st.tm.vae.decode(ref) - st.fm.vae.decode(ref)).abs().max().item() <= ATOL


@pytest.mark.parametrize("preset", [None, "balanced"])
def test_scheduled_fusion_matches_comfy(st: SimpleNamespace, preset: str | None) -> None:
    """ScheduledFusion on the astronaut: ComfyUI's VAE + comfy.sample.sample vs the torch backend, same node code."""
    photo = st.gate.astronaut_photo(st.pack)
    params = st.q.FusionParams(steps=6, denoise=0.45, guide=256, seed=3)
    comfy_model = st.fm.model if preset is None else st.q.scheduled(st.pack, st.fm.model, preset)
    torch_model = st.tm if preset is None else st.ts.scheduled(st.tm, preset)
    ref = st.q.fuse(st.pack, st.q.ComfyStack(comfy_model, st.fm.vae, st.fm.conditioning()), photo, params, st.fm.model)
    ours = st.gate.fuse_torch(st.pack, torch_model, photo, params)
    assert np.abs(ours.crop - ref.crop).max() <= 1e-4
    assert st.q.psnr(ref.crop, photo.input_crop, photo.mask) < 60.0  # the face was actually resampled
