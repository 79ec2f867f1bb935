"""Where each model file the pack's nodes name comes from: one table for the messages and the workflows.

A missing model must stop a run with a message that names the file, the folder it goes in and where to get it
(nodes/glue/paths.model_path puts `get_it(name)` into its not-found message). The example workflows carry the same
URLs in their `models` metadata (ComfyUI's missing-models dialog); tests/test_workflows.py checks that the two agree.
Pure: no ComfyUI import.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import YUNET_2023MAR


@dataclass(frozen=True)
class ModelSource:
    """A downloadable model file (or a pack of files).

    name: the file name the nodes and workflows use. folder: where it goes, relative to ComfyUI's models folder.
    url: a public download address. note: what it is and its licence, one short phrase.
    """

    name: str
    folder: str
    url: str
    note: str


INSIGHTFACE_LICENCE = "insightface model, non-commercial research use only"

SOURCES: dict[str, ModelSource] = {
    s.name: s
    for s in (
        ModelSource(
            "inswapper_128.onnx",
            "insightface",
            "https://huggingface.co/datasets/Gourieff/ReActor/resolve/main/models/inswapper_128.onnx",
            f"the face swap model ({INSIGHTFACE_LICENCE})",
        ),
        ModelSource(
            "w600k_r50.onnx",
            "insightface",
            "https://github.com/deepinsight/insightface/releases/download/v0.7/buffalo_l.zip",
            f"ArcFace recognition, inside buffalo_l.zip ({INSIGHTFACE_LICENCE})",
        ),
        ModelSource(
            "buffalo_l",
            "insightface/models",
            "https://github.com/deepinsight/insightface/releases/download/v0.7/buffalo_l.zip",
            f"the insightface detection + recognition pack: unzip it into a buffalo_l folder ({INSIGHTFACE_LICENCE})",
        ),
        ModelSource(
            "GFPGANv1.4.pth",
            "facerestore_models",
            "https://github.com/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth",
            "GFPGAN v1.4 face restoration, Apache-2.0",
        ),
        ModelSource(
            YUNET_2023MAR.name,
            "facedetection",
            YUNET_2023MAR.url,
            "OpenCV zoo YuNet face detector, MIT (backend yunet downloads it by itself)",
        ),
    )
}


def get_it(name: str, folder: str) -> str:
    """One sentence saying where model `name` goes (models/<folder>) and where to download it: the known address for
    the files in SOURCES (by file name, any subfolder), else a pointer to the workflow's Note and NODES.md. An unknown
    name is not echoed: the sentence is the same for every such name, so the message says nothing of which paths
    exist (the existence oracle the security tests check)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    source = SOURCES.get(base)
    if source is None:
        return (
            f"Put the file in ComfyUI's models/{folder} folder (the workflow's Note and NODES.md say where to get the "
            "pack's models), then press R in ComfyUI to refresh the lists."
        )
    return (
        f"Download {source.name} ({source.note}) from {source.url} into ComfyUI's models/{source.folder} folder, "
        "then press R in ComfyUI to refresh the lists."
    )
