"""One video fusion run (VideoFaceFusion's body, and the runner's chunk node's): a function module, not a node.

Key-frame crops go straight to the fusion core's crop-batch entry (fusion.refine.refine_crops) through a backend
(ComfyUI's, nodes/glue/fusion_backend.py, unless one is injected), with the same fallbacks, identity pre-swap and
artifact checks a photo gets; video.fuse_pass / video.chunks stream, propagate, paste and encode. With anchor
attention each sampler call runs on a clone of the model carrying the anchor attn1 patch (scheduling/
anchor_attention.py). The path of a frame stays in video/ + fusion/ + the backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..scheduling.anchor_mode import AnchorMode, pool_for
from ..video.encode import Preset
from .glue import env
from .glue import video as video_glue
from .input_specs import (
    diffusion_links,
    fallback_input,
    float_input,
    guide_size_input,
    int_input,
    sampler_inputs,
    seed_input,
    swap_inputs,
)
from .model_patching import sampling_series

if TYPE_CHECKING:
    from ..fusion.backend import FusionBackend
    from ..video.fuse_pass import Refine

log = logging.getLogger(__name__)

VideoMode = Literal["keyframes", "per_frame"]
ANCHOR_DEFAULT: AnchorMode = "off"  # see docs/video.md for the measurement behind the default
Window = tuple[Any, list[int | None]]  # (video.chunks.Chunk, every frame's pts): write only that chunk, video only


def input_types() -> dict[str, Any]:
    """VideoFaceFusion's INPUT_TYPES (the runner's chunk node takes the same, with its job instead of face_tracks)."""
    links, sampler = diffusion_links(), sampler_inputs()
    return {
        "required": {
            "video": ("VIDEO", {"tooltip": "The same VIDEO that went into FaceTrack."}),
            "face_tracks": ("FACE_TRACKS", {"tooltip": "FaceTrack's output for this video."}),
            **links,
            "seed": seed_input(
                "Track i uses seed + i on every one of its frames (the same noise along a track keeps the "
                "refinement steady)."
            ),
            **sampler,
            "guide_size": guide_size_input(),
            "faces_per_batch": int_input(
                2, 1, 16, "Key-frame crops sampled together, across frames (2-3 fit 6-8 GB at 512 with scheduling)."
            ),
            "mode": (
                list(get_args(VideoMode)),
                {
                    "default": "keyframes",
                    "tooltip": "keyframes: diffuse key frames, propagate the rest by optical flow (>= 5x fewer "
                    "diffusion runs at 2/s on 30 fps). per_frame: diffuse every frame.",
                },
            ),
            "keyframes_per_second": float_input(
                2.0,
                0.25,
                30.0,
                0.25,
                "Key frames per second per track (1-3 typical); more = closer to per_frame. Key frames come at "
                "least every 48 frames whatever the rate (the frames between two key frames wait in memory).",
            ),
            "pose_threshold": float_input(
                0.04,
                0.0,
                0.5,
                0.01,
                "Extra key frame when landmarks in the aligned crop moved this far (fraction of the crop) since "
                "the last key frame: head turns, mouth opening. 0 = off.",
            ),
            "strength": float_input(1.0, 0.0, 1.0, 0.05, "Paste-back opacity of the refined faces."),
            "crf": int_input(19, 0, 51, "H.264 quality: 17-20 looks lossless, 23 is x264's default, higher = smaller."),
            "preset": (
                list(get_args(Preset)),
                {"default": "medium", "tooltip": "x264 speed/size trade-off (faster = bigger file)."},
            ),
            "fallback": fallback_input(),
        },
        "optional": {
            **swap_inputs(),
            "anchor_attention": (
                list(get_args(AnchorMode)),
                {
                    "default": ANCHOR_DEFAULT,
                    "tooltip": "Cross-frame attention: each key frame of a track also attends to the tokens of "
                    "the track's first key frame (its anchor) in every self-attention layer and step, so the "
                    "refinement stays alike along the track. full: anchor tokens as they are (attention keys 2x, "
                    "memory for all layers and steps of one anchor per track); pooled: 2x2-pooled (keys 1.25x, "
                    "a quarter of that memory). off: each batch on its own.",
                },
            ),
        },
    }


@dataclass(frozen=True)
class VideoWidgets:
    """VideoFaceFusion's widgets, converted once (the keyword inputs ComfyUI passes)."""

    seed: int
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    denoise: float
    guide_size: int
    faces_per_batch: int
    mode: str
    keyframes_per_second: float
    pose_threshold: float
    strength: float
    crf: int
    preset: str
    fallback: str
    anchor_attention: str = ANCHOR_DEFAULT

    @property
    def size(self) -> int:
        """The aligned crop side, sampled as it is (a multiple of 8)."""
        return int(self.guide_size) // 8 * 8

    def fusion_widgets(self) -> Any:
        """The crop loop's widgets: every crop sampled at its own side (guide = max size, no added context; the
        tracks' crops already carry it), feather 0.04, the sampler's widgets as given."""
        from .fusion_settings import FusionWidgets

        return FusionWidgets.from_inputs(
            seed=0,  # unused: every crop comes with its track's seed
            steps=self.steps,
            cfg=self.cfg,
            sampler_name=self.sampler_name,
            scheduler=self.scheduler,
            denoise=self.denoise,
            guide_size=self.size,
            max_size=self.size,
            crop_factor=1.0,
            feather=0.04,
            faces_per_batch=self.faces_per_batch,
            fallback=self.fallback,
        )

    def fuse_options(self) -> Any:
        """video.fuse_pass.FuseOptions of these widgets."""
        from ..faces.paste import BlendOptions
        from ..video.encode import EncodeOptions
        from ..video.fuse_pass import FuseOptions
        from ..video.keyframes import KeyframeOptions

        return FuseOptions(
            crop_size=self.size,
            faces_per_batch=int(self.faces_per_batch),
            seed=int(self.seed),
            keyframes=KeyframeOptions(
                per_second=0.0 if self.mode == "per_frame" else float(self.keyframes_per_second),
                pose_threshold=float(self.pose_threshold),
            ),
            blend=BlendOptions(strength=float(self.strength)),
            encode=EncodeOptions(crf=int(self.crf), preset=self.preset),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class VideoLinks:
    """The linked inputs of a video fusion run (ComfyUI objects or the runner's)."""

    video: Any
    face_tracks: Any
    model: Any
    vae: Any
    positive: Any
    negative: Any
    source_image: Any = None
    source_faces: Any = None


@dataclass
class VideoFusionResult:
    path: str
    stats: Any  # video.fuse_pass.VideoStats
    report: str
    anchors: Any  # scheduling.anchor_attention.AnchorStore or None


def split_inputs(**inputs: Any) -> tuple[VideoLinks, VideoWidgets, str, str]:
    """(links, widgets, swap_model, arcface_model) from VideoFaceFusion's keyword inputs."""
    link_names = ("video", "face_tracks", "model", "vae", "positive", "negative", "source_image", "source_faces")
    links = VideoLinks(**{k: inputs[k] for k in link_names if k in inputs})
    swap_model, arcface_model = inputs.get("swap_model", "none"), inputs.get("arcface_model", "none")
    widgets = VideoWidgets(**{k: v for k, v in inputs.items() if k not in link_names + ("swap_model", "arcface_model")})
    return links, widgets, swap_model, arcface_model


def with_anchors(backend: FusionBackend, anchors: Any) -> FusionBackend:
    """The backend whose sampler runs each call on a clone of its model with the anchor attn1 patch added last (after
    TokenFuse's scheduler patches, so it joins their K/V), the batch's tracks (their seeds: one per track) made
    active around the call. One clone per model the fallbacks hand out."""
    from ..scheduling.anchor_attention import build_anchor_patch

    inner_sample = backend.sample
    anchor_patch = build_anchor_patch(anchors)
    patched: dict[int, tuple[Any, Any]] = {}  # id(model from model_for) -> (that model, clone with the patch)

    def sample(m: Any, latent: Any, mask: Any, seeds: list[int], plan: Any) -> Any:
        if id(m) not in patched or patched[id(m)][0] is not m:
            clone = m.clone()
            clone.set_model_attn1_patch(anchor_patch)
            patched[id(m)] = (m, clone)
        anchors.begin(seeds)
        ok = False
        try:
            out = inner_sample(patched[id(m)][1], latent, mask, seeds, plan)
            ok = True
            return out
        finally:
            anchors.end(ok)

    return replace(backend, sample=sample)


class StepRelay:
    """The sampler's per-step callback for the video path: forwards each step to the `tick` the fuse pass handed the
    refine call now running (video/progress.py), so the frame bar moves while a key-frame batch diffuses."""

    def __init__(self) -> None:
        self.tick: Callable[[], None] | None = None

    def __call__(self, done: int, total: int) -> None:
        if self.tick is not None:
            self.tick()


def crop_refine(
    settings: Any, backend: FusionBackend, crop_factor: float, notes: list[str], relay: StepRelay | None = None
) -> Refine:
    """video.fuse_pass.Refine over fusion.refine.refine_crops: the N crops of a call are one sampler batch; the
    report lines of crops that passed through or warned are added to `notes`. relay: the backend's per-step
    callback, pointed at the call's `tick` while it runs."""
    from ..fusion.refine import refine_crops

    def refine(crops: Any, seeds: list[int], *, tick: Callable[[], None] | None = None) -> Any:
        batch = replace(settings, faces_per_batch=max(1, int(crops.shape[0])))
        if relay is not None:
            relay.tick = tick
        try:
            out, reports = refine_crops(crops, [int(s) for s in seeds], batch, backend, crop_factor)
        finally:
            if relay is not None:
                relay.tick = None
        lines = (r.line().strip() for r in reports)
        notes.extend(line for line in lines if "passthrough" in line or "warn" in line)
        return out

    return refine


def _check_same_video(tracks: Any, source: Any) -> None:
    """ValueError unless `source` is the video FaceTrack made `tracks` from (size, header frame count, codec, first
    frame): tracks of another clip would paste faces where that clip had them, silently, or fail deep in the writer."""
    if not tracks.source:
        return  # tracks made in code (tests, the runner's own)
    from ..video.decode import probe

    info = probe(source)
    if info.fingerprint == tracks.source:
        return
    seen = f"{info.width}x{info.height}, {info.frame_count or 'unknown'} frames"
    made = f"{tracks.width}x{tracks.height}, {tracks.frame_count} frames"
    raise ValueError(
        f"VideoFaceFusion: face_tracks were made from another video ({made}) than the connected VIDEO ({seen}"
        f"{', another first frame' if seen == made else ''}): connect the same VIDEO to FaceTrack and VideoFaceFusion"
    )


def _fusion_backend(
    links: VideoLinks,
    widgets: VideoWidgets,
    swap: tuple[str, str],
    backend: FusionBackend | None,
    anchors: Any,
) -> tuple[Any, FusionBackend, StepRelay]:
    """(crop-loop settings, the backend the crops sample through, the relay its sampler steps reach the frame bar
    by): ComfyUI's unless one is given, with the anchor patch (when anchors), the denoise-0 shortcut (no sampling, no
    VAE) and the identity hooks, in that order."""
    from ..fusion.backend import unsampled
    from .glue.fusion_backend import ComfyInputs, comfy_backend
    from .identity import setup_swap
    from .model_patching import attempt_models

    relay = StepRelay()
    fw = widgets.fusion_widgets()
    settings = fw.settings_for(links.model)
    if backend is None:  # no bar of its own: the frame bar is the visible one, moved per step through `relay`
        m = links.model
        inputs = ComfyInputs(m, links.vae, links.positive, links.negative)
        backend = comfy_backend(inputs, fw.sampler_args(), 1, attempt_models(m), step_bar=relay)
    if anchors is not None:
        backend = with_anchors(backend, anchors)
    if fw.denoise <= 0.0:
        backend = unsampled(backend)
    backend, _ = setup_swap(backend, swap[0], swap[1], links.source_image, links.source_faces)
    return settings, backend, relay


def fuse_video_run(  # noqa: PLR0913 - TEMPORARY: runner/chunk_node.py calls it positionally; bundle with the runner rework
    links: VideoLinks,
    widgets: VideoWidgets,
    swap: tuple[str, str],
    backend: FusionBackend | None,
    out_path: str,
    window: Window | None = None,
) -> VideoFusionResult:
    """Fuse the tracked faces of `links.video` into an MP4 at out_path (the whole video, or only `window`'s chunk).

    swap: (swap_model, arcface_model) names in models/insightface ("none" = off). backend: None = ComfyUI's sampler
    on links.model / vae / conditioning (nodes/glue/fusion_backend.py).
    """
    from ..video.chunks import fuse_chunk
    from ..video.fuse_pass import FuseJob, fuse_video
    from ..video.track_pass import FaceTracks

    tracks = links.face_tracks
    if not isinstance(tracks, FaceTracks):
        raise TypeError(f"face_tracks must be FaceTrack's output, got {type(tracks).__name__}")
    from .identity import check_swap_models

    check_swap_models(*swap)  # before streaming: a missing file stops the run at once
    source = video_glue.stream_source(links.video)
    _check_same_video(tracks, source)
    notes: list[str] = []
    anchors = None
    refine: Refine = lambda crops, seeds: crops  # noqa: E731 - no track: the video is copied through
    if tracks.tracks:
        if pool_for(widgets.anchor_attention):
            from ..scheduling.anchor_attention import AnchorStore

            anchors = AnchorStore(pool=pool_for(widgets.anchor_attention))
        settings, fused_backend, relay = _fusion_backend(links, widgets, swap, backend, anchors)
        refine = crop_refine(settings, fused_backend, tracks.crop_factor, notes, relay)
    opts = widgets.fuse_options()
    bar = env.progress_bar(max(tracks.frame_count, 1))
    shown = lambda done, total: bar.update_absolute(done, total or None)  # noqa: E731
    # One run for the scheduler's summary: each key-frame batch's sampling line goes to DEBUG, one INFO line and
    # one telemetry file (if the schedule names one) cover the whole video (model_patching.sampling_series).
    series = sampling_series("VideoFaceFusion", env.compute_device(links.model) if tracks.tracks else None)
    try:
        with series:
            if window is None:
                stats = fuse_video(source, out_path, FuseJob(tracks, refine, opts, shown))
            else:
                stats = fuse_chunk(source, out_path, FuseJob(tracks, refine, opts, shown), window[0], window[1])
    finally:
        if anchors is not None:
            # The anchors' tokens live on the sampling device (up to ~0.9 GB per track for SD1.5 at 512, `full`)
            # and ComfyUI keeps node instances between prompts (caches.objects): never hold them past the run.
            anchors.tokens.clear()
    report = _report(widgets, tracks, stats, anchors, notes)
    log.debug("%s", report.splitlines()[0])  # the fuse pass logged the INFO summary (names, counts)
    return VideoFusionResult(out_path, stats, report, anchors)


def _report(widgets: VideoWidgets, tracks: Any, stats: Any, anchors: Any, notes: list[str]) -> str:
    report = f"VideoFaceFusion ({widgets.mode}, guide {widgets.size}): {stats.summary()}"
    w, h = tracks.width, tracks.height
    if not stats.copied and (w % 2 or h % 2):
        report += (
            f"\nnote: {w}x{h} is odd: written as {w + w % 2}x{h + h % 2} with the edge row/column repeated "
            "(H.264 yuv420p needs even sides; no input pixel is lost)"
        )
    if anchors is not None:
        report += (
            f"\nanchor attention {widgets.anchor_attention}: {anchors.anchors} anchor(s), "
            f"{anchors.peak_bytes / 2**20:.1f} MB of anchor tokens held at most"
        )
    if notes:
        report += "\n" + "\n".join(sorted(set(notes)))
    return report
