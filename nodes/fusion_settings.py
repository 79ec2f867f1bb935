"""ScheduledFusion's widget values as one frozen, typed object (built once per run from the node's inputs).

ComfyUI calls the node with one keyword per input, so `ScheduledFusion.fuse` keeps that signature (the input names
are the workflow contract); its first step packs the widgets into `FusionWidgets`, and everything after it reads
that object: the per-face loop's `FusionSettings`, ComfyUI's sampler arguments and the report header. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..fusion.fallback import FallbackConfig, FallbackMode
from ..fusion.run import FusionSettings


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
