"""Fallback policy for ScheduledFusion: what to try next when a face runs out of memory or comes out broken.

Pure logic, no torch: an `Attempt` describes how one face is processed; `after_oom` / `after_artifact` return the
next attempt and the action that produced it (or None when nothing is left, and the face passes through unchanged).
Every step taken is recorded in a `FaceReport`, so a fallback is always reported, never silent.

OOM order (cheapest quality loss first): split a multi-face batch into single faces, a stronger token schedule,
then tiled VAE encode/decode, then halving the guide size (never below `min_guide`). An artifact (NaN, black, blown,
noise, identity drop) reruns the face once with token scheduling off, since the schedule is the only part of the path
this pack changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..scheduling.vocabulary import PRESET_ORDER

FallbackMode = Literal["auto", "oom-only", "artifacts-only", "off"]
FallbackAction = Literal[
    "split_batch", "stronger_preset", "tiled_vae", "smaller_guide", "scheduling_off", "passthrough"
]
FaceStatus = Literal["ok", "fallback", "passthrough"]


@dataclass(frozen=True)
class Attempt:
    """How one face (or batch of faces) is processed.

    preset: scheduler preset name currently in force ("" = as the incoming MODEL was patched).
    tiled_vae: encode/decode with ComfyUI's tiled VAE.
    guide_size: side of the square crop that is sampled (pixels, multiple of 8).
    scheduling: token scheduling on (False = tokenfuse patches disabled on a clone).
    single: process faces one at a time (after an OOM on a multi-face batch).
    """

    preset: str = ""
    tiled_vae: bool = False
    guide_size: int = 512
    scheduling: bool = True
    single: bool = False


@dataclass(frozen=True)
class FallbackConfig:
    """mode: which failures trigger fallbacks. stronger_presets: presets the glue can re-patch with (empty when the
    scheduler API is unavailable, so that step is skipped and reported). min_guide: smallest guide size tried.
    incoming_preset: the preset TokenSchedulerController put on the MODEL ("" = unknown: go to the strongest)."""

    mode: FallbackMode = "auto"
    stronger_presets: tuple[str, ...] = ()
    min_guide: int = 256
    incoming_preset: str = ""
    crop_factor: float = 1.0  # with max_size: what side a guide size samples (smaller_guide must shrink it)
    max_size: int = 4096

    @property
    def on_oom(self) -> bool:
        return self.mode in ("auto", "oom-only")

    @property
    def on_artifact(self) -> bool:
        return self.mode in ("auto", "artifacts-only")


def stronger_preset(current: str, available: tuple[str, ...]) -> str | None:
    """The next preset stronger than `current` among `available`, or None ("stronger" = later in
    scheduling/vocabulary.PRESET_ORDER; unknown names count as the weakest).

    current "" (the incoming MODEL's schedule is unknown) gives the strongest available, which is at least as strong
    as anything the controller could have attached."""
    rank: dict[str, int] = {name: i for i, name in enumerate(PRESET_ORDER)}
    if current == "":
        known = sorted((rank[p], p) for p in available if p in rank and rank[p] > 0)
        return known[-1][1] if known else None
    cur = rank.get(current, 0)
    better = sorted((rank[p], p) for p in available if p in rank and rank[p] > cur)
    return better[0][1] if better else None


def after_oom(
    attempt: Attempt, config: FallbackConfig, batch_size: int = 1
) -> tuple[Attempt, FallbackAction, str] | None:
    """Next attempt after an out-of-memory error on a batch of `batch_size` faces: (attempt, action, detail), or None
    (give up: the faces pass through)."""
    if not config.on_oom:
        return None
    if batch_size > 1 and not attempt.single:
        return replace(attempt, single=True), "split_batch", f"batch of {batch_size} -> one face at a time"
    if attempt.scheduling:
        nxt = stronger_preset(attempt.preset or config.incoming_preset, config.stronger_presets)
        if nxt is not None:
            return replace(attempt, preset=nxt), "stronger_preset", f"preset {attempt.preset or 'input'} -> {nxt}"
    if not attempt.tiled_vae:
        why = ""
        if attempt.scheduling and not config.stronger_presets:
            why = " (stronger preset skipped: scheduler API unavailable)"
        elif attempt.scheduling:
            why = " (strongest preset already in use)"
        return replace(attempt, tiled_vae=True), "tiled_vae", "tiled VAE encode/decode" + why
    from .crops import context_side

    def side(guide: int) -> int:
        return context_side(guide, config.crop_factor, config.max_size)

    smaller = (attempt.guide_size // 2) // 8 * 8
    while smaller >= config.min_guide and side(smaller) >= side(attempt.guide_size):  # capped by max_size: no smaller
        smaller = (smaller // 2) // 8 * 8
    if smaller >= config.min_guide:
        detail = f"guide {attempt.guide_size} -> {smaller} (sampled side {side(attempt.guide_size)} -> {side(smaller)})"
        return replace(attempt, guide_size=smaller), "smaller_guide", detail
    return None


def after_artifact(attempt: Attempt, config: FallbackConfig) -> tuple[Attempt, FallbackAction, str] | None:
    """Next attempt after a broken output: scheduling off once, else None (pass through)."""
    if not config.on_artifact or not attempt.scheduling:
        return None
    return replace(attempt, scheduling=False), "scheduling_off", "rerun with token scheduling off"


@dataclass
class FaceReport:
    """What happened to one face: the STRING output lists one line per FaceReport.

    context_side: side of the square context crop that was sampled (pixels): guide_size x crop_factor capped at
        max_size, after any smaller_guide fallback. The report line prints it as "guide N" (the text users and
        runner/report.py read is unchanged).
    tokens: top-level U-Net tokens per sampled image ((side/8)^2), kept_tokens: after the plan (None = no plan).
    peak_memory: peak allocated device memory while this face's batch ran, weights included (CUDA; None on CPU).
    """

    frame: int
    index: int
    seed: int
    context_side: int = 0
    tokens: int = 0
    kept_tokens: int | None = None
    time_s: float = 0.0
    peak_memory: int | None = None
    status: FaceStatus = "ok"
    fallbacks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, action: FallbackAction, detail: str) -> None:
        self.fallbacks.append(f"{action}: {detail}")
        if self.status == "ok":
            self.status = "fallback"

    def line(self) -> str:
        mem = "n/a" if self.peak_memory is None else f"{self.peak_memory / 2**20:.0f} MiB"
        kept = "" if self.kept_tokens is None else f" (plan keeps ~{self.kept_tokens})"
        fb = "; ".join(self.fallbacks) if self.fallbacks else "none"
        warn = f" | warnings: {'; '.join(self.warnings)}" if self.warnings else ""
        return (
            f"frame {self.frame} face {self.index}: {self.status}, seed {self.seed}, guide {self.context_side}, "
            f"tokens {self.tokens}{kept}, {self.time_s:.2f} s, peak {mem}, fallbacks: {fb}{warn}"
        )


def format_report(reports: list[FaceReport], header: str = "") -> str:
    """The node's STRING output: a header, one line per face, and a summary line."""
    lines = [header] if header else []
    lines += [r.line() for r in reports]
    n_fb = sum(1 for r in reports if r.fallbacks)
    n_pass = sum(1 for r in reports if r.status == "passthrough")
    total = sum(r.time_s for r in reports)
    lines.append(f"{len(reports)} face(s), {n_fb} with fallbacks, {n_pass} passed through, {total:.2f} s total")
    return "\n".join(lines)
