"""ScheduledFusion's frozen inputs: the widget settings object, the frozen sampler interface and its crop hooks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tokenfuse.fusion.fallback import FallbackConfig
from tokenfuse.fusion.run import CropHooks, FusionBackend, FusionSettings
from tokenfuse.nodes.fusion_settings import FusionWidgets
from tokenfuse.nodes.identity import setup_swap

WIDGETS = dict(
    seed=100,
    steps=4,
    cfg=5.0,
    sampler_name="euler",
    scheduler="normal",
    denoise=0.4,
    guide_size=500,
    max_size=1024,
    crop_factor=1.5,
    feather=0.04,
    faces_per_batch=2,
    fallback="auto",
)


def _backend() -> FusionBackend:
    return FusionBackend(
        encode=lambda px, tiled: px,
        decode=lambda lat, tiled: lat,
        sample=lambda *a: a[1],
        model_for=lambda a: ("m", ""),
    )


@pytest.mark.parametrize("guide", [500, 96, 1024])
def test_widgets_build_the_settings_the_node_always_built(guide: int) -> None:
    """The FusionSettings the node built inline before FusionWidgets existed (copied from it), field for field."""
    w = {**WIDGETS, "guide_size": guide}
    old = FusionSettings(
        seed=int(w["seed"]),
        guide_size=int(w["guide_size"]) // 8 * 8,
        max_size=int(w["max_size"]),
        crop_factor=float(w["crop_factor"]),
        feather=float(w["feather"]),
        faces_per_batch=int(w["faces_per_batch"]),
        use_plan=True,
        protect_threshold=0.6,
        fallback=FallbackConfig(
            mode="auto",
            stronger_presets=("balanced", "lowvram_4gb"),
            incoming_preset="balanced",
            min_guide=max(64, min(256, int(w["guide_size"]) // 2)),
            # smaller_guide judges the sampled side (guide x crop_factor, capped at max_size)
            crop_factor=float(w["crop_factor"]),
            max_size=int(w["max_size"]),
        ),
    )
    new = FusionWidgets.from_inputs(**w).fusion_settings(True, 0.6, ("balanced", "lowvram_4gb"), "balanced")
    assert new == old


def test_report_header_keeps_its_wording() -> None:
    header = FusionWidgets.from_inputs(**WIDGETS).header(3, 2, use_plan=False)
    assert (
        header == "ScheduledFusion: 3 face(s) in 2 frame(s), guide 496, steps 4, denoise 0.4, fallback auto, plan off"
    )


def test_widgets_backend_and_hooks_are_frozen() -> None:
    backend = _backend()
    for obj, name in ((FusionWidgets.from_inputs(**WIDGETS), "steps"), (backend, "sample"), (CropHooks(), "embed")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    assert backend.hooks == CropHooks()


def test_the_node_never_mutates_the_backend_it_is_given() -> None:
    """Crop hooks (ArcFace check, identity pre-swap) go onto a copy: the caller's backend keeps its own."""
    backend = _backend()
    copy, note = setup_swap(backend, "none", "none", None, None)
    assert note == "" and copy.hooks == backend.hooks == CropHooks() and copy.sample is backend.sample
    ref = np.ones(4, np.float32)
    with_hooks = dataclasses.replace(backend, hooks=CropHooks(identity_ref=ref))
    copy, _ = setup_swap(with_hooks, "none", "none", None, None)
    assert copy.hooks.identity_ref is ref and backend.hooks.identity_ref is None
    assert torch.equal(copy.encode(torch.ones(1), False), torch.ones(1))
