"""Chunking a ComfyUI video workflow under `run --ray`: which prompts can be chunked, the driver's track pass from
the prompt's FaceTrack widgets, and the per-chunk prompt the workers run (no ComfyUI, no Ray imported here).

A video workflow (LoadVideo -> FaceTrack -> VideoFaceFusion -> SaveVideo) is chunked like `run --engine core`
(runner/core/video.py): the driver runs the track pass once over the whole video with FaceTrack's own widgets
(video.track_pass, the same code FaceTrack runs, so the driver needs no ComfyUI), plans time chunks
(video.chunks.plan_chunks) and sends each worker a prompt made of VideoFaceFusion's ancestors with FaceTrack gone
and VideoFaceFusion replaced by the runner-only chunk node (runner/ray/chunk_node.py): the model, VAE, conditioning and
sampler widgets stay as the workflow has them. The driver joins the chunk files in order and copies the audio once.

Chunking applies only where its result can equal a one-worker run frame for frame; otherwise the item runs whole
on one worker and its report row says why (`route`):
- exactly one FaceTrack and one VideoFaceFusion, FaceTrack's tracks going only to it, both reading the item's
  LoadVideo; the fused VIDEO going only to SaveVideo nodes that copy it (format and codec "auto");
- FaceTrack's detector needs no model folder (auto, retinaface, mtcnn) and no reference_faces input (those need
  ComfyUI's model folders or upstream nodes the driver does not have);
- anchor_attention "off" (an anchor is a track's first key frame: a chunk without it would attend to another one).
In chunked mode `faces_per_batch` is set to 1: batched sampling differs from per-crop sampling in the last float
bits (measured 5e-7 on the trained face model) and chunk boundaries change which crops
share a batch, so only per-crop sampling makes the result independent of the chunk plan. A one-worker run with
faces_per_batch 1 gives the same frames; with the workflow's faces_per_batch 2 they differ only by that rounding.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...video.encode import output_suffix

if TYPE_CHECKING:
    from ...video.track_pass import FaceTracks

log = logging.getLogger("tokenfuse.runner")

TRACK_CLASS = "TokenFuseFaceTrack"
FUSION_CLASS = "TokenFuseVideoFaceFusion"
SAVE_CLASS = "SaveVideo"
CHUNK_CLASS = "TokenFuseRunnerVideoChunk"  # runner-only (runner/ray/chunk_node.py), never in NODE_CLASS_MAPPINGS
DRIVER_BACKENDS = ("auto", "retinaface", "mtcnn")  # detectors the driver loads without ComfyUI's model folders


@dataclass(frozen=True)
class VideoGraph:
    """The node ids chunking rewrites: the item's LoadVideo, FaceTrack, VideoFaceFusion and its SaveVideo nodes."""

    load: str
    track: str
    fusion: str
    saves: tuple[str, ...]


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def _consumers(prompt: dict[str, dict[str, Any]], nid: str, slot: int | None = None) -> list[tuple[str, str]]:
    """(node id, input name) of every input linked to node nid's output `slot` (any slot when None)."""
    return [
        (other, name)
        for other, node in prompt.items()
        for name, value in node["inputs"].items()
        if _is_link(value) and value[0] == nid and (slot is None or int(value[1]) == slot)
    ]


def ancestors(prompt: dict[str, dict[str, Any]], nid: str) -> set[str]:
    """nid and every node it depends on through links."""
    seen: set[str] = set()
    todo = [nid]
    while todo:
        cur = todo.pop()
        if cur in seen or cur not in prompt:
            continue
        seen.add(cur)
        todo += [v[0] for v in prompt[cur]["inputs"].values() if _is_link(v)]
    return seen


def find_video_graph(prompt: dict[str, dict[str, Any]], slot: str) -> VideoGraph | str:
    """The graph to chunk, or the reason this prompt runs whole (module docstring). slot: the item's LoadVideo."""
    tracks = [n for n, v in prompt.items() if v["class_type"] == TRACK_CLASS]
    fusions = [n for n, v in prompt.items() if v["class_type"] == FUSION_CLASS]
    if len(tracks) != 1 or len(fusions) != 1:
        return f"{len(tracks)} FaceTrack and {len(fusions)} VideoFaceFusion nodes (chunking needs one of each)"
    track, fusion = tracks[0], fusions[0]
    ti, fi = prompt[track]["inputs"], prompt[fusion]["inputs"]
    if fi.get("face_tracks") != [track, 0] or ti.get("video") != [slot, 0] or fi.get("video") != [slot, 0]:
        return "FaceTrack and VideoFaceFusion do not both read the item's LoadVideo, tracks into fusion"
    if [c for c in _consumers(prompt, track, 0) if c != (fusion, "face_tracks")]:
        return "FaceTrack's tracks go to other nodes too"
    if ti.get("backend") not in DRIVER_BACKENDS:
        return f"FaceTrack backend {ti.get('backend')!r} needs ComfyUI's model folders (driver: {DRIVER_BACKENDS})"
    linked = sorted(k for k, v in ti.items() if _is_link(v) and k != "video")
    if linked:
        return f"FaceTrack input(s) {linked} come from other nodes (the driver runs FaceTrack's widgets only)"
    if fi.get("anchor_attention", "off") != "off":
        return "anchor_attention is on (a chunk without a track's first key frame would attend to another anchor)"
    linked = sorted(k for k in ("mode", "keyframes_per_second", "pose_threshold", "guide_size") if _is_link(fi.get(k)))
    if linked:
        return f"VideoFaceFusion input(s) {linked} come from other nodes (the chunk plan needs their values)"
    saves = []
    for other, _ in _consumers(prompt, fusion, 0):
        node = prompt[other]
        if node["class_type"] != SAVE_CLASS:
            return f"the fused video goes to {node['class_type']} (node {other}), not only to SaveVideo"
        if node["inputs"].get("format", "auto") != "auto" or node["inputs"].get("codec", "auto") != "auto":
            return f"SaveVideo node {other} re-encodes (format/codec not auto)"
        saves.append(other)
    if not saves:
        return "the fused video is not saved (no SaveVideo)"
    return VideoGraph(slot, track, fusion, tuple(sorted(saves)))


def track_widgets(prompt: dict[str, dict[str, Any]], graph: VideoGraph) -> dict[str, Any]:
    """FaceTrack's widget values (every input but the video)."""
    return {k: v for k, v in prompt[graph.track]["inputs"].items() if k != "video"}


def fuse_options(prompt: dict[str, dict[str, Any]], graph: VideoGraph) -> Any:
    """The video.fuse_pass.FuseOptions parts the chunk plan depends on (key frames, as VideoFaceFusion sets them:
    a chunk's context frames are its tracks' neighbouring key frames)."""
    from ...video.fuse_pass import FuseOptions
    from ...video.keyframes import KeyframeOptions

    fi = prompt[graph.fusion]["inputs"]
    per_frame = fi.get("mode", "keyframes") == "per_frame"
    return FuseOptions(
        crop_size=int(fi.get("guide_size", 512)) // 8 * 8,
        keyframes=KeyframeOptions(
            per_second=0.0 if per_frame else float(fi.get("keyframes_per_second", 2.0)),
            pose_threshold=float(fi.get("pose_threshold", 0.04)),
        ),
    )


def chunk_prompt(prompt: dict[str, dict[str, Any]], graph: VideoGraph, job: str) -> dict[str, dict[str, Any]]:
    """The prompt a worker runs for one chunk: VideoFaceFusion's ancestors without FaceTrack, VideoFaceFusion
    replaced by the chunk node (its other inputs kept, faces_per_batch 1, `job` naming the worker-side chunk)."""
    keep = ancestors(prompt, graph.fusion) - {graph.track}
    out = {nid: copy.deepcopy(prompt[nid]) for nid in sorted(keep)}
    node = out[graph.fusion]
    inputs = {k: v for k, v in node["inputs"].items() if k != "face_tracks"}
    inputs.update(faces_per_batch=1, job=job)
    out[graph.fusion] = {"class_type": CHUNK_CLASS, "inputs": inputs, "_meta": {"title": "video chunk (runner)"}}
    return out


def joined_metadata(prompt: dict[str, dict[str, Any]], names: dict[str, str]) -> dict[str, str]:
    """The joined file's container tags: what ComfyUI's SaveVideo writes for the workflow ("prompt": the prompt as
    run, JSON), with the loaders bound to the input files' names (loader node id -> file name), not the chunk prompt
    the workers ran. A UI workflow's "workflow" tag is not written: the runner never passes one, in any mode."""
    import json

    from ..run import bind

    return {"prompt": json.dumps(bind(prompt, names))}


def output_name(prompt: dict[str, dict[str, Any]], graph: VideoGraph, item_name: str) -> str:
    """The joined file's name: SaveVideo's first file name for a plain prefix (`<prefix>_00001_.mp4`, as a
    one-worker run names it), else `<item>_fused.mp4`."""
    prefix = str(prompt[graph.saves[0]]["inputs"].get("filename_prefix", ""))
    stem = Path(prefix).name
    if not stem or "%" in prefix:
        return f"{item_name}_fused{output_suffix()}"
    return f"{stem}_00001_.mp4"


def driver_tracks(path: Path, widgets: dict[str, Any], threads: int = 1) -> tuple[FaceTracks, list[int | None]]:
    """FaceTrack's track pass over the whole video with its widgets, without ComfyUI: the tracks and every frame's
    pts. torch runs at `threads` threads meanwhile (the workers' share): detections then match a worker's FaceTrack
    to the last bit (float results differ between thread counts)."""
    import torch

    from ...faces.analyse import load_backend
    from ...faces.select import Selection, parse_indices
    from ...video.track_pass import TrackHooks, TrackOptions, track_video
    from ...video.tracks import make_detect

    idx = parse_indices(str(widgets.get("indices", "")))
    sel = Selection(
        order=widgets.get("order", "large-small"),
        indices=None if idx is None else tuple(idx),
        max_faces=int(widgets.get("max_faces", 0)),
        min_size=float(widgets.get("min_face_size", 0)),
        score_threshold=float(widgets.get("score_threshold", 0.5)),
        reference=None,
        similarity_threshold=float(widgets.get("similarity_threshold", 0.3)),
    )
    opts = TrackOptions(
        smooth_seconds=float(widgets.get("smoothing", 0.1)),
        cut_threshold=float(widgets.get("cut_threshold", 0.45)),
        crop_factor=float(widgets.get("crop_factor", 1.0)),
        selection=sel,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        detector, _ = load_backend(widgets.get("backend", "auto"), [], device=widgets.get("device", "cpu"))
        detect = make_detect(detector, int(widgets.get("detect_size", 480)), sel.score_threshold, None)
        pts: list[int | None] = []
        tracks = track_video(path, detect, opts, TrackHooks(on_frame=lambda f: pts.append(f.pts)))
    finally:
        torch.set_num_threads(before)
    return tracks, pts
