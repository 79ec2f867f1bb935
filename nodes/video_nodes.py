"""FaceTrack and VideoFaceFusion: the video path, streamed (thin node classes over video/).

FaceTrack (pass 1) streams the VIDEO once: detection at reduced size, tracks, scene cuts, selection and zero-phase
smoothing; it returns FACE_TRACKS (small arrays, no pixels). VideoFaceFusion (pass 2) streams it again: key-frame
crops are refined in batches through the fusion core's crop-batch entry (the same fallbacks, identity pre-swap and
model patches as ScheduledFusion; nodes/video_fusion.py), the other frames get the refined change by optical flow,
faces are pasted back and the result is encoded to H.264 with the input's timestamps and audio packets. Neither node
ever holds the whole video.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, get_args

from ..faces.types import DetectorBackend
from . import video_fusion
from .checks import checked_inputs, model_names_valid
from .detector_inputs import BACKEND_TIP, detector_folders, model_stamp, reference_embedding
from .glue import env
from .glue import video as video_glue
from .input_specs import SelectionWidgets, device_input, float_input, identity_inputs, int_input, selection_inputs
from .video_fusion import ANCHOR_DEFAULT

if TYPE_CHECKING:
    from ..fusion.backend import FusionBackend

log = logging.getLogger(__name__)

PREVIEW_FRAMES = 6


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
                "backend": (list(get_args(DetectorBackend)), {"default": "auto", "tooltip": BACKEND_TIP}),
                **selection_inputs("track"),
                "detect_size": int_input(
                    480,
                    0,
                    4096,
                    "Detect on a copy whose long side is at most this (0 = full size). 480 keeps 1080p/4k fast; "
                    "raise it for small faces.",
                    step=32,
                ),
                "smoothing": float_input(
                    0.1,
                    0.0,
                    1.0,
                    0.01,
                    "Zero-phase smoothing of each track's alignment, sigma in seconds: 0.05-0.15 removes landmark "
                    "jitter; larger values lag behind fast head motion at the edges. 0 = raw landmarks.",
                ),
                "cut_threshold": float_input(
                    0.45,
                    0.05,
                    1.0,
                    0.01,
                    "Scene-cut sensitivity (colour-histogram distance between frames): lower finds more cuts. "
                    "No track or smoothing crosses a cut.",
                ),
                "crop_factor": float_input(
                    1.0, 1.0, 4.0, 0.05, "Zoom out around the face in the aligned crop (1 = FFHQ framing)."
                ),
                "device": device_input("track"),
            },
            "optional": identity_inputs("track"),
        }

    @checked_inputs()
    def track(  # noqa: PLR0913 - ComfyUI passes each INPUT_TYPES input as a keyword
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
        from ..video.track_pass import TrackHooks, TrackOptions, track_video
        from ..video.tracks import make_detect

        source = video_glue.stream_source(video)
        info = probe(source)
        reference = None if reference_faces is None else reference_embedding(reference_faces)
        widgets = SelectionWidgets(order, indices, max_faces, min_face_size, score_threshold, similarity_threshold)
        sel = widgets.selection(reference)
        folders, name = detector_folders(backend, model_name.strip())
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
            TrackHooks(
                progress=lambda done, total: bar.update_absolute(done, total or None),
                on_frame=lambda f: kept.__setitem__(f.index, f.rgb) if f.index in wanted else None,
            ),
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
        window: (video.chunks.Chunk, every frame's pts) to write only that chunk's frames, video only; the whole
        video when None (the runner's chunk node calls nodes/video_fusion.py itself).
        ComfyUI makes nodes without arguments, so a workflow always samples through ComfyUI (see ScheduledFusion) and
        writes to the temp folder: none of these is reachable from a prompt (fuse() refuses undeclared inputs)."""
        self.backend = backend
        self.out_path = out_path
        self.window = window

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return video_fusion.input_types()

    @classmethod
    def VALIDATE_INPUTS(cls, swap_model: str = "none", arcface_model: str = "none") -> bool | str:  # noqa: N802
        """As ScheduledFusion's: a missing ONNX file stops the run with the pack's message."""
        return model_names_valid(swap_model=swap_model, arcface_model=arcface_model)

    @checked_inputs("swap_model", "arcface_model")
    def fuse(  # noqa: PLR0913 - ComfyUI passes each INPUT_TYPES input as a keyword
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
        links = video_fusion.VideoLinks(video, face_tracks, model, vae, positive, negative, source_image, source_faces)
        widgets = video_fusion.VideoWidgets(
            seed=seed,
            steps=steps,
            cfg=cfg,
            sampler_name=sampler_name,
            scheduler=scheduler,
            denoise=denoise,
            guide_size=guide_size,
            faces_per_batch=faces_per_batch,
            mode=mode,
            keyframes_per_second=keyframes_per_second,
            pose_threshold=pose_threshold,
            strength=strength,
            crf=crf,
            preset=preset,
            fallback=fallback,
            anchor_attention=anchor_attention,
        )
        path = self.out_path or video_glue.output_path()
        run = video_fusion.fuse_video_run(links, widgets, (swap_model, arcface_model), self.backend, path, self.window)
        self.last_stats, self.last_anchors = run.stats, run.anchors  # for bench/video.py and the tests
        return video_glue.video_output(path, temporary=self.out_path is None), run.report

    def fuse_and_show(self, **inputs: Any) -> dict[str, Any]:
        """ComfyUI's entry point: fuse(), plus its report shown in the node (ui.text, web/tokenfuse_report.js)."""
        result = self.fuse(**inputs)
        return {"ui": {"text": [result[1]]}, "result": result}


NODE_CLASS_MAPPINGS = {"TokenFuseFaceTrack": FaceTrack, "TokenFuseVideoFaceFusion": VideoFaceFusion}
# "video" finds both (after ComfyUI's two Video*CFGGuidance nodes, which its search ranks first by use count)
NODE_DISPLAY_NAME_MAPPINGS = {
    "TokenFuseFaceTrack": "Video FaceTrack",
    "TokenFuseVideoFaceFusion": "Video Face Refine / Swap / Detailer (VideoFaceFusion)",
}
