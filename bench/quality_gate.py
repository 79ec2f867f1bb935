"""The quality gate's margins on held-out faces: every preset vs deliberately broken patches, CI settings.

    python bench/quality_gate.py --faces DIR [--limit N] [--shard K/N] [--json OUT.json]
    python bench/quality_gate.py --merge A.json B.json [--json OUT.json]
    (--faces astronaut: skimage's astronaut, the CI test's input)

Per photo (its largest face; RetinaFace as in bench/quality.py), on the trained face model in plain torch
(devkit/face_model; bit-identical to ComfyUI on CPU) with the CI test's settings (guide 256, 8 steps, denoise 0.45,
seed 0, cfg 1, euler/normal), for every preset strategy (balanced, lowvram_8gb/6gb/4gb, balanced/tome,
balanced/topk; with and without a crop-space TokenPlan) and every break of devkit/face_model/broken.py:
- image: PSNR of the face vs unscheduled and its MSE as a fraction of the no-self-attention model's (gate <= 0.7);
- attention: structure error (attention_probe.py, measured on the unscheduled trajectory) as a fraction of shuffled
  V's in the same run (gate <= 0.7).
It prints per variant the range over photos and how many pass each part of devkit/face_model/gate.py's gate (every
preset must pass, every break must fail). Attention backend: PyTorch SDPA (plain torch), CPU, 1 thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("balanced/tome", "balanced/topk")


def measure_photo(pack: Any, tm: Any, photo: Any, params: Any) -> dict[str, dict[str, float]]:
    """variant -> {psnr, off_frac, struct, struct_frac} for one photo (the gate's quantities)."""
    from tokenfuse.devkit.face_model import gate
    from tokenfuse.devkit.face_model.attention_probe import patches_of
    from tokenfuse.devkit.face_model.broken import BREAKS, broken_model, broken_patches
    from tokenfuse.face_model.torch_sampling import scheduled
    from tokenfuse.fusion.crops import crop_plan

    models = {p: scheduled(tm, p) for p in gate.PRESETS}
    models.update({s: scheduled(tm, *s.split("/")) for s in STRATEGIES})
    base = gate.fuse_torch(pack, tm, photo, params)
    off = gate.face_mse(gate.fuse_torch(pack, broken_model(tm, "attn_off"), photo, params), base, photo)
    out: dict[str, dict[str, float]] = {}
    plan = crop_plan(photo.mask[None])
    for suffix, token_plan in (("", None), ("+plan", plan)):
        runs = {name: gate.fuse_torch(pack, m, photo, params, token_plan=token_plan) for name, m in models.items()}
        if not suffix:
            runs.update({f"BROKEN {b}": gate.fuse_torch(pack, broken_model(tm, b), photo, params) for b in BREAKS})
        variants = {name: patches_of(m) for name, m in models.items()}
        variants.update({f"BROKEN {b}": broken_patches(tm, b) for b in BREAKS})
        stats, _ = gate.attention_fidelity(pack, tm, photo, params, gate.Probe(variants, token_plan))
        ref = stats["BROKEN v_perm"].structure_error
        for name, s in stats.items():
            row = {"struct": s.structure_error, "struct_frac": s.structure_error / ref}
            if name in runs:
                row["psnr"] = gate.compare(runs[name], base, photo).psnr
                row["off_frac"] = gate.face_mse(runs[name], base, photo) / off
            out[name + suffix] = row
    return out


def summarise(rows: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    from tokenfuse.devkit.face_model import gate

    table = {}
    for name, rs in rows.items():
        s: dict[str, Any] = {"photos": len(rs)}
        for key in ("psnr", "off_frac", "struct", "struct_frac"):
            vals = [r[key] for r in rs if key in r]
            if vals:
                s[key] = [round(min(vals), 3), round(max(vals), 3)]
        s["image_pass"] = sum(1 for r in rs if "off_frac" in r and r["off_frac"] <= gate.GATE_OFF_FRACTION)
        s["attention_pass"] = sum(1 for r in rs if r["struct_frac"] <= gate.GATE_STRUCTURE_FRACTION)
        # the whole gate: the 30 dB (SSIM not recomputed here) + both relative checks
        s["gate_pass"] = sum(
            1
            for r in rs
            if "off_frac" in r
            and r["psnr"] >= gate.GATE_PSNR
            and r["off_frac"] <= gate.GATE_OFF_FRACTION
            and r["struct_frac"] <= gate.GATE_STRUCTURE_FRACTION
        )
        table[name] = s
    return table


def print_table(table: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'variant':<24} {'PSNR dB':>13} {'MSE/no-attn':>13} {'struct err':>13} {'struct/shuffled':>15} "
        f"{'image ok':>8} {'attn ok':>8} {'gate':>6}"
    )

    def rng(v: list[float] | None) -> str:
        return "-" if v is None else f"{v[0]:.2f}-{v[1]:.2f}"

    for name, s in table.items():
        n = s["photos"]
        img = f"{s['image_pass']}/{n}" if "off_frac" in s else "-"
        both = f"{s['gate_pass']}/{n}" if "off_frac" in s else "-"
        attn = f"{s['attention_pass']}/{n}"
        print(
            f"{name:<24} {rng(s.get('psnr')):>13} {rng(s.get('off_frac')):>13} {rng(s.get('struct')):>13} "
            f"{rng(s.get('struct_frac')):>15} {img:>8} {attn:>8} {both:>6}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faces", help="folder of face photos, or 'astronaut'")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--shard", default="", help="K/N: every N-th photo from the K-th (one process per core)")
    ap.add_argument("--json", default="")
    ap.add_argument("--merge", nargs="+", default=[], help="merge the per-photo rows of these JSON files")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "devkit"))
    from pack_loader import load_pack

    pack = load_pack()
    rows: dict[str, list[dict[str, float]]] = {}
    if args.merge:
        for f in args.merge:
            for name, rs in json.loads(Path(f).read_text())["rows"].items():
                rows.setdefault(name, []).extend(rs)
    else:
        if not args.faces:
            ap.error("--faces or --merge")
        torch.set_num_threads(1)
        import tokenfuse.scheduling.calibrate as calibrate
        from tokenfuse.devkit.face_model import gate
        from tokenfuse.devkit.face_model import quality as q
        from tokenfuse.face_model import torch_sampling

        calibrate.PINNED = True  # every level kept, as in the CI test (no timing on a loaded machine)
        tm = torch_sampling.load_torch_face_model()
        params = q.FusionParams(steps=8, denoise=0.45, guide=256, seed=0)
        if args.faces == "astronaut":
            photos: list[Any] = [gate.astronaut_photo(pack)]
        else:
            paths = q.list_photos(Path(args.faces))[: args.limit or None]
            if args.shard:
                k, n = (int(v) for v in args.shard.split("/"))
                paths = paths[k::n]
            photos = []
            for path in paths:
                rgb = q.read_photo(path)
                photo = q.prepare_photo(pack, path.name, rgb, params.crop_size) if rgb is not None else None
                if photo is None:
                    print(f"  {path.name}: no face, skipped", flush=True)
                else:
                    photos.append(photo)
        print(
            f"quality_gate: {len(photos)} photo(s); trained face model ({tm.meta.get('unet_steps')} U-Net steps), "
            "plain torch (SDPA), CPU 1 thread; guide 256, 8 steps, denoise 0.45, seed 0, cfg 1, euler/normal",
            flush=True,
        )
        t0 = time.time()
        for i, photo in enumerate(photos):
            for name, row in measure_photo(pack, tm, photo, params).items():
                rows.setdefault(name, []).append({"photo": photo.name, **row})
            print(f"  [{i + 1}/{len(photos)}] {photo.name} ({time.time() - t0:.0f} s)", flush=True)
    table = summarise(rows)
    print_table(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "rows": rows}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
