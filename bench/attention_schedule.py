"""Benchmark: TokenFuse attention scheduling vs no patch vs ComfyUI's TomePatchModel, on real ComfyUI U-Net code.

Not a test. One process, one seed, random weights (valid for speed and memory, never for quality), batch 2 (CFG).
Every variant calls the U-Net the way sampling does: `model.apply_model(x, sigma, c_crossattn=..., y=...,
transformer_options=...)` with the patcher's transformer_options plus the keys ComfyUI's calc_cond_batch and
CFGGuider add (cond_or_uncond, uuids, sigmas, sample_sigmas); the timed sigma is the first step of a 20-step schedule.

Tables: full SD1.5 at 512/768 px and SDXL at 768 px, then a one-block micro-benchmark (SD1.5's first attention block,
320 channels) at 1024/2048 px. Columns: U-Net step time (median of --repeats interleaved rounds), ratio to baseline
and to TomePatchModel, tokens per level (q/kv per image, ours), activation peak memory (CUDA max_memory_allocated
above the loaded weights; CPU: peak RSS delta sampled every ms), matching overhead per step (our patch closures,
device-synced) and its share of the gross attention time saved, and output deviation vs baseline (relative L2).

The attention backend decides everything (DESIGN.md §2): `--backend sdpa` (default) forces PyTorch SDPA like ComfyUI
on NVIDIA; `--backend default` keeps ComfyUI's own choice (sub-quadratic on CPU). Run each backend as its own process.

    python bench/attention_schedule.py --comfyui /path/to/ComfyUI --quick          # tiny smoke run, CPU
    python bench/attention_schedule.py --comfyui ... --device cuda --dtype fp16 --sizes 1024
    python bench/attention_schedule.py --comfyui ... --device cpu --backend default
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
import comfy_models  # noqa: E402  (devkit/comfy_models.py)
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

DEFAULT_SIZES = {"sd15": [512, 768], "sdxl": [768]}
PRESETS = "balanced,lowvram_8gb,lowvram_6gb,lowvram_4gb"


# --------------------------------------------------------------------------------------------- measurement helpers
class RssPeak:
    """Peak resident memory above the start value while the block runs (Linux /proc; 1 ms sampling)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.peak = 0
        self._stop = threading.Event()

    def _rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * self.page

    def __enter__(self) -> RssPeak:
        self.start = self._rss()
        self.peak = self.start

        def poll() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, self._rss())
                time.sleep(0.001)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def delta_mib(self) -> float:
        return (self.peak - self.start) / 2**20


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(fn: Callable[[], Any], device: torch.device, cpu_peak: bool = False) -> float:
    """Activation peak (MiB above what is allocated before the call); NaN on CPU unless cpu_peak (see --cpu-peak)."""
    gc.collect()
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    if not cpu_peak or not Path("/proc/self/statm").exists():
        return float("nan")
    with RssPeak() as rss:
        fn()
    return rss.delta_mib


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-12))


class SyncedTimer:
    """Wraps patch closures: counts calls, counts calls that changed token counts, sums device-synced seconds."""

    def __init__(self, device: torch.device, timed: bool) -> None:
        self.device, self.timed = device, timed
        self.calls = self.changed = 0
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            if self.timed:
                sync(self.device)
            t0 = time.perf_counter()
            out = fn(*args)
            if self.timed:
                sync(self.device)
                self.seconds += time.perf_counter() - t0
            if len(args) == 4:  # attn1_patch(n, ctx, val, extra): one per attention call
                self.calls += 1
                n_in, ctx_in = args[0], args[1]
                n_out, ctx_out = out[0], out[1]
                kv_changed = (
                    isinstance(ctx_in, torch.Tensor)
                    and isinstance(ctx_out, torch.Tensor)
                    and (ctx_out.shape != ctx_in.shape)
                )
                self.changed += int(n_out.shape != n_in.shape or kv_changed)
            return out

        return wrapped


def instrument(patcher: Any, timer: SyncedTimer) -> Any:
    """A clone whose attn1 / attn1_output patches run through `timer` (bench-side; the pack is not changed)."""
    m = patcher.clone()
    patches = m.model_options["transformer_options"].get("patches", {})
    for name in ("attn1_patch", "attn1_output_patch"):
        if name in patches:
            patches[name] = [timer.wrap(p) for p in patches[name]]
    return m


# --------------------------------------------------------------------------------------------- variants
@dataclass
class Variant:
    name: str
    patcher: Any
    telemetry: Any = None
    schedule: Any = None
    results: dict[str, Any] = field(default_factory=dict)


def sampling_options(patcher: Any, sigma: torch.Tensor, sample_sigmas: torch.Tensor, batch: int) -> dict[str, Any]:
    """transformer_options as one sampling step builds them (patcher's options + calc_cond_batch / CFGGuider keys)."""
    import comfy.patcher_extension

    to = comfy.patcher_extension.copy_nested_dicts(patcher.model_options.get("transformer_options", {}))
    if "patches" in to:
        to["patches"] = {k: list(v) for k, v in to["patches"].items()}
    half = batch // 2
    to.update(
        {
            "cond_or_uncond": [0] * (batch - half) + [1] * half if batch > 1 else [0],
            "uuids": [uuid.UUID(int=i) for i in range(2 if batch > 1 else 1)],
            "sigmas": sigma,
            "sample_sigmas": sample_sigmas,
        }
    )
    return to


def make_variants(patcher: Any, family: str, presets: list[str], tome_ratio: float, pack: Any) -> list[Variant]:
    from comfy_extras.nodes_tomesd import TomePatchModel

    glue = sys.modules["tokenfuse.nodes.glue.patcher"]
    node = sys.modules["tokenfuse.nodes.scheduler_node"]
    patching = sys.modules["tokenfuse.nodes.model_patching"]
    fam = glue.detect_family(patcher)
    variants = [
        Variant("baseline", patcher),
        Variant(f"TomePatchModel {tome_ratio}", TomePatchModel.execute(patcher, tome_ratio).result[0]),
    ]
    for item in presets:
        preset, _, strategy = item.partition("/")
        schedule = node.schedule_from_widgets(preset, strategy or "preset", 0.0, fam.family)
        m, telemetry = patching.schedule_model(patcher, schedule, fam)
        variants.append(Variant(f"ours {item}", m, telemetry, schedule))
    return variants


def levels_text(telemetry: Any) -> str:
    """q/kv tokens per image per level for one model call, e.g. '/8 q4096 kv1024'."""
    per: dict[int, list] = {}
    for r in telemetry.records:
        per.setdefault(r.level, []).append(r)
    parts = []
    for level in sorted(per):
        recs = per[level]
        q = sum(r.q_out for r in recs) / len(recs)
        kv = sum(r.kv_out for r in recs) / len(recs)
        parts.append(f"/{level} q{recs[0].q_in}>{q:.0f} kv{recs[0].kv_in}>{kv:.0f}")
    return " ".join(parts) or "-"


def run_variants(
    variants: list[Variant],
    call: Callable[[Any, dict], torch.Tensor],
    options: Callable[[Any], dict],
    device: torch.device,
    repeats: int,
    warmup: int,
    cpu_peak: bool = False,
) -> None:
    """Time, measure memory, telemetry and deviation of every variant. call(patcher, transformer_options).

    Timed calls are interleaved (one call of each variant per round), so load drift on a shared machine or clock
    changes hit every variant alike; the step time is the median over rounds.
    """
    fns = [lambda v=v: call(v.patcher, options(v.patcher)) for v in variants]
    with torch.no_grad():
        base_out = None
        for v, fn in zip(variants, fns, strict=True):
            out = fn()
            base_out = out if base_out is None else base_out
            v.results["dev"] = rel_l2(out, base_out)
            v.results["finite"] = bool(torch.isfinite(out).all())
            for _ in range(warmup):
                fn()
        times: list[list[float]] = [[] for _ in variants]
        for _ in range(repeats):
            for i, fn in enumerate(fns):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                times[i].append((time.perf_counter() - t0) * 1000)
        for v, fn, ts in zip(variants, fns, times, strict=True):
            v.results["ms"] = statistics.median(ts)
            v.results["peak"] = peak_mib(fn, device, cpu_peak)
            if v.telemetry is not None:  # tokens of one call, then device-synced matching time of one call
                v.telemetry.reset()
                fn()
                v.results["levels"] = levels_text(v.telemetry)
                v.results["calls"] = (v.telemetry.summary()["reduced_calls"], v.telemetry.calls)
                timer = SyncedTimer(device, timed=True)
                timed = instrument(v.patcher, timer)
                call(timed, options(timed))
                timer.seconds = 0.0
                call(timed, options(timed))
                v.results["overhead_ms"] = timer.seconds * 1000
                v.results["ran"] = v.telemetry.calls > 0 or v.schedule.is_off
            elif v.name.startswith("TomePatchModel"):
                timer = SyncedTimer(device, timed=False)
                counted = instrument(v.patcher, timer)
                call(counted, options(counted))
                v.results["calls"] = (timer.changed, timer.calls)
                v.results["ran"] = timer.calls > 0


def print_table(title: str, variants: list[Variant]) -> None:
    base = variants[0].results["ms"]
    tome = variants[1].results["ms"] if len(variants) > 1 else float("nan")
    print(f"\n{title}")
    head = (
        f"{'variant':<26}{'step ms':>10}{'vs base':>9}{'vs tome':>9}{'peak MiB':>10}{'match ms':>10}"
        f"{'ovh/saved':>10}{'rel L2':>9}  {'reduced/calls':<14}tokens per level (per image)"
    )
    print(head)
    print("-" * len(head))
    for v in variants:
        r = v.results
        ovh = r.get("overhead_ms")
        gross = base - r["ms"] + (ovh or 0.0)
        share = f"{100 * ovh / gross:.1f}%" if ovh is not None and gross > 0 else ("-" if ovh is None else "n/a")
        calls = f"{r['calls'][0]}/{r['calls'][1]}" if "calls" in r else "-"
        flag = ("" if r["finite"] else "  NaN/Inf!") + ("" if r.get("ran", True) else "  PATCH NEVER RAN!")
        print(
            f"{v.name:<26}{r['ms']:>10.1f}{base / r['ms']:>8.2f}x{tome / r['ms']:>8.2f}x{r['peak']:>10.1f}"
            f"{(f'{ovh:.2f}' if ovh is not None else '-'):>10}{share:>10}{r['dev']:>9.4f}  {calls:<14}"
            f"{r.get('levels', '-')}{flag}"
        )


# --------------------------------------------------------------------------------------------- benchmarks
def bench_full(
    patcher: Any, family: str, size: int, args: argparse.Namespace, pack: Any, device: torch.device
) -> list[Variant]:
    import comfy.samplers

    inputs = comfy_models.model_inputs(patcher, family, 2, size, size, seed=args.seed, tiny=args.quick)
    x, t = inputs.pop("x"), inputs.pop("t")
    sample_sigmas = comfy.samplers.calculate_sigmas(patcher.model.model_sampling, "normal", 20).to(device)
    t = sample_sigmas[:1].expand(x.shape[0]).clone()

    def call(p: Any, to: dict) -> torch.Tensor:
        return p.model.apply_model(x, t, transformer_options=to, **inputs)

    variants = make_variants(patcher, family, args.presets, args.tome_ratio, pack)
    run_variants(
        variants,
        call,
        lambda p: sampling_options(p, t, sample_sigmas, x.shape[0]),
        device,
        args.repeats,
        args.warmup,
        args.cpu_peak,
    )
    return variants


def bench_block(patcher: Any, size: int, args: argparse.Namespace, pack: Any, device: torch.device) -> list[Variant]:
    """SD1.5's first attention block (input_blocks[1][1], a SpatialTransformer) alone at `size` px."""
    import comfy.samplers

    block = patcher.model.diffusion_model.input_blocks[1][1]
    channels = block.in_channels
    dtype = next(block.parameters()).dtype
    gen = torch.Generator().manual_seed(args.seed)
    h = w = size // 8
    x = torch.randn(2, channels, h, w, generator=gen).to(device, dtype)
    ctx = torch.randn(2, 77, 768, generator=gen).to(device, dtype)
    sample_sigmas = comfy.samplers.calculate_sigmas(patcher.model.model_sampling, "normal", 20).to(device)
    t = sample_sigmas[:1].expand(2).clone()

    def options(p: Any) -> dict:
        to = sampling_options(p, t, sample_sigmas, 2)
        to.update({"original_shape": [2, 4, h, w], "transformer_index": 0, "block": ("input", 1)})
        return to

    def call(p: Any, to: dict) -> torch.Tensor:
        return block(x, context=ctx, transformer_options=to)

    variants = make_variants(patcher, "sd15", args.presets, args.tome_ratio, pack)
    run_variants(variants, call, options, device, args.repeats, args.warmup, args.cpu_peak)
    return variants


def print_targets(tables: list[tuple[str, int, list[Variant]]], backend: str) -> None:
    """The issue's targets for the balanced preset (they are stated for the SDPA table)."""
    print(f"\ntargets (balanced preset; stated for the SDPA table, this run: {backend}):")
    for family, size, variants in tables:
        rows = {v.name: v.results for v in variants}
        ours = rows.get("ours balanced")
        if ours is None:
            continue
        base, tome = variants[0].results["ms"], variants[1].results["ms"]
        vs_base, vs_tome = base / ours["ms"], tome / ours["ms"]
        if family == "sd15" and size == 768:
            print(
                f"  SD1.5 768: {vs_base:.2f}x vs baseline (target >= 1.2) "
                f"{'PASS' if vs_base >= 1.2 else 'MISS'}; {vs_tome:.2f}x vs TomePatchModel (target >= 1.1) "
                f"{'PASS' if vs_tome >= 1.1 else 'MISS'}"
            )
        if family == "sdxl":
            print(
                f"  SDXL {size}: {vs_base:.2f}x vs baseline (target > 1, TomePatchModel {base / tome:.2f}x) "
                f"{'PASS' if vs_base > 1.0 else 'MISS'}"
            )
        ovh = ours.get("overhead_ms")
        gross = base - ours["ms"] + (ovh or 0.0)
        if ovh is not None and gross > 0:
            share = ovh / gross
            print(
                f"  {family} {size}: matching overhead {100 * share:.1f}% of attention time saved (target <= 10%) "
                f"{'PASS' if share <= 0.10 else 'MISS'}"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", ""), help="ComfyUI checkout (or COMFYUI_PATH)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default=None, help="default: fp16 on cuda, fp32 on cpu")
    p.add_argument(
        "--backend",
        choices=("sdpa", "default"),
        default="sdpa",
        help="sdpa: PyTorch SDPA (ComfyUI on NVIDIA); default: ComfyUI's own pick (sub-quadratic on CPU)",
    )
    p.add_argument("--models", default="sd15,sdxl", help="comma list of sd15, sdxl ('' = micro only)")
    p.add_argument("--sizes", default="", help="px sizes for every model (default: sd15 512,768; sdxl 768)")
    p.add_argument("--micro-sizes", default="1024,2048", help="px sizes of the one-block micro-benchmark ('' = skip)")
    p.add_argument("--presets", default=PRESETS, help="comma list of preset[/strategy], e.g. balanced,balanced/tome")
    p.add_argument("--tome-ratio", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-peak",
        action="store_true",
        help="CPU: measure peak RSS (serves every tensor allocation by mmap, which slows each step several "
        "fold: step times of such a run are not comparable; use it in a separate memory-only run)",
    )
    p.add_argument("--quick", action="store_true", help="tiny smoke run: narrow models, 128 px (micro 256), 2 repeats")
    args = p.parse_args(argv)
    if not args.comfyui:
        p.error("--comfyui (or COMFYUI_PATH) must point at a ComfyUI checkout")
    args.dtype = args.dtype or ("fp16" if args.device == "cuda" else "fp32")
    args.models = [m for m in args.models.split(",") if m]
    args.presets = [s for s in args.presets.split(",") if s]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    args.micro_sizes = [int(s) for s in args.micro_sizes.split(",") if s]
    if args.quick:
        sizes = sizes or [128]
        args.micro_sizes = [256] if args.micro_sizes else []
        args.repeats, args.warmup = min(args.repeats, 2), 1
    args.model_sizes = {m: sizes or DEFAULT_SIZES.get(m, [768]) for m in args.models}
    return args


def track_large_allocations() -> None:
    """CPU: serve every tensor-sized allocation by mmap, so freed memory leaves RSS and peak RSS deltas mean something.

    glibc otherwise raises its mmap threshold after the first frees and keeps freed blocks in the heap.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB, fixed
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cpu" and args.cpu_peak:
        track_large_allocations()
    comfy_models.setup_comfy(args.comfyui, cpu=args.device == "cpu", sdpa=args.backend == "sdpa")
    import comfy.model_management as mm

    pack = load_pack()
    import tokenfuse.nodes.scheduler_node  # noqa: F401

    device = mm.get_torch_device()
    dtype = {"fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"TokenFuse attention_schedule bench | device {device} ({name}) | {args.dtype} | attention backend: "
        f"{comfy_models.attention_backend()} | torch {torch.__version__} | batch 2 (CFG) | seed {args.seed} | "
        f"median of {args.repeats} | {'QUICK tiny models' if args.quick else 'full architectures'}"
    )
    torch.manual_seed(args.seed)
    need_micro = bool(args.micro_sizes)
    tables: list[tuple[str, int, list[Variant]]] = []
    families = list(args.models) + (["sd15"] if need_micro and "sd15" not in args.models else [])
    for family in families:
        kw = {"model_channels": 32, "tiny": True} if args.quick else {"model_channels": 320}
        patcher = comfy_models.build_model(family, dtype=dtype, seed=args.seed, **kw)
        mm.load_models_gpu([patcher])
        for size in args.model_sizes.get(family, []) if family in args.models else []:
            variants = bench_full(patcher, family, size, args, pack, device)
            tables.append((family, size, variants))
            print_table(f"{family.upper()} U-Net, {size}x{size} px, latent {size // 8}x{size // 8}", variants)
        if family == "sd15" and need_micro:
            for size in args.micro_sizes:
                variants = bench_block(patcher, size, args, pack, device)
                ch = patcher.model.diffusion_model.input_blocks[1][1].in_channels
                print_table(
                    f"micro: one SD1.5 attention block ({ch} ch, input 1), {size}x{size} px, {(size // 8) ** 2} tokens",
                    variants,
                )
        del patcher
        mm.unload_all_models()
        gc.collect()
        mm.soft_empty_cache()
    print_targets(tables, comfy_models.attention_backend())
    print(
        "\nvs base / vs tome: speed ratio (>1 = faster). match ms: our patch closures per step, device-synced. "
        "ovh/saved: match ms / (baseline - ours + match ms). rel L2: output vs baseline (random weights: "
        "speed/memory only, not quality). peak MiB: CUDA max allocated; CPU only with --cpu-peak. "
        "reduced/calls: attention calls whose tokens shrank / patched calls."
    )


if __name__ == "__main__":
    main()
