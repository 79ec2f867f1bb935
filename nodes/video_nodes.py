"""FaceTrack and VideoFaceFusion: the video path, streamed (thin node classes over video/).

FaceTrack (pass 1) streams the VIDEO once: detection at reduced size, tracks, scene cuts, selection and zero-phase
smoothing; it returns FACE_TRACKS (small arrays, no pixels). VideoFaceFusion (pass 2) streams it again: key-frame
crops are refined in batches through ScheduledFusion's own sampler path (the same fallbacks, identity pre-swap and
model patches), the other frames get the refined change by optical flow, faces are pasted back and the result is
encoded to H.264 with the input's timestamps and audio packets. Neither node ever holds the whole video.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..faces.types import DetectorBackend
from ..scheduling.anchor_mode import AnchorMode, pool_for
from ..video.encode import Preset
from .checks import checked_inputs
from .face_nodes import _BACKEND_TIP, _folders, _reference_embedding, model_stamp
from .glue import env
from .glue import video as video_glue
from .input_specs import build_selection, device_input, identity_inputs, seed_input, selection_inputs
from .model_patching import sampling_series

if TYPE_CHECKING:
    from ..fusion.run import FusionBackend

log = logging.getLogger(__name__)

VideoMode = Literal["keyframes", "per_frame"]
PREVIEW_FRAMES = 6
ANCHOR_DEFAULT: AnchorMode = "off"  # see docs/video.md for the measurement behind the default


def _float(default: float, lo: float, hi: float, step: float, tip: str) -> tuple[str, dict[str, Any]]:
    return ("FLOAT", {"default": default, "min": lo, "max": hi, "step": step, "tooltip": tip})


def _int(default: int, lo: int, hi: int, tip: str, step: int = 1) -> tuple[str, dict[str, Any]]:
    return ("INT", {"default": default, "min": lo, "max": hi, "step": step, "tooltip": tip})


class FaceTrack:
    DESCRIPTION = (
        "Follows faces through a video without loading it into memory: finds them on every frame, links them into "
        "tracks, fills gaps, finds scene cuts, picks faces like FaceDetect and smooths each track so crops do not "
        "shake. Connect its tracks and the same video to VideoFaceFusion."
    )
    CATEGORY = "TokenFuse/video"
    FUNCTION = "track_and_show"
    IS_CHANGED = staticmethod(model_stamp)  # a YuNet file / insightface pack replaced under its name runs it again
    RETURN_TYPES = ("FACE_TRACKS", "IMAGE", "STRING")
    RETURN_NAMES = ("face_tracks", "preview", "report")
    OUTPUT_TOOLTIPS = (
        "The selected, smoothed face tracks of the video (per frame: landmarks, box, aligned-crop transform).",
        f"Up to {PREVIEW_FRAMES} evenly spaced frames with each track's crop square and landmarks drawn.",
        "Frames, scene cuts, tracks found and kept, crop jitter raw -> smoothed, time.",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The video (core Load Video node); streamed, never decoded whole."}),
                "backend": (list(get_args(DetectorBackend)), {"default": "auto", "tooltip": _BACKEND_TIP}),
                **selection_inputs("track"),
                "detect_size": _int(
                    480,
                    0,
                    4096,
                    "Detect on a copy whose long side is at most this (0 = full size). 480 keeps 1080p/4k fast; "
                    "raise it for small faces.",
                    step=32,
                ),
                "smoothing": _float(
                    0.1,
                    0.0,
                    1.0,
                    0.01,
                    "Zero-phase smoothing of each track's alignment, sigma in seconds: 0.05-0.15 removes landmark "
                    "jitter; larger values lag behind fast head motion at the edges. 0 = raw landmarks.",
                ),
                "cut_threshold": _float(
                    0.45,
                    0.05,
                    1.0,
                    0.01,
                    "Scene-cut sensitivity (colour-histogram distance between frames): lower finds more cuts. "
                    "No track or smoothing crosses a cut.",
                ),
                "crop_factor": _float(
                    1.0, 1.0, 4.0, 0.05, "Zoom out around the face in the aligned crop (1 = FFHQ framing)."
                ),
                "device": device_input("track"),
            },
            "optional": identity_inputs("track"),
        }

    @checked_inputs()
    def track(
        self,
        video: Any,
        backend: str,
        score_threshold: float,
        order: str,
        indices: str,
        max_faces: int,
        min_face_size: int,
        detect_size: int,
        smoothing: float,
        cut_threshold: float,
        crop_factor: float,
        device: str,
        model_name: str = "",
        reference_faces: Any = None,
        similarity_threshold: float = 0.3,
    ) -> tuple[Any, Any, str]:
        import numpy as np
        import torch

        from ..faces.analyse import load_backend
        from ..video.decode import probe
        from ..video.preview import draw_tracks, fit_width, preview_indices
        from ..video.track_pass import TrackOptions, track_video
        from ..video.tracks import make_detect

        source = video_glue.stream_source(video)
        info = probe(source)
        reference = None if reference_faces is None else _reference_embedding(reference_faces)
        sel = build_selection(
            order, indices, max_faces, min_face_size, score_threshold, reference, similarity_threshold
        )
        folders, name = _folders(backend, model_name.strip())
        detector, embedder = load_backend(backend, folders, name, device, cancel=env.throw_if_interrupted)  # type: ignore[arg-type]
        if sel.reference is not None and embedder is None:
            raise ValueError(
                "reference_faces need embeddings on the video too: use the insightface backend with a pack that "
                "has a recognition model (w600k_*.onnx)."
            )
        expected = info.frames_expected or 1  # Matroska holds no count: estimated from duration x rate
        wanted = set(preview_indices(expected, PREVIEW_FRAMES))
        kept: dict[int, Any] = {}
        bar = env.progress_bar(expected)
        opts = TrackOptions(
            smooth_seconds=smoothing, cut_threshold=cut_threshold, crop_factor=crop_factor, selection=sel
        )
        tracks = track_video(
            source,
            make_detect(detector, detect_size, score_threshold, embedder),
            opts,
            progress=lambda done, total: bar.update_absolute(done, total or None),
            on_frame=lambda f: kept.__setitem__(f.index, f.rgb) if f.index in wanted else None,
        )
        shots = [fit_width(draw_tracks(kept[i], tracks, i)) for i in sorted(kept)]
        if shots:
            h, w = shots[0].shape[:2]
            shots = [s if s.shape[:2] == (h, w) else np.zeros((h, w, 3), np.uint8) for s in shots]
            preview = torch.from_numpy(np.stack(shots).astype(np.float32) / 255.0)
        else:
            preview = torch.zeros((1, 64, 64, 3))
        report = (
            f"FaceTrack: {tracks.frame_count} frames at {tracks.fps:.3f} fps, {len(tracks.cuts)} scene cut(s), "
            f"{tracks.detections} detections, {len(tracks.tracks)} track(s) kept; crop jitter "
            f"{tracks.raw_jitter:.2f} -> {tracks.smooth_jitter:.2f} px/frame^2; {tracks.seconds:.1f} s"
        )
        for i, tr in enumerate(tracks.tracks):
            report += f"\n  track {i}: frames {tr.start}-{tr.end - 1} ({int(tr.detected.sum())} detected)"
        if not tracks.tracks:
            log.warning("FaceTrack: no face track in %s; VideoFaceFusion will copy it through", tracks.name)
        return tracks, preview, report

    def track_and_show(self, **inputs: Any) -> dict[str, Any]:
        """ComfyUI's entry point: track(), plus its report shown in the node (ui.text, web/tokenfuse_report.js)."""
        result = self.track(**inputs)
        return {"ui": {"text": [result[2]]}, "result": result}


class VideoFaceFusion:
    DESCRIPTION = (
        "Face refine / swap for video: diffuses only key frames of each track (same noise per track, batched across "
        "frames) and carries the change to the other frames with optical flow. Streams any length to H.264 and "
        "keeps frame count, timestamps and audio."
    )
    CATEGORY = "TokenFuse/video"
    FUNCTION = "fuse_and_show"
    RETURN_TYPES = ("VIDEO", "STRING")
    RETURN_NAMES = ("video", "report")
    OUTPUT_TOOLTIPS = (
        "The fused video (H.264 yuv420p MP4 in ComfyUI's temp folder; connect Save Video).",
        "Frames, key frames, flow failures, diffusion runs, time per frame, and ScheduledFusion's warnings.",
    )

    def __init__(
        self,
        backend: FusionBackend | None = None,
        *,
        out_path: str | None = None,
        window: tuple[Any, list[int | None]] | None = None,
    ) -> None:
        """backend: the sampler/VAE calls instead of ComfyUI's (tests, benches with a stand-in sampler).
        out_path: where to write the MP4 (default: a new file in ComfyUI's temp folder, glue.video.output_path()).
        window: (video.chunks.Chunk, every frame's pts) to write only that chunk's frames, video only (the runner's
        chunked `run --ray`, runner/chunk_node.py); the whole video when None.
        ComfyUI makes nodes without arguments, so a workflow always samples through ComfyUI (see ScheduledFusion) and
        writes to the temp folder: none of these is reachable from a prompt (fuse() refuses undeclared inputs)."""
        self.backend = backend
        self.out_path = out_path
        self.window = window

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from .fusion_node import ScheduledFusion

        base = ScheduledFusion.INPUT_TYPES()
        req, opt = base["required"], base["optional"]
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The same VIDEO that went into FaceTrack."}),
                "face_tracks": ("FACE_TRACKS", {"tooltip": "FaceTrack's output for this video."}),
                "model": req["model"],
                "vae": req["vae"],
                "positive": req["positive"],
                "negative": req["negative"],
                "seed": seed_input(
                    "Track i uses seed + i on every one of its frames (the same noise along a track keeps the "
                    "refinement steady)."
                ),
                "steps": req["steps"],
                "cfg": req["cfg"],
                "sampler_name": req["sampler_name"],
                "scheduler": req["scheduler"],
                "denoise": req["denoise"],
                "guide_size": req["guide_size"],
                "faces_per_batch": _int(
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
                "keyframes_per_second": _float(
                    2.0,
                    0.25,
                    30.0,
                    0.25,
                    "Key frames per second per track (1-3 typical); more = closer to per_frame. Key frames come at "
                    "least every 48 frames whatever the rate (the frames between two key frames wait in memory).",
                ),
                "pose_threshold": _float(
                    0.04,
                    0.0,
                    0.5,
                    0.01,
                    "Extra key frame when landmarks in the aligned crop moved this far (fraction of the crop) since "
                    "the last key frame: head turns, mouth opening. 0 = off.",
                ),
                "strength": _float(1.0, 0.0, 1.0, 0.05, "Paste-back opacity of the refined faces."),
                "crf": _int(19, 0, 51, "H.264 quality: 17-20 looks lossless, 23 is x264's default, higher = smaller."),
                "preset": (
                    list(get_args(Preset)),
                    {"default": "medium", "tooltip": "x264 speed/size trade-off (faster = bigger file)."},
                ),
                "fallback": req["fallback"],
            },
            "optional": {
                **{k: opt[k] for k in ("swap_model", "arcface_model", "source_image", "source_faces")},
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

    @checked_inputs("swap_model", "arcface_model")
    def fuse(
        self,
        video: Any,
        face_tracks: Any,
        model: Any,
        vae: Any,
        positive: Any,
        negative: Any,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        denoise: float,
        guide_size: int,
        faces_per_batch: int,
        mode: str,
        keyframes_per_second: float,
        pose_threshold: float,
        strength: float,
        crf: int,
        preset: str,
        fallback: str,
        swap_model: str = "none",
        arcface_model: str = "none",
        source_image: Any = None,
        source_faces: Any = None,
        anchor_attention: str = ANCHOR_DEFAULT,
    ) -> tuple[Any, str]:
        """Writes to the constructor's out_path / window (a temp-folder file, the whole video, under ComfyUI)."""
        from ..faces.paste import BlendOptions
        from ..video.chunks import fuse_chunk
        from ..video.encode import EncodeOptions
        from ..video.fuse_pass import FuseOptions, fuse_video
        from ..video.keyframes import KeyframeOptions
        from ..video.track_pass import FaceTracks
        from .fusion_node import ScheduledFusion

        if not isinstance(face_tracks, FaceTracks):
            raise TypeError(f"face_tracks must be FaceTrack's output, got {type(face_tracks).__name__}")
        source = video_glue.stream_source(video)
        _check_same_video(face_tracks, source)
        size = int(guide_size) // 8 * 8
        notes: list[str] = []
        sf_args = dict(
            model=model,
            vae=vae,
            positive=positive,
            negative=negative,
            seed=0,  # face k of a call gets seed 0 + k: mapped to its track's seed in the sampler below
            steps=steps,
            cfg=cfg,
            sampler_name=sampler_name,
            scheduler=scheduler,
            denoise=denoise,
            guide_size=size,
            max_size=size,
            crop_factor=1.0,  # the tracks' aligned crops already carry their context
            feather=0.04,
            fallback=fallback,
            swap_model=swap_model,
            arcface_model=arcface_model,
            source_image=source_image,
            source_faces=source_faces,
        )
        backend = self.backend
        if backend is None and face_tracks.tracks:
            backend = ScheduledFusion._comfy_backend(  # no bar of its own: the frame bar below is the visible one
                model, vae, positive, negative, steps, cfg, sampler_name, scheduler, denoise, 1, step_bar=False
            )
        anchors = None
        if pool_for(anchor_attention) and face_tracks.tracks:
            from ..scheduling.anchor_attention import AnchorStore

            anchors = AnchorStore(pool=pool_for(anchor_attention))
        refine = make_refine(sf_args, backend, face_tracks.crop_factor, notes, anchors) if face_tracks.tracks else None
        opts = FuseOptions(
            crop_size=size,
            faces_per_batch=int(faces_per_batch),
            seed=int(seed),
            keyframes=KeyframeOptions(
                per_second=0.0 if mode == "per_frame" else float(keyframes_per_second),
                pose_threshold=float(pose_threshold),
            ),
            blend=BlendOptions(strength=float(strength)),
            encode=EncodeOptions(crf=int(crf), preset=preset),  # type: ignore[arg-type]
        )
        bar = env.progress_bar(max(face_tracks.frame_count, 1))
        path, window = self.out_path or video_glue.output_path(), self.window
        fused = refine or (lambda crops, seeds: crops)
        shown = lambda done, total: bar.update_absolute(done, total or None)  # noqa: E731
        # One run for the scheduler's summary: each key-frame batch's sampling line goes to DEBUG, one INFO line and
        # one telemetry file (if the schedule names one) cover the whole video (model_patching.sampling_series).
        series = sampling_series("VideoFaceFusion", env.compute_device(model) if face_tracks.tracks else None)
        try:
            with series:
                if window is None:
                    stats = fuse_video(source, path, face_tracks, fused, opts, progress=shown)
                else:
                    stats = fuse_chunk(source, path, face_tracks, fused, window[0], window[1], opts, progress=shown)
        finally:
            if anchors is not None:
                # The anchors' tokens live on the sampling device (up to ~0.9 GB per track for SD1.5 at 512, `full`)
                # and ComfyUI keeps node instances between prompts (caches.objects): never hold them past the run.
                anchors.tokens.clear()
        self.last_stats = stats  # for bench/video.py
        self.last_anchors = anchors
        report = f"VideoFaceFusion ({mode}, guide {size}): {stats.summary()}"
        w, h = face_tracks.width, face_tracks.height
        if not stats.copied and (w % 2 or h % 2):
            report += (
                f"\nnote: {w}x{h} is odd: written as {w + w % 2}x{h + h % 2} with the edge row/column repeated "
                "(H.264 yuv420p needs even sides; no input pixel is lost)"
            )
        if anchors is not None:
            report += (
                f"\nanchor attention {anchor_attention}: {anchors.anchors} anchor(s), "
                f"{anchors.peak_bytes / 2**20:.1f} MB of anchor tokens held at most"
            )
        if notes:
            report += "\n" + "\n".join(sorted(set(notes)))
        log.debug("%s", report.splitlines()[0])  # the fuse pass logged the INFO summary (names, counts)
        return video_glue.video_output(path, temporary=self.out_path is None), report

    def fuse_and_show(self, **inputs: Any) -> dict[str, Any]:
        """ComfyUI's entry point: fuse(), plus its report shown in the node (ui.text, web/tokenfuse_report.js)."""
        result = self.fuse(**inputs)
        return {"ui": {"text": [result[1]]}, "result": result}


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


def make_refine(
    sf_args: dict[str, Any], backend: Any, crop_factor: float, notes: list[str], anchors: Any = None
) -> Any:
    """refine(crops [N, S, S, 3], seeds) through ScheduledFusion.fuse, one sampler batch for all N crops.

    The N aligned crops (from different frames) are laid side by side in one [1, S, N*S, 3] image with one face
    each whose affine is a plain shift, so ScheduledFusion samples them as one batch of N faces (its fallbacks,
    pre-swap and artifact checks included). Its per-face seeds (0 + face number) are mapped to the tracks' seeds
    inside the sampler call.

    anchors: a scheduling.anchor_attention.AnchorStore (or None): each sampler call then runs on a clone of the
    model with the anchor attn1 patch added last (after TokenFuse's scheduler patches, so it joins to their K/V),
    with the batch items' tracks (their seeds: one per track) made active around the call.
    """
    import numpy as np
    import torch

    from ..faces.align import template
    from ..faces.masks import crop_mask
    from ..faces.types import Face, FaceSet
    from .fusion_node import ScheduledFusion

    inner_sample = backend.sample
    current: list[int] = []

    patched: dict[int, tuple[Any, Any]] = {}  # id(model from model_for) -> (that model, clone with the patch)
    anchor_patch = None
    if anchors is not None:
        from ..scheduling.anchor_attention import build_anchor_patch

        anchor_patch = build_anchor_patch(anchors)

    def sample(m: Any, latent: Any, mask: Any, seeds: list[int], plan: Any) -> Any:
        track_seeds = [current[int(s)] for s in seeds]
        if anchors is None:
            return inner_sample(m, latent, mask, track_seeds, plan)
        if id(m) not in patched or patched[id(m)][0] is not m:
            clone = m.clone()
            clone.set_model_attn1_patch(anchor_patch)
            patched[id(m)] = (m, clone)
        anchors.begin(track_seeds)
        ok = False
        try:
            out = inner_sample(patched[id(m)][1], latent, mask, track_seeds, plan)
            ok = True
            return out
        finally:
            anchors.end(ok)

    backend = replace(backend, sample=sample)  # the backend is frozen: a copy with the seed-mapping sampler
    node = ScheduledFusion(backend)
    masks: dict[int, np.ndarray] = {}

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        n, s = int(crops.shape[0]), int(crops.shape[1])
        if s not in masks:
            masks[s] = crop_mask(template(s, crop_factor), s)
        lm = template(s, crop_factor).astype(np.float32)
        faces = tuple(
            Face(
                bbox=(float(k * s), 0.0, float((k + 1) * s), float(s)),
                score=1.0,
                landmarks=lm + np.array([k * s, 0], np.float32),
                affine=np.array([[1.0, 0.0, -k * s], [0.0, 1.0, 0.0]]),
                inverse=np.array([[1.0, 0.0, k * s], [0.0, 1.0, 0.0]]),
                crop_size=s,
                mask=masks[s],
            )
            for k in range(n)
        )
        mosaic = torch.from_numpy(np.ascontiguousarray(np.concatenate(list(crops), axis=1))[None])
        current[:] = [int(x) for x in seeds]
        out, _, report = node.fuse(image=mosaic, faces=FaceSet((s, n * s), (faces,)), faces_per_batch=n, **sf_args)
        notes.extend(line.strip() for line in report.splitlines()[1:] if "passthrough" in line or "warn" in line)
        return out.detach().float().cpu().numpy()

    return refine


NODE_CLASS_MAPPINGS = {"TokenFuseFaceTrack": FaceTrack, "TokenFuseVideoFaceFusion": VideoFaceFusion}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseFaceTrack": "FaceTrack", "TokenFuseVideoFaceFusion": "VideoFaceFusion"}
