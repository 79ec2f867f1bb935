"""Measurement helpers the U-Net benches share (bench/unet_step.py, bench/fusion.py): timing, memory, variants.

Not imported by the pack. Every variant is timed in the same process with interleaved rounds (load drift on a shared
machine hits every variant alike), the step time is the median over rounds, and the patch closures' own cost is
measured device-synced through `instrument` (bench-side wrappers; the pack is not changed).
"""

from __future__ import annotations

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
from functools import partial
from pathlib import Path
from typing import Any

import torch


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
        self.calls = self.changed = self.invocations = 0
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
                self.invocations += 1
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


def timer_floor_s(device: torch.device, samples: int = 201) -> float:
    """Seconds a SyncedTimer-wrapped closure that does nothing costs (the wrapper, its clock reads and the sync after
    it on an idle device; median of `samples`): the instrument's own cost, taken off each timed closure call, so the
    match cost is what the closures add, not what timing them one by one adds (on a GPU a synchronize round trip is
    microseconds, times ~32 closure calls per step)."""
    timer = SyncedTimer(device, timed=True)
    noop = timer.wrap(lambda x: x)
    costs = []
    for _ in range(samples):
        before = timer.seconds
        noop(None)
        costs.append(timer.seconds - before)
    return statistics.median(costs)


def instrument(patcher: Any, timer: SyncedTimer) -> Any:
    """A clone whose attn1 / attn1_output patches run through `timer` (bench-side; the pack is not changed)."""
    m = patcher.clone()
    patches = m.model_options["transformer_options"].get("patches", {})
    for name in ("attn1_patch", "attn1_output_patch"):
        if name in patches:
            patches[name] = [timer.wrap(p) for p in patches[name]]
    return m


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

    to: dict[str, Any] = comfy.patcher_extension.copy_nested_dicts(patcher.model_options.get("transformer_options", {}))
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


def tome_patch_model(patcher: Any, ratio: float) -> Any:
    """ComfyUI's own TomePatchModel applied to `patcher` (its q-only merge at the full-resolution level).

    Through the node's execute() when comfy_extras imports; on a bare box whose comfy_api import chain lacks packages,
    through the node module's get_functions with the same closures the node attaches.
    """
    try:
        from comfy_extras.nodes_tomesd import TomePatchModel

        return TomePatchModel.execute(patcher, ratio).result[0]
    except ImportError:
        import types

        class _AnyAttr:
            def __getattr__(self, name: str) -> type:
                return object

        stub = types.ModuleType("comfy_api.latest")
        stub.ComfyExtension = object  # type: ignore[attr-defined]
        stub.io = _AnyAttr()  # type: ignore[attr-defined]
        for key in [k for k in sys.modules if k.startswith("comfy_api")]:
            del sys.modules[key]
        sys.modules["comfy_api"] = types.ModuleType("comfy_api")
        sys.modules["comfy_api.latest"] = stub
        from comfy_extras.nodes_tomesd import get_functions

    state: dict[str, Any] = {}

    def tomesd_m(q: Any, k: Any, v: Any, extra_options: dict[str, Any]) -> Any:
        m, state["u"] = get_functions(q, ratio, extra_options["original_shape"])
        return m(q), k, v

    def tomesd_u(n: Any, extra_options: dict[str, Any]) -> Any:
        return state["u"](n)

    m = patcher.clone()
    m.set_model_attn1_patch(tomesd_m)
    m.set_model_attn1_output_patch(tomesd_u)
    return m


def levels_text(telemetry: Any) -> str:
    """q/kv tokens per image per level, means over the run's calls, e.g. '/8 q4096>4096 kv4096>1024'."""
    parts = [
        f"/{lv} q{q_in:.0f}>{q_out:.0f} kv{kv_in:.0f}>{kv_out:.0f}"
        for lv, (q_in, q_out, kv_in, kv_out) in telemetry.level_means().items()
    ]
    return " ".join(parts) or "-"


def rotated(n: int, round_index: int) -> list[int]:
    """Indices 0..n-1 starting at round_index mod n: the variant order of one timing round."""
    k = round_index % n if n else 0
    return [*range(k, n), *range(k)]


@dataclass(frozen=True)
class StepCall:
    """One model step of a variant: call(patcher, options(patcher)) on `device`."""

    call: Callable[[Any, dict[str, Any]], torch.Tensor]
    options: Callable[[Any], dict[str, Any]]
    device: torch.device


@dataclass(frozen=True)
class Timing:
    """How run_variants times: timed rounds, untimed warm-up calls, peak RSS on CPU, overhead, isolate.

    overhead: also time our patch closures device-synced (two more calls per variant; off for slow CPU runs).
    isolate: see run_variants.
    """

    repeats: int
    warmup: int
    cpu_peak: bool = False
    overhead: bool = True
    isolate: Callable[[], None] | None = None


def run_variants(variants: list[Variant], step: StepCall, timing: Timing) -> None:
    """Time, measure memory, telemetry and deviation of every variant, each called as `step` says.

    Timed calls are interleaved (one call of each variant per round), so load drift on a shared machine or clock
    changes hit every variant alike; the step time is the median over rounds. The order rotates each round, so no
    variant always runs first or right after the same neighbour (on a launch-bound GPU a call's time can depend on
    what the previous call left in the allocator and the queue).

    isolate: run before each variant, which is then timed alone, start to end (no interleaving). For compiled
    variants: they share the U-Net's code objects, so interleaved they would share dynamo's cache and recompile
    limit, and one variant's guards would evict or cap another's graphs (the baseline then recompiled on every call).
    """
    fns: list[Callable[[], torch.Tensor]] = [partial(_call_variant, step, v) for v in variants]
    with torch.no_grad():
        if timing.isolate is None:
            _first_calls(variants, fns, timing.warmup, None)
            times = _timed_rounds(fns, step.device, timing.repeats)
            for v, fn, ts in zip(variants, fns, times, strict=True):
                _finish(v, fn, ts, step, timing)
            return
        base_out = None
        for v, fn in zip(variants, fns, strict=True):
            timing.isolate()
            base_out = _first_calls([v], [fn], timing.warmup, base_out)
            _finish(v, fn, _timed_rounds([fn], step.device, timing.repeats)[0], step, timing)


def _call_variant(step: StepCall, v: Variant) -> torch.Tensor:
    return step.call(v.patcher, step.options(v.patcher))


def _first_calls(
    variants: list[Variant], fns: list[Callable[[], torch.Tensor]], warmup: int, base_out: torch.Tensor | None
) -> torch.Tensor | None:
    """The untimed first call (deviation vs the first variant's output, finiteness) and the warm-up calls."""
    for v, fn in zip(variants, fns, strict=True):
        out = fn()
        base_out = out if base_out is None else base_out
        v.results["dev"] = rel_l2(out, base_out)
        v.results["finite"] = bool(torch.isfinite(out).all())
        for _ in range(warmup):
            fn()
    return base_out


def _timed_rounds(fns: list[Callable[[], torch.Tensor]], device: torch.device, repeats: int) -> list[list[float]]:
    """Per-function call times in ms, one call of each per round, the order rotating."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for i in rotated(len(fns), r):
            sync(device)
            t0 = time.perf_counter()
            fns[i]()
            sync(device)
            times[i].append((time.perf_counter() - t0) * 1000)
    return times


def _finish(v: Variant, fn: Callable[[], torch.Tensor], times: list[float], step: StepCall, timing: Timing) -> None:
    """Median time, peak memory, telemetry (tokens of one call) and, with overhead, the synced closure time."""
    call, options, device = step.call, step.options, step.device
    cpu_peak, overhead = timing.cpu_peak, timing.overhead
    v.results["ms"] = statistics.median(times)
    v.results["rounds_ms"] = times
    v.results["peak"] = peak_mib(fn, device, cpu_peak)
    if v.telemetry is not None:
        v.telemetry.reset()
        fn()
        v.results["levels"] = levels_text(v.telemetry)
        v.results["device_aware"] = v.telemetry.levels_text()
        v.results["calls"] = (v.telemetry.summary()["reduced_calls"], v.telemetry.calls)
        v.results["ran"] = v.telemetry.calls > 0 or v.schedule.is_off
        if not overhead:
            return
        timer = SyncedTimer(device, timed=True)
        timed = instrument(v.patcher, timer)
        call(timed, options(timed))
        timer.seconds, timer.invocations = 0.0, 0
        call(timed, options(timed))
        floor = timer_floor_s(device)
        v.results["overhead_raw_ms"] = timer.seconds * 1000
        v.results["timer_floor_us"] = floor * 1e6
        v.results["overhead_ms"] = max(0.0, timer.seconds - timer.invocations * floor) * 1000
    elif v.name.startswith("TomePatchModel"):
        timer = SyncedTimer(device, timed=False)
        counted = instrument(v.patcher, timer)
        call(counted, options(counted))
        v.results["calls"] = (timer.changed, timer.calls)
        v.results["ran"] = timer.calls > 0


def track_large_allocations() -> None:
    """CPU: serve every tensor-sized allocation by mmap, so freed memory leaves RSS and peak RSS deltas mean something.

    glibc otherwise raises its mmap threshold after the first frees and keeps freed blocks in the heap.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB, fixed
    except (OSError, AttributeError):
        pass
