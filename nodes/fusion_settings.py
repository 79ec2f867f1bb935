"""ScheduledFusion's widget values as one frozen, typed object (built once per run from the node's inputs).

ComfyUI calls the node with one keyword per input, so `ScheduledFusion.fuse` keeps that signature (the input names
are the workflow contract); its first step packs the widgets into `FusionWidgets`, and everything after it reads
that object: the per-face loop's `FusionSettings`, ComfyUI's sampler arguments and the report header. Torch-free.
VideoFaceFusion packs its own widgets the same way (its crops: guide = max size, crop factor 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast, get_args

from ..fusion.fallback import FallbackConfig, FallbackMode
from ..fusion.refine import FusionSettings
from ..scheduling.keys import PLAN_KEY, PRESET_KEY
from ..scheduling.vocabulary import PRESET_ORDER
from .glue.sampling import SamplerArgs
from .model_patching import _transformer_option


def stronger_presets() -> tuple[str, ...]:
    """The presets the OOM fallback may re-patch with (empty when the scheduler API is unavailable)."""
    try:
        from ..scheduling.schedule import Preset
        from .model_patching import schedule_model  # noqa: F401 - availability check
    except ImportError:
        return ()
    return tuple(p for p in PRESET_ORDER if p in get_args(Preset) and p != "off")


@dataclass(frozen=True)
class FusionWidgets:
    """The widgets of ScheduledFusion (not its connections), converted once.

    guide_size is stored as given; `guide` is the side actually sampled at crop_factor 1 (a multiple of 8).
    """

    seed: int
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    denoise: float
    guide_size: int
    max_size: int
    crop_factor: float
    feather: float
    faces_per_batch: int
    fallback: FallbackMode

    @classmethod
    def from_inputs(cls, **widgets: Any) -> FusionWidgets:
        """From the node's keyword inputs; the conversions are the ones the node always applied."""
        return cls(
            seed=int(widgets["seed"]),
            # the sampler's widgets go to ComfyUI (and into the report header) exactly as given
            steps=widgets["steps"],
            cfg=widgets["cfg"],
            sampler_name=widgets["sampler_name"],
            scheduler=widgets["scheduler"],
            denoise=widgets["denoise"],
            guide_size=int(widgets["guide_size"]),
            max_size=int(widgets["max_size"]),
            crop_factor=float(widgets["crop_factor"]),
            feather=float(widgets["feather"]),
            faces_per_batch=int(widgets["faces_per_batch"]),
            fallback=cast(FallbackMode, widgets["fallback"]),
        )

    def sampler_args(self) -> SamplerArgs:
        """The widgets ComfyUI's sampler takes, as given."""
        return SamplerArgs(self.steps, self.cfg, self.sampler_name, self.scheduler, self.denoise)

    def settings_for(self, model: Any, token_plan: Any = None) -> FusionSettings:
        """The loop's settings for this MODEL: a crop-space TokenPlan when a plan is connected or on the MODEL (a
        frame-space plan would land on the crops misplaced: each crop gets its own from its face mask, at the
        plan's protect_threshold), the MODEL's preset as the start of the stronger-preset fallback."""
        source_plan = token_plan if token_plan is not None else _transformer_option(model, PLAN_KEY)
        protect = float(getattr(source_plan, "protect_threshold", 0.5)) if source_plan is not None else 0.5
        return self.fusion_settings(
            use_plan=source_plan is not None,
            protect_threshold=protect,
            stronger_presets=stronger_presets(),
            incoming_preset=str(_transformer_option(model, PRESET_KEY) or ""),
        )

    @property
    def guide(self) -> int:
        return self.guide_size // 8 * 8

    def fusion_settings(
        self, use_plan: bool, protect_threshold: float, stronger_presets: tuple[str, ...], incoming_preset: str
    ) -> FusionSettings:
        """The per-face loop's settings (fusion/run.py); the fallback never shrinks the guide below 64 or half of
        it (at most 256)."""
        return FusionSettings(
            seed=self.seed,
            guide_size=self.guide,
            max_size=self.max_size,
            crop_factor=self.crop_factor,
            feather=self.feather,
            faces_per_batch=self.faces_per_batch,
            use_plan=use_plan,
            protect_threshold=protect_threshold,
            fallback=FallbackConfig(
                mode=self.fallback,
                stronger_presets=stronger_presets,
                incoming_preset=incoming_preset,
                min_guide=max(64, min(256, self.guide_size // 2)),
                crop_factor=self.crop_factor,
                max_size=self.max_size,
            ),
        )

    def header(self, faces: int, frames: int, use_plan: bool) -> str:
        """The first line of the node's report."""
        return (
            f"ScheduledFusion: {faces} face(s) in {frames} frame(s), guide {self.guide}, steps {self.steps}, "
            f"denoise {self.denoise}, fallback {self.fallback}, plan {'on' if use_plan else 'off'}"
            + (" (denoise 0: faces not re-sampled, no VAE round trip)" if self.denoise <= 0.0 else "")
        )
