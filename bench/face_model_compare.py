"""Two sets of face-model weights side by side (baseline = the committed ones): is a newly trained model better?

    python bench/face_model_compare.py --new DIR [--old DIR] --faces HELDOUT_DIR [--size 256] [--limit N]

Runs in plain torch (face_model/torch_*.py, equal to ComfyUI's classes: tests/integration/
test_torch_face_model.py), no ComfyUI needed. Per weights set:
- VAE reconstruction PSNR (dB, mean and 5th percentile) on held-out photos aligned like the training data (RetinaFace,
  FFHQ template at --size px), the face region only (the template's face ellipse);
- on the astronaut (tests/test_quality_gate.py's face and settings: guide 256, 8 steps, denoise 0.45): PSNR of the
  unscheduled output vs the input face, `balanced` vs unscheduled, and self-attention's weight in the output: PSNR of
  a run with every attn1 output zeroed vs the unscheduled run (lower = the trained attention matters more, so the
  gate can see attention damage).
Prints one table (old, new) and the ratios, old / new of the error each column measures (>1: the new weights have
less of it): PSNR columns as mean squared errors (10^(dB difference / 10)), SSIM columns as 1 - SSIM; attn_off_psnr
the other way round (new / old error without self-attention: >1 = the new model's attention matters more); the step
counts get none. Attention backend: PyTorch SDPA in plain torch (named in the output).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def face_ellipse(size: int) -> np.ndarray:
    """[S, S] float32 mask of the face in an FFHQ-aligned crop (the astronaut fixture's ellipse, scaled)."""
    import cv2

    m = np.zeros((size, size), np.float32)
    c = size / 512.0
    cv2.ellipse(m, (int(256 * c), int(290 * c)), (int(150 * c), int(190 * c)), 0, 0, 360, 1.0, -1)
    return m


def aligned_faces(folder: Path, size: int, limit: int) -> tuple[list[np.ndarray], list[str]]:
    from tokenfuse.devkit.face_model import data

    paths = data.list_images([folder])
    paths = [p for p in paths if not p.name.startswith("augmented_image")] or paths
    if limit:
        paths = paths[:limit]
    faces, skipped = data.align_folder(paths, size)
    return [f.crop.astype(np.float32) / 255.0 for f in faces], skipped


def vae_psnr(model: Any, faces: list[np.ndarray], mask: np.ndarray) -> tuple[float, float]:
    from tokenfuse.devkit.face_model import quality as q

    vals = []
    for face in faces:
        x = torch.from_numpy(face)[None]
        y = model.vae.decode(model.vae.encode(x))[0].numpy()
        vals.append(q.psnr(y, face, mask))
    return float(np.mean(vals)), float(np.percentile(vals, 5))


def astronaut_numbers(pack: Any, model: Any) -> dict[str, float]:
    from tokenfuse.devkit.face_model import gate
    from tokenfuse.devkit.face_model import quality as q
    from tokenfuse.face_model.torch_sampling import scheduled, with_patches

    photo = gate.astronaut_photo(pack)
    params = q.FusionParams(steps=8, denoise=0.45, guide=256, seed=0)
    base = gate.fuse_torch(pack, model, photo, params)
    bal = gate.compare(gate.fuse_torch(pack, scheduled(model, "balanced"), photo, params), base, photo)
    no_attn = with_patches(model, [], [lambda n, extra: torch.zeros_like(n)])
    zero = gate.compare(gate.fuse_torch(pack, no_attn, photo, params), base, photo)
    return {
        "psnr_vs_input": q.psnr(base.crop, photo.input_crop, photo.mask),
        "balanced_psnr": bal.psnr,
        "balanced_ssim": bal.ssim,
        "attn_off_psnr": zero.psnr,
    }


ATTENTION = "pytorch-sdpa (plain torch)"  # face_model/torch_unet.py: F.scaled_dot_product_attention


def ratios(old: dict[str, Any], new: dict[str, Any]) -> dict[str, float | None]:
    """Per column, old / new of the error it measures (>1: new has less): PSNR as MSE (10^((new - old) / 10)), SSIM
    as 1 - SSIM; attn_off_psnr inverted (>1: without self-attention the new model strays further: its attention
    matters more). None where there is no ratio (step counts, a missing value, an SSIM of 1 in both)."""
    out: dict[str, float | None] = {}
    for key in old:
        a, b = old.get(key), new.get(key)
        if a is None or b is None or key.endswith("_steps"):
            out[key] = None
        elif "ssim" in key:
            out[key] = (1.0 - float(a)) / (1.0 - float(b)) if float(b) < 1.0 else None
        elif key == "attn_off_psnr":
            out[key] = 10.0 ** ((float(a) - float(b)) / 10.0)
        else:
            out[key] = 10.0 ** ((float(b) - float(a)) / 10.0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", required=True, help="folder with the candidate unet.safetensors + vae.safetensors")
    ap.add_argument("--old", default="", help="baseline weights folder (default: the committed weights)")
    ap.add_argument("--faces", required=True, help="held-out face photos")
    ap.add_argument("--size", type=int, default=256, help="aligned crop side for the VAE check")
    ap.add_argument("--limit", type=int, default=0, help="first N photos only (0 = all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vae-only", action="store_true", help="skip the sampling numbers (astronaut)")
    ap.add_argument("--sampling-only", action="store_true", help="skip the VAE reconstruction numbers")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO / "devkit"))
    from pack_loader import load_pack

    pack = load_pack()
    from tokenfuse.face_model.loader import WEIGHTS_DIR
    from tokenfuse.face_model.torch_sampling import load_torch_face_model

    t0 = time.time()
    faces, skipped = ([], []) if args.sampling_only else aligned_faces(Path(args.faces), args.size, args.limit)
    mask = face_ellipse(args.size)
    print(
        f"face model compare: {len(faces)} held-out faces aligned at {args.size} px ({len(skipped)} without a face) | "
        f"attention backend: {ATTENTION} | CPU, torch threads {torch.get_num_threads()}",
        flush=True,
    )
    rows = {}
    for label, folder in (("old", Path(args.old) if args.old else WEIGHTS_DIR), ("new", Path(args.new))):
        model = load_torch_face_model(folder)
        row: dict[str, Any] = {"unet_steps": model.meta.get("unet_steps"), "vae_steps": model.meta.get("vae_steps")}
        if faces:
            row["vae_psnr_mean"], row["vae_psnr_p5"] = vae_psnr(model, faces, mask)
        if not args.vae_only:
            row.update(astronaut_numbers(pack, model))
        rows[label] = row
        print(f"  {label}: {folder} done ({time.time() - t0:.0f} s)", flush=True)
    keys = list(rows["old"])
    print(f"\nold vs new weights, attention backend {ATTENTION}")
    print(f"{'':<16}" + "".join(f"{k:>15}" for k in keys))
    for label, row in rows.items():
        cells = [float("nan") if v is None else float(v) for v in row.values()]
        print(
            f"{label:<16}"
            + "".join(f"{v:>15.4f}" if "ssim" in k else f"{v:>15.2f}" for k, v in zip(keys, cells, strict=True))
        )
    ratio = ratios(rows["old"], rows["new"])
    print(f"{'old/new error':<16}" + "".join(f"{'-' if v is None else f'{v:.2f}x':>15}" for v in ratio.values()))
    print(
        "vae_psnr: reconstruction PSNR (dB) on the face ellipse of held-out faces; psnr_vs_input: the astronaut's "
        "unscheduled output vs its input face; balanced_*: vs unscheduled; attn_off_psnr: every attn1 output zeroed vs "
        "unscheduled (lower = the trained self-attention matters more). Guide 256, 8 steps, denoise 0.45, seed 0. "
        "old/new error: old / new of each column's error (PSNR: mean squared error, SSIM: 1 - SSIM; >1 = the new "
        "weights have less of it); for attn_off_psnr new / old (>1 = the new model's self-attention matters more)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
