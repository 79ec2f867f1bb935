"""Quality of every TokenFuse preset on the project's trained face model (devkit/face_model), real ScheduledFusion.

    python bench/quality.py --faces DIR --json OUT.json [--presets off,balanced,lowvram_8gb,lowvram_6gb,lowvram_4gb]
        [--strategies preset] [--steps 20 --denoise 0.45 --guide 512] [--comfyui PATH] [--limit N]
        [--backend comfy|torch] [--shard K/N] [--compile BACKEND]
    then: python bench/quality.py --merge A.json B.json --json OUT.json

For every photo in DIR (any size; its largest face is used) it runs ScheduledFusion in-process through ComfyUI's
sampler (masked denoise, seed fixed, cfg 1, euler/normal, fallback off) on the trained model unscheduled, then on
TokenSchedulerController's clone per preset (x strategy), and compares the aligned face crops:
PSNR / SSIM vs the unscheduled output (mean, 5th percentile), dlib identity distance of output to input face (mean,
worst; skipped with a note without dlib-bin + face-recognition-models), the PSNR drop vs the input face compared with
the unscheduled run, and the U-Net time ratio (unscheduled / preset, wall time inside the U-Net forward).
JSON: {"presets": {name: {psnr_mean, psnr_p5, ssim_mean, ssim_p5, id_dist_mean, id_dist_max, speed_ratio, ...}},
"faces": N, "gate": per variant the image gate and the article's claim, "gate_checks": what that image gate checks
(the output image only: the attention probe is bench/quality_gate.py's), "rows": per-photo values, "artifacts": the
artifact check on every output + injected failures, and
"wrong_identity": another person's face pasted into each unscheduled output, FP/TP of the check's opt-in structure
rule (and with dlib its dlib rule, and both) (devkit/face_model/identity_check.py)}. The comfy backend (default) needs
ComfyUI: --comfyui or COMFYUI_PATH; --backend torch runs the same node code on the plain-torch model (bit-identical
on CPU, no ComfyUI). --shard K/N splits the photos over processes (a shared CPU: one thread each); --merge recomputes
the table from their JSON. --compile BACKEND adds each scheduled variant run under ComfyUI's TorchCompileModel
("<variant>+compile"), compared with the same eager unscheduled output.
Attention backend: PyTorch SDPA (named in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
ALL_PRESETS = "off,balanced,lowvram_8gb,lowvram_6gb,lowvram_4gb"
# What the table's "image gate" column (the JSON's gate.<variant>.gate) checks, and what it does not; in the JSON too.
GATE_CHECKS = (
    "image gate: the output image only (means vs unscheduled: PSNR >= 30 dB, SSIM >= 0.95, id distance <= "
    "unscheduled + 0.05); no attention probe here: a break only devkit/face_model/gate.py's attention check catches "
    "(bench/quality_gate.py, tests/test_quality_gate.py) still reads pass"
)


def save_strip(path: Path, crops: list[np.ndarray]) -> None:
    """[S, S, 3] 0..1 crops side by side as one PNG (input, unscheduled, then the variants in order)."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    strip = (np.concatenate(crops, axis=1) * 255).round().clip(0, 255).astype(np.uint8)
    cv2.imwrite(str(path), np.ascontiguousarray(strip[..., ::-1]))


def print_table(summary: dict[str, dict], verdict: dict[str, dict]) -> None:
    header = (
        f"{'variant':<22} {'PSNR mean':>9} {'PSNR p5':>8} {'SSIM mean':>9} {'SSIM p5':>8} {'dPSNR(in)':>9} "
        f"{'id mean':>8} {'id max':>7} {'U-Net x':>8}  image gate  article"
    )
    print(header)

    def f(v: float | None, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    for name, s in summary.items():
        g = verdict[name]
        print(
            f"{name:<22} {s['psnr_mean']:>9.2f} {s['psnr_p5']:>8.2f} {s['ssim_mean']:>9.4f} {s['ssim_p5']:>8.4f} "
            f"{s['psnr_in_drop_mean']:>9.2f} {f(s['id_dist_mean'], '.3f'):>8} {f(s['id_dist_max'], '.3f'):>7} "
            f"{f(s['speed_ratio'], '.2f'):>8}  {'pass' if g['gate'] else 'FAIL':<10}  "
            f"{'met' if g['article'] else 'not met'}"
        )
    print(
        "PSNR/SSIM vs the unscheduled output over the face mask (100 dB = identical); dPSNR(in) = PSNR vs the input "
        "face lost compared with the unscheduled run; id = dlib distance output->input (same person < 0.6); "
        f"U-Net x = unscheduled U-Net time / this variant's. {GATE_CHECKS}. article: dPSNR <= 1.5 dB and "
        "SSIM >= 0.92."
    )


def print_artifacts(artifacts: dict) -> None:
    print(
        f"artifact check (fusion/artifacts.py defaults) on {artifacts['good_outputs']} real outputs: "
        f"{artifacts['false_positives']} false positive(s); injected failures caught: {artifacts['true_positives']}; "
        f"good-output stat ranges {artifacts['good_stat_range']}"
    )


def print_identity(section: dict | None) -> None:
    if section:
        from tokenfuse.devkit.face_model import identity_check

        print("artifact check, wrong identity (structure; dlib when installed):")
        print(identity_check.table(section))


def identity_section(raw: dict) -> dict:
    """The JSON's artifacts.wrong_identity: the summary at the check's thresholds + the raw scores."""
    from tokenfuse.devkit.face_model import identity_check
    from tokenfuse.fusion.artifacts import STRUCTURE_FLOOR, ArtifactThresholds

    # the structure rule at its opt-in floor (off in the default thresholds)
    t = ArtifactThresholds()
    return {**identity_check.summarise(raw, t.max_identity_distance_dlib, STRUCTURE_FLOOR), "raw": raw}


def merge(paths: list[str], out_path: str) -> int:
    """Combine the JSON of runs over disjoint photo sets (--shard) into one: summaries recomputed from the rows."""
    sys.path.insert(0, str(REPO / "devkit"))
    from pack_loader import load_pack

    load_pack()
    from tokenfuse.devkit.face_model import quality as q

    parts = [json.loads(Path(p).read_text()) for p in paths]
    rows: dict[str, list] = {}
    unet_s: dict[str, float] = {}
    for part in parts:
        for name, r in part["rows"].items():
            rows.setdefault(name, []).extend(r)
            unet_s[name] = unet_s.get(name, 0.0) + part["unet_s"][name]
    summary = {
        name: q.summarise(r, rows["unscheduled"], unet_s[name], unet_s["unscheduled"]) for name, r in rows.items()
    }
    verdict = q.gate(summary)
    art = [p["artifacts"] for p in parts]
    artifacts = {
        **art[0],
        "good_outputs": sum(a["good_outputs"] for a in art),
        "false_positives": sum(a["false_positives"] for a in art),
        "true_positives": {
            k: f"{sum(int(a['true_positives'][k].split('/')[0]) for a in art)}/{sum(a['good_outputs'] for a in art)}"
            for k in art[0]["true_positives"]
        },
        "good_stat_range": {
            k: [min(a["good_stat_range"][k][0] for a in art), max(a["good_stat_range"][k][1] for a in art)]
            for k in art[0]["good_stat_range"]
        },
    }
    if all("wrong_identity" in a for a in art):
        raw = {k: [r for a in art for r in a["wrong_identity"]["raw"][k]] for k in art[0]["wrong_identity"]["raw"]}
        artifacts["wrong_identity"] = identity_section(raw)
    out = {
        **parts[0],
        "presets": summary,
        "gate": verdict,
        "gate_checks": GATE_CHECKS,
        "artifacts": artifacts,
        "faces": sum(p["faces"] for p in parts),
        "photos": [n for p in parts for n in p["photos"]],
        "skipped": [n for p in parts for n in p["skipped"]],
        "rows": rows,
        "unet_s": unet_s,
        "merged_from": paths,
    }
    print(f"quality: merged {len(paths)} run(s), {out['faces']} photo(s); settings {out['settings']}")
    print_table(summary, verdict)
    print_artifacts(artifacts)
    print_identity(artifacts.get("wrong_identity"))
    Path(out_path).write_text(json.dumps(out, indent=2))
    print(f"wrote {out_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faces", help="folder of face photos (one main face each)")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--presets", default=ALL_PRESETS)
    ap.add_argument("--strategies", default="preset", help="comma list: preset (the preset's own), todo, tome, topk")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--denoise", type=float, default=0.45)
    ap.add_argument("--guide", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="use only the first N photos (0 = all)")
    ap.add_argument("--shard", default="", help="K/N: only photos K, K+N, K+2N ... (0-based; merge with --merge)")
    ap.add_argument("--merge", nargs="+", default=[], help="combine the JSON files of --shard runs into --json")
    ap.add_argument(
        "--backend",
        choices=["comfy", "torch"],
        default="comfy",
        help="comfy: ComfyUI's sampler and VAE in-process (needs --comfyui); torch: the same node code with the "
        "plain-torch model (face_model/torch_*.py, equal to ComfyUI's: tests/integration/"
        "test_torch_face_model.py), no ComfyUI needed",
    )
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", ""), help="ComfyUI checkout")
    ap.add_argument("--weights", default="", help="face model folder (default: the committed weights)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy shared CPU)")
    ap.add_argument("--save", default="", help="folder for per-photo PNG strips: input | unscheduled | each variant")
    ap.add_argument(
        "--compile",
        default="",
        metavar="BACKEND",
        help="also run every scheduled variant under ComfyUI's TorchCompileModel with this dynamo backend (eager, "
        "inductor) as '<variant>+compile' (comfy backend; a dynamo reset before each compiled run, so their U-Net x "
        "includes compiling: quality only)",
    )
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.json)
    if not args.faces:
        ap.error("--faces is required (unless --merge)")
    if args.compile and args.backend != "comfy":
        ap.error("--compile needs the comfy backend (TorchCompileModel is ComfyUI's)")
    if args.backend == "comfy" and not args.comfyui:
        ap.error("the comfy backend needs ComfyUI: pass --comfyui PATH or set COMFYUI_PATH (or use --backend torch)")
    torch.set_num_threads(args.threads)
    for p in (str(REPO / "devkit"),):
        if p not in sys.path:
            sys.path.insert(0, p)
    import comfy_models
    from pack_loader import load_pack

    if args.backend == "comfy":
        comfy_models.setup_comfy(args.comfyui, cpu=True, sdpa=True)
        import comfy.utils

        comfy.utils.PROGRESS_BAR_ENABLED = False
    pack = load_pack()
    from tokenfuse.devkit.face_model import identity_check
    from tokenfuse.devkit.face_model import quality as q

    weights = Path(args.weights) if args.weights else None
    params = q.FusionParams(steps=args.steps, denoise=args.denoise, guide=args.guide, seed=args.seed)
    variants: list[tuple[str, str, str]] = []
    for preset in [s.strip() for s in args.presets.split(",") if s.strip()]:
        for strat in [s.strip() for s in args.strategies.split(",") if s.strip()]:
            variants.append((preset if strat == "preset" else f"{preset}/{strat}", preset, strat))
    if args.backend == "comfy":
        from tokenfuse.face_model import loader

        fm = loader.load_face_model(weights)
        cond = fm.conditioning()
        meta, attention = fm.meta, comfy_models.attention_backend()
        base_model: object = fm.model
        models = {name: q.scheduled(pack, fm.model, preset, strat) for name, preset, strat in variants}
        if args.compile:
            for name, preset, strat in list(variants):
                variants.append((f"{name}+compile", preset, strat))
                models[f"{name}+compile"] = comfy_models.torch_compiled(models[name], args.compile)

        def run(model: object, photo: q.Photo) -> q.FaceRun:
            if args.compile:
                torch._dynamo.reset()  # compiled variants share the U-Net's code: one dynamo cache and recompile limit
            return q.fuse(pack, q.ComfyStack(model, fm.vae, cond), photo, params, fm.model)

    else:
        from tokenfuse.devkit.face_model import gate
        from tokenfuse.face_model import torch_sampling

        tm = torch_sampling.load_torch_face_model(weights)
        meta, attention = tm.meta, "pytorch-sdpa (plain torch)"
        base_model = tm
        models = {name: torch_sampling.scheduled(tm, preset, strat) for name, preset, strat in variants}

        def run(model: object, photo: q.Photo) -> q.FaceRun:
            # U-Net time = the whole node call here (VAE included), a coarser ratio than the comfy backend's
            return gate.fuse_torch(pack, model, photo, params)  # type: ignore[arg-type]

    ident, id_note = q.identity_backend()
    paths = q.list_photos(Path(args.faces))
    if args.limit:
        paths = paths[: args.limit]
    if args.shard:
        k, n = (int(v) for v in args.shard.split("/"))
        paths = paths[k::n]
    print(
        f"quality: {len(paths)} photo(s) in {args.faces}; trained face model ({meta.get('unet_steps')} U-Net "
        f"steps); backend {args.backend}; guide {args.guide}, steps {args.steps}, denoise {args.denoise}, seed "
        f"{args.seed}, cfg 1, euler/normal; CPU {platform.processor() or platform.machine()}, {args.threads} threads, "
        f"attention {attention}; {id_note}",
        flush=True,
    )
    rows: dict[str, list[dict[str, float]]] = {"unscheduled": [], **{v[0]: [] for v in variants}}
    unet_s = dict.fromkeys(rows, 0.0)
    used, skipped = [], []
    good: list[tuple[np.ndarray, np.ndarray]] = []  # every output, for the artifact-check calibration
    id_items: list = []  # every output with its input face, for the wrong-identity calibration
    t0 = time.time()
    for i, path in enumerate(paths):
        rgb = q.read_photo(path)
        photo = q.prepare_photo(pack, path.name, rgb, params.crop_size) if rgb is not None else None
        if photo is None:
            skipped.append(path.name)
            print(f"  [{i + 1}/{len(paths)}] {path.name}: no face, skipped", flush=True)
            continue
        used.append(path.name)
        base = run(base_model, photo)
        runs = {"unscheduled": base}
        for name, _, _ in variants:
            runs[name] = run(models[name], photo)
        in_emb = ident.embed(photo.input_crop) if ident else None
        if args.save:
            save_strip(Path(args.save) / f"{path.stem}.png", [photo.input_crop] + [r.crop for r in runs.values()])
        for name, face_run in runs.items():
            unet_s[name] += face_run.unet_s
            good.append((face_run.crop, photo.mask))
            id_items.append(identity_check.IdentityItem(path.name, name, photo.input_crop, face_run.crop, photo.mask))
            row = {
                "photo": path.name,
                "psnr": q.psnr(face_run.crop, base.crop, photo.mask),
                "ssim": q.ssim(face_run.crop, base.crop, photo.mask),
                "psnr_in": q.psnr(face_run.crop, photo.input_crop, photo.mask),
                "id_dist": float(np.linalg.norm(ident.embed(face_run.crop) - in_emb)) if ident else None,
            }
            rows[name].append(row)
        b = rows["balanced"][-1] if "balanced" in rows else None
        extra = f", balanced PSNR {b['psnr']:.1f} dB SSIM {b['ssim']:.3f}" if b else ""
        print(f"  [{i + 1}/{len(paths)}] {path.name}{extra} ({time.time() - t0:.0f} s)", flush=True)
    if not used:
        print("quality: no photo with a detectable face", file=sys.stderr)
        return 2
    summary = {
        name: q.summarise(r, rows["unscheduled"], unet_s[name], unet_s["unscheduled"]) for name, r in rows.items()
    }
    verdict = q.gate(summary)
    print_table(summary, verdict)
    artifacts = q.artifact_calibration(good, args.seed)
    print_artifacts(artifacts)
    if id_items:
        artifacts["wrong_identity"] = identity_section(identity_check.measure(id_items, ident))
        print_identity(artifacts["wrong_identity"])
    out = {
        "presets": summary,
        "artifacts": artifacts,
        "faces": len(used),
        "gate": verdict,
        "gate_checks": GATE_CHECKS,
        "skipped": skipped,
        "identity": id_note,
        "settings": {
            "steps": args.steps,
            "denoise": args.denoise,
            "guide": args.guide,
            "seed": args.seed,
            "cfg": 1.0,
            "sampler": "euler",
            "scheduler": "normal",
            "backend": args.backend,
            "attention": attention,
            "device": "cpu",
            "threads": args.threads,
            "model": {k: meta.get(k) for k in ("unet_steps", "vae_steps", "seed")},
        },
        "photos": used,
        "rows": rows,
        "unet_s": unet_s,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
