"""Train the project's small face latent-diffusion model (data prep -> VAE -> latents -> U-Net -> export).

Run with a Python that has ComfyUI's requirements (ComfyUI's classes build the networks):
    python devkit/face_model/train.py prep   --comfyui /path/to/ComfyUI --images DIR [DIR ...] --out WORK
    python devkit/face_model/train.py vae    --comfyui ... --out WORK --minutes 20
    python devkit/face_model/train.py latents --comfyui ... --out WORK
    python devkit/face_model/train.py unet   --comfyui ... --out WORK --minutes 60
    python devkit/face_model/train.py export --comfyui ... --out WORK --dest face_model/weights
    python devkit/face_model/train.py all --tiny ...   # smoke run of every stage in about a minute
Seeded and single-process; every stage logs its loss to WORK/<stage>_log.csv and writes a checkpoint every
--ckpt-minutes, so a stopped run still leaves a usable model. Stages stop at --steps or --minutes, whichever first.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger("tokenfuse.face_model.train")
REPO = Path(__file__).resolve().parents[2]


def _setup(comfyui: str, threads: int) -> Any:
    """Import ComfyUI (CPU, SDPA) and the pack as `tokenfuse`; returns the face_model package."""
    torch.set_num_threads(threads)
    for p in (str(REPO / "devkit"),):
        if p not in sys.path:
            sys.path.insert(0, p)
    import comfy_models  # devkit/comfy_models.py
    from pack_loader import load_pack  # devkit/pack_loader.py

    comfy_models.setup_comfy(comfyui, cpu=True, sdpa=True)
    load_pack()
    import tokenfuse.devkit.face_model as fm

    return fm


def _log_row(path: Path, row: dict[str, Any]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def _resume(args: argparse.Namespace, out: Path, stage: str, log: Path) -> tuple[int, float]:
    """(steps, seconds) already trained when --resume continues a stage's checkpoint, else (0, 0) and a fresh log."""
    state = out / f"{stage}_state.json"
    if args.resume and state.exists() and (out / f"{stage}_ckpt.safetensors").exists():
        done = json.loads(state.read_text())
        logger.info(f"{stage}: resuming after {done['steps']} steps ({done['seconds']} s)")
        return int(done["steps"]), float(done["seconds"])
    log.unlink(missing_ok=True)
    return 0, 0.0


# --------------------------------------------------------------------------------------------------------- prep
def cmd_prep(args: argparse.Namespace) -> None:
    import cv2

    cv2.setNumThreads(1)
    from tokenfuse.devkit.face_model import data

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = data.list_images(Path(p) for p in args.images)
    if args.tiny:
        paths = paths[:24]
    t0 = time.time()

    def progress(i: int, n: int) -> None:
        if i % 50 == 0 or i == n:
            logger.info(f"prep {i}/{n} ({time.time() - t0:.0f} s)")

    faces, skipped = data.align_folder(paths, args.size, progress)
    train = [f for f in faces if not data.is_held_out(f.name)]
    held = [f for f in faces if data.is_held_out(f.name)]
    np.save(out / "train_faces.npy", np.stack([f.crop for f in train]))
    (out / "train_names.txt").write_text("\n".join(f.name for f in train) + "\n")
    (out / "heldout_names.txt").write_text("\n".join(f.name for f in held) + "\n")
    (out / "skipped_names.txt").write_text("\n".join(skipped) + "\n")
    src = {p.name: p for p in paths}
    copies = data.near_copies(
        {f.name: data.difference_hash(rgb) for f in held if (rgb := data.read_rgb(src[f.name])) is not None},
        {f.name: data.difference_hash(rgb) for f in train if (rgb := data.read_rgb(src[f.name])) is not None},
    )
    (out / "heldout_near_copies.txt").write_text("".join(f"{h}\t{t}\n" for h, t in sorted(copies.items())))
    held_dir = out / "heldout"
    held_dir.mkdir(exist_ok=True)
    for f in held:  # the original photos: bench/quality.py takes photos, not crops; near copies of training kept out
        if f.name in copies:  # also out of a folder an earlier prep filled (before near copies were found)
            (held_dir / f.name).unlink(missing_ok=True)
        else:
            (held_dir / f.name).write_bytes(src[f.name].read_bytes())
    logger.info(
        f"prep: {len(paths)} photos, {len(train)} train faces, {len(held)} held-out ({len(copies)} of them near copies "
        f"of training photos, left out of {held_dir}), {len(skipped)} without a face"
    )


# ---------------------------------------------------------------------------------------------------------- VAE
def _downscale(faces: np.ndarray) -> np.ndarray:
    """uint8 faces [N, S, S, 3] at S/2 (area filter): the whole-face scale the U-Net trains on."""
    import cv2

    s = faces.shape[1] // 2
    return np.stack([cv2.resize(f, (s, s), interpolation=cv2.INTER_AREA) for f in faces])


def _batch_images(faces: np.ndarray, idx: np.ndarray, crop: int, gen: np.random.Generator) -> torch.Tensor:
    """[B, 3, crop, crop] in [-1, 1]: random crops with random horizontal flips of uint8 faces [N, S, S, 3]."""
    s = faces.shape[1]
    out = np.empty((len(idx), crop, crop, 3), np.uint8)
    for j, i in enumerate(idx):
        y, x = gen.integers(0, s - crop + 1, 2)
        im = faces[i, y : y + crop, x : x + crop]
        out[j] = im[:, ::-1] if gen.random() < 0.5 else im
    return torch.from_numpy(out).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def _vae_forward(vae: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(reconstruction, KL per element) through AutoencoderKL's own encoder/quant_conv/decoder, sampling z."""
    moments = vae.quant_conv(vae.encoder(x))
    mean, logvar = moments.chunk(2, dim=1)
    logvar = logvar.clamp(-30.0, 20.0)
    z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
    rec = vae.decoder(vae.post_quant_conv(z))
    kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar)
    return rec, kl.mean()


def _grad_l1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """L1 of image gradients: keeps edges the pixel L1 alone blurs (no perceptual network is available offline)."""
    dx = (a[..., :, 1:] - a[..., :, :-1]) - (b[..., :, 1:] - b[..., :, :-1])
    dy = (a[..., 1:, :] - a[..., :-1, :]) - (b[..., 1:, :] - b[..., :-1, :])
    return dx.abs().mean() + dy.abs().mean()


def cmd_vae(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file, save_file
    from tokenfuse.face_model import nets

    out = Path(args.out)
    torch.manual_seed(args.seed)
    gen = np.random.default_rng(args.seed)
    faces = np.load(out / "train_faces.npy")
    small = _downscale(faces)
    vae = nets.build_vae().train()
    log = out / "vae_log.csv"
    step, before = _resume(args, out, "vae", log)
    if step:
        vae.load_state_dict(load_file(str(out / "vae_ckpt.safetensors")))
    opt = torch.optim.AdamW(vae.parameters(), lr=args.lr, weight_decay=0.0)
    t0 = last_ckpt = time.time() - before
    stop = time.time() + args.minutes * 60
    while step < args.steps and time.time() < stop:
        half = args.batch // 2  # both scales the U-Net will see: whole faces at S/2 and details at S
        x = torch.cat(
            [
                _batch_images(small, gen.integers(0, len(small), half), args.crop, gen),
                _batch_images(faces, gen.integers(0, len(faces), args.batch - half), args.crop, gen),
            ]
        )
        rec, kl = _vae_forward(vae, x)
        l1 = (rec - x).abs().mean()
        loss = l1 + 0.5 * _grad_l1(rec, x) + args.kl * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            _log_row(
                log,
                {
                    "step": step,
                    "seconds": round(time.time() - t0, 1),
                    "l1": f"{l1.item():.5f}",
                    "kl": f"{kl.item():.4f}",
                },
            )
            logger.info(f"vae step {step} l1 {l1.item():.4f} kl {kl.item():.3f} ({time.time() - t0:.0f} s)")
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            save_file({k: v.detach().clone() for k, v in vae.state_dict().items()}, str(out / "vae_ckpt.safetensors"))
            last_ckpt = time.time()
    save_file({k: v.detach().clone() for k, v in vae.state_dict().items()}, str(out / "vae_ckpt.safetensors"))
    (out / "vae_state.json").write_text(json.dumps({"steps": step, "seconds": round(time.time() - t0)}))
    logger.info(f"vae: {step} steps in {time.time() - t0:.0f} s")


# ------------------------------------------------------------------------------------------------------ latents
def cmd_latents(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file, save_file
    from tokenfuse.face_model import nets

    out = Path(args.out)
    faces = np.load(out / "train_faces.npy")
    vae: Any = nets.build_vae().eval()
    sd = load_file(str(out / "vae_ckpt.safetensors"))
    vae.load_state_dict(sd)
    lats = {}
    with torch.no_grad():
        # every face at S/2; the first --large faces at S (encoding is the slow part on a CPU). Flips are done on
        # the latents during U-Net training.
        for name, src in (("small", _downscale(faces)), ("large", faces[: args.large])):
            means = []
            for i in range(0, len(src), 16):
                x = torch.from_numpy(src[i : i + 16]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
                m, _ = vae.quant_conv(vae.encoder(x)).chunk(2, dim=1)
                means.append(m)
                logger.info(f"latents {name} {i + len(x)}/{len(src)}")
            lats[name] = torch.cat(means)
    ref = lats["small"]
    mean, std = ref.mean(dim=(0, 2, 3)), ref.std(dim=(0, 2, 3))
    nets.fold_latent_scale(sd, mean, std)
    save_file(sd, str(out / "vae_scaled.safetensors"))
    c = (1.0 / nets.SD15_SCALE / std).view(1, 4, 1, 1)
    # = process_in(latent of the rescaled VAE): what the U-Net sees inside ComfyUI
    scaled = {k: ((v - mean.view(1, 4, 1, 1)) * c * nets.SD15_SCALE).contiguous() for k, v in lats.items()}
    save_file(scaled, str(out / "latents.safetensors"))
    logger.info(
        f"latents: raw mean {mean.tolist()}, raw std {std.tolist()}; model-space std "
        f"{scaled['small'].std().item():.3f} / {scaled['large'].std().item():.3f}"
    )


# --------------------------------------------------------------------------------------------------------- U-Net
def cmd_unet(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file, save_file
    from tokenfuse.face_model import nets

    out = Path(args.out)
    torch.manual_seed(args.seed)
    lats = load_file(str(out / "latents.safetensors"))
    small, large = lats["small"], lats["large"]  # [N, 4, s, s] whole faces, [M, 4, 2s, 2s]
    s = small.shape[-1]
    net = nets.build_unet().train()
    context = torch.nn.Parameter(torch.randn(1, nets.CONTEXT_TOKENS, nets.UNET_CONFIG["context_dim"]) * 0.5)
    log = out / "unet_log.csv"
    step, before = _resume(args, out, "unet", log)
    if step:  # only the EMA weights are kept: they seed both the trained and the averaged copy
        ckpt = load_file(str(out / "unet_ckpt.safetensors"))
        with torch.no_grad():
            context.copy_(ckpt.pop("tokenfuse.context"))
        net.load_state_dict(ckpt)
    ema = {k: v.detach().clone() for k, v in net.state_dict().items()}
    ema_ctx = context.detach().clone()
    params = list(net.parameters()) + [context]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    # SD1.5's discrete schedule (ComfyUI's model_sampling for SD15: linear in sqrt(beta), 1000 steps).
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    alphas_cumprod = torch.cumprod(1.0 - betas, 0).float()
    t0 = last_ckpt = time.time() - before
    run_loss = None

    def save() -> None:
        sd = {k: v.clone() for k, v in ema.items()}
        sd["tokenfuse.context"] = ema_ctx.clone()
        save_file(sd, str(out / "unet_ckpt.safetensors"))
        (out / "unet_state.json").write_text(json.dumps({"steps": step, "seconds": round(time.time() - t0)}))

    stop = time.time() + args.minutes * 60
    while step < args.steps and time.time() < stop:
        half = args.batch // 2  # whole faces, and s x s windows of faces at twice the size (the scale at 512 px)
        x0 = small[torch.randint(0, len(small), (half,))]
        big = large[torch.randint(0, len(large), (args.batch - half,))]
        oy, ox = (int(v) for v in torch.randint(0, big.shape[-1] - s + 1, (2,)))
        x0 = torch.cat([x0, big[..., oy : oy + s, ox : ox + s]])
        flip = torch.rand(args.batch) < 0.5
        x0 = torch.where(flip.view(-1, 1, 1, 1), x0.flip(-1), x0)
        t = torch.randint(0, 1000, (args.batch,))
        ab = alphas_cumprod[t].view(-1, 1, 1, 1)
        eps = torch.randn_like(x0)
        xt = ab.sqrt() * x0 + (1.0 - ab).sqrt() * eps
        pred = net(xt, timesteps=t.float(), context=context.expand(args.batch, -1, -1))
        loss = torch.nn.functional.mse_loss(pred, eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        decay = args.ema if before else min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, v in net.state_dict().items():
                ema[k].mul_(decay).add_(v.detach(), alpha=1.0 - decay)
            ema_ctx.mul_(decay).add_(context.detach(), alpha=1.0 - decay)
        run_loss = loss.item() if run_loss is None else 0.98 * run_loss + 0.02 * loss.item()
        if step % 10 == 0 or step == 1:
            _log_row(
                log,
                {
                    "step": step,
                    "seconds": round(time.time() - t0, 1),
                    "loss": f"{loss.item():.5f}",
                    "loss_avg": f"{run_loss:.5f}",
                },
            )
            logger.info(f"unet step {step} loss {loss.item():.4f} avg {run_loss:.4f} ({time.time() - t0:.0f} s)")
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            save()
            last_ckpt = time.time()
    save()
    logger.info(f"unet: {step} steps in {time.time() - t0:.0f} s")


# -------------------------------------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file
    from tokenfuse.face_model import loader, nets

    out, dest = Path(args.out), Path(args.dest)
    vae_state = json.loads((out / "vae_state.json").read_text())
    unet_state = json.loads((out / "unet_state.json").read_text())
    loader.save_weights(
        dest,
        load_file(str(out / "unet_ckpt.safetensors")),
        load_file(str(out / "vae_scaled.safetensors")),
        {
            "unet_config": nets.UNET_CONFIG,
            "unet_steps": unet_state["steps"],
            "vae_steps": vae_state["steps"],
            "seed": args.seed,
        },
    )
    logger.info(f"export: {dest} ({sum(p.stat().st_size for p in dest.glob('*.safetensors')) / 2**20:.1f} MiB)")
    table = loss_table(out / "vae_log.csv", "l1") + "\n" + loss_table(out / "unet_log.csv", "loss")
    (out / "loss_table.md").write_text(table)
    logger.info("loss table:\n%s", table)


def loss_table(log: Path, column: str, rows: int = 8) -> str:
    """Markdown table of a stage's loss averaged over equal step windows (for MODEL_CARD.md)."""
    with log.open() as fh:
        data = [(int(r["step"]), float(r["seconds"]), float(r[column])) for r in csv.DictReader(fh)]
    size = max(1, len(data) // rows)
    lines = [f"| {log.stem} steps | minutes | mean {column} |", "|---|---|---|"]
    for i in range(0, len(data), size):
        chunk = data[i : i + size]
        mean = sum(c[2] for c in chunk) / len(chunk)
        lines.append(f"| {chunk[0][0]}-{chunk[-1][0]} | {chunk[-1][1] / 60:.1f} | {mean:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["prep", "vae", "latents", "unet", "export", "all"])
    ap.add_argument("--comfyui", required=True, help="ComfyUI checkout (its classes build the networks)")
    ap.add_argument("--out", required=True, help="work folder outside the repo (data, checkpoints, logs)")
    ap.add_argument("--images", nargs="*", default=[], help="prep: folders of face photos")
    ap.add_argument("--size", type=int, default=128, help="prep: aligned crop side (FFHQ template)")
    ap.add_argument("--dest", default=str(REPO / "face_model" / "weights"), help="export folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (keep it small on a shared machine)")
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-clock cap of a training stage")
    ap.add_argument("--steps", type=int, default=10**9, help="step cap of a training stage")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--crop", type=int, default=64, help="vae: random crop side of the training faces")
    ap.add_argument("--lr", type=float, default=None, help="default: vae 1e-3, unet 5e-4")
    ap.add_argument("--kl", type=float, default=1e-6, help="vae: KL weight")
    ap.add_argument("--large", type=int, default=600, help="latents: faces also encoded at full size")
    ap.add_argument("--ema", type=float, default=0.995, help="unet: EMA decay of the exported weights")
    ap.add_argument("--ckpt-minutes", type=float, default=4.0)
    ap.add_argument("--resume", action="store_true", help="vae/unet: continue the stage's checkpoint in --out")
    ap.add_argument("--tiny", action="store_true", help="smoke mode: 24 photos, a few steps per stage")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    _setup(args.comfyui, args.threads)
    stages = ["prep", "vae", "latents", "unet", "export"] if args.stage == "all" else [args.stage]
    if args.tiny:
        args.steps = min(args.steps, 3)
        if args.dest == ap.get_default("dest"):  # a smoke run never overwrites the committed weights
            args.dest = str(Path(args.out) / "weights")
    for stage in stages:
        args.lr = {"vae": 1e-3, "unet": 5e-4}.get(stage, 0.0) if args.lr is None or args.stage == "all" else args.lr
        {"prep": cmd_prep, "vae": cmd_vae, "latents": cmd_latents, "unet": cmd_unet, "export": cmd_export}[stage](args)


if __name__ == "__main__":
    main()
