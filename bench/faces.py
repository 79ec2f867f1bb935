"""Per-frame face pipeline cost on 720p and 1080p frames: detect + align (warp crop) + paste back, per backend.

Baseline = detection at full frame size; ours = detection at a reduced size (long side `--detect-size`, boxes mapped
back). Both run in the same process on the same frames (insightface's t1.jpg with 6 real faces, or the
one-face astronaut, fitted into each size), pinned to `--cores` CPU cores. Prints median milliseconds over
`--repeats` runs and the ratio.

    python bench/faces.py --repeats 10                       # full table (target: <= 60 ms per 720p frame)
    python bench/faces.py --repeats 1 --sizes 720p --backends retinaface   # smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

SIZES = {"720p": (720, 1280), "1080p": (1080, 1920)}


def _frame(h: int, w: int, photo: str):
    """A real photo fitted into an h x w frame (aspect kept, borders replicated). t1: 6 faces; astronaut: 1 face."""
    import cv2
    import numpy as np

    if photo == "astronaut":
        from skimage.data import astronaut

        img = astronaut()
    else:
        spec = importlib.util.find_spec("insightface")
        if spec is None:
            raise SystemExit("needs the insightface wheel for t1.jpg: pip install --no-deps insightface==2.1")
        img = cv2.imread(str(Path(next(iter(spec.submodule_search_locations))) / "data/images/t1.jpg"))[..., ::-1]
    s = min(h / img.shape[0], w / img.shape[1])
    nh, nw = round(img.shape[0] * s), round(img.shape[1] * s)
    img = cv2.resize(np.ascontiguousarray(img), (nw, nh), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)
    top, left = (h - nh) // 2, (w - nw) // 2
    return cv2.copyMakeBorder(img, top, h - nh - top, left, w - nw - left, cv2.BORDER_REPLICATE)


def _backends(names: list[str], assets: Path, tmp: Path) -> dict:
    from tokenfuse.faces.analyse import load_backend

    out = {}
    for name in names:
        if name in ("retinaface", "mtcnn", "auto"):
            out[name] = load_backend(name, [])[0]
        elif name == "yunet":
            out[name] = load_backend("yunet", [assets], "face_detection_yunet_2026may.onnx")[0]
        elif name == "insightface":
            pack = tmp / "models" / "bench"
            pack.mkdir(parents=True, exist_ok=True)
            shutil.copy(assets / "scrfd_500m_bnkps.onnx", pack / "det_500m.onnx")
            out[name] = load_backend("insightface", [tmp], "bench")[0]
    return out


def _time_ms(fn, repeats: int) -> float:
    fn()  # warm-up (session init, allocator)
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--detect-size", type=int, default=640)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--backends", nargs="+", default=["retinaface", "yunet", "insightface"])
    ap.add_argument("--photo", default="t1", choices=["t1", "astronaut"], help="t1: 6 faces; astronaut: 1 face")
    ap.add_argument("--assets", type=Path, default=REPO.parent / "shared" / "assets")
    args = ap.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.cores))
    import cv2
    import numpy as np

    cv2.setNumThreads(args.cores)
    load_pack()
    from tokenfuse.faces.align import warp_face
    from tokenfuse.faces.analyse import AlignOptions, FaceFinder, faces_for_frame
    from tokenfuse.faces.paste import paste_frame
    from tokenfuse.faces.select import Selection

    sel, align = Selection(order="left-right"), AlignOptions()
    with tempfile.TemporaryDirectory() as tmp:
        dets = _backends(args.backends, args.assets, Path(tmp))
        print(
            f"photo={args.photo} cores={args.cores} repeats={args.repeats} detect_size={args.detect_size} "
            "(median ms per frame)"
        )
        print(
            f"{'backend':12} {'size':6} {'faces':>5} {'detect full':>11} {'detect ours':>11} {'align':>6} "
            f"{'paste':>6} {'total full':>10} {'total ours':>10} {'speed-up':>8}"
        )
        for size in args.sizes:
            rgb = _frame(*SIZES[size], args.photo)
            frame = rgb.astype(np.float32) / 255
            for name, det in dets.items():
                full_finder = FaceFinder(det, None, sel, align, 0)
                finder = FaceFinder(det, None, sel, align, args.detect_size)
                full = _time_ms(lambda: faces_for_frame(rgb, full_finder), args.repeats)  # noqa: B023
                ours = _time_ms(lambda: faces_for_frame(rgb, finder), args.repeats)  # noqa: B023
                faces = faces_for_frame(rgb, finder)
                crops = []

                def align_all(frame=frame, faces=faces, crops=crops):  # bound now, not at loop end
                    crops[:] = [f.with_crop(warp_face(frame, f.affine, f.crop_size)) for f in faces]

                t_align = _time_ms(align_all, args.repeats)
                t_paste = _time_ms(lambda: paste_frame(frame, tuple(crops)), args.repeats)  # noqa: B023
                tf, to = full + t_align + t_paste, ours + t_align + t_paste
                print(
                    f"{name:12} {size:6} {len(faces):5d} {full:11.1f} {ours:11.1f} {t_align:6.1f} {t_paste:6.1f} "
                    f"{tf:10.1f} {to:10.1f} {tf / to:7.2f}x"
                )


if __name__ == "__main__":
    main()
