"""Device-aware reduction: does reducing this level's K/V save time on this device, at this shape? Measure it once.

Why a measurement and not a cost model: whether K/V pooling pays depends on the attention kernel (SDPA flash /
memory-efficient / math, sub-quadratic on CPU), the dtype, the device's matmul rate and its per-op launch cost; a
cost model needs all of these per device and we can validate it only on the CPU here. A short calibration on the
first sampling run measures the answer where it is asked, once per (device, dtype, tokens, channels, heads, kernel),
and is kept for later runs and processes on this machine (scheduling/calibration_store.py: the decision changes the
samples, so one workflow must not decide differently from run to run on timing noise). The batch is not in the key:
ComfyUI runs cond and uncond in one call or two depending on free memory, and the service batches concurrent photos,
so one input arrives at several batch sizes; the first call's batch is the one measured, and every later batch, run
and process follows that decision.

What is timed, on synthetic projections of the call's real `n` [B, N, C] (the patch does not own the attention):
- part A, the projections: q, k, v = n W (full) vs q = n W, kv = reduce(n), k, v = kv W (reduced; the pooling and
  the smaller K/V projections);
- part B, SDPA with the first Nq queries against the full vs the reduced K/V (Nq = min(N, 512) on CPU, where
  attention cost is linear in the queries; all N elsewhere, small grids do not fill a GPU);
- estimate per call: A + (N / Nq) * B, the minimum over 3-9 interleaved rounds (a shared machine's load spikes
  only ever add time; cheap shapes get more rounds, a large one stops after one).

A level is kept when the reduced estimate is at least `MARGIN` faster. On devices that run asynchronously (CUDA) the
GPU time saved can hide behind a launch-bound model while the patch's host work always adds: there the saving must
also exceed `HOST_GUARD` times the host cost of a reduced call (the pooling's enqueue time plus `PATCH_HOST_S`, the
patch's own table lookup measured by bench/patch_overhead.py). That guard is a rule from the H200 figures of issue
11 (SDXL 1024: ~0.09 ms host cost per patched call made `balanced` 0.91x), not a measurement of the whole model.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from . import calibration_store

log = logging.getLogger(__name__)

MARGIN = 0.05  # keep a level only when its attention is >= 5 % cheaper reduced (below that: noise, not a gain)
HOST_GUARD = 3.0  # async devices: GPU time saved must be >= 3x the host time a reduced call adds
PATCH_HOST_S = 15e-6  # host work of one reduced patch call (bench/patch_overhead.py: 10.8-15.5 us per reduced call)
CPU_QUERY_SAMPLE = 512
ROUNDS = 3  # at least this many interleaved rounds (the minimum of each part is kept) ...
MAX_ROUNDS = 9  # ... and more, up to this, while the calibration has taken less than MIN_SPAN_S (cheap shapes)
MIN_SPAN_S = 0.05
BUDGET_S = 0.5  # after one round, stop when the full estimate alone exceeds this (the answer is clear and costly)

Reduce = Callable[[torch.Tensor], torch.Tensor]  # n [B, N, C] -> the reduced K/V source [B, M, C]


class LevelCheck(NamedTuple):
    """One calibration's answer (times are per attention call, milliseconds)."""

    level: int
    tokens: int
    kept: bool
    full_ms: float
    reduced_ms: float
    reason: str

    @property
    def speedup(self) -> float:
        return self.full_ms / self.reduced_ms if self.reduced_ms > 0 else float("inf")


_CACHE: dict[tuple[Any, ...], LevelCheck] = {}
_LOCK = threading.Lock()  # one calibration at a time in a process: two threads never decide one key differently
# None: measure. True / False: every level is kept / dropped without measuring (tests pin it so token-count assertions
# do not depend on a loaded machine's timing; benches and ComfyUI always measure).
PINNED: bool | None = None


def clear_cache() -> None:
    """Forget every calibration (tests; a changed device clock or backend)."""
    _CACHE.clear()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def measure(
    n: torch.Tensor, reduce: Reduce, heads: int, dim_head: int, rounds: int = ROUNDS
) -> tuple[float, float, float]:
    """(full seconds, reduced seconds, host seconds of the reduction) per attention call; see module docstring."""
    b, tokens, channels = n.shape
    device = n.device
    inner = heads * dim_head
    with torch.no_grad():
        gen = torch.Generator(device="cpu").manual_seed(0)
        weight = (torch.randn(inner, channels, generator=gen) / channels**0.5).to(device, n.dtype)
        nq = min(tokens, CPU_QUERY_SAMPLE) if device.type == "cpu" else tokens
        scale = tokens / nq

        def heads_of(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, heads, dim_head).transpose(1, 2)

        q = heads_of(F.linear(n[:, :nq], weight))
        k_full = heads_of(F.linear(n, weight))
        kv_red = reduce(n)
        k_red = heads_of(F.linear(kv_red, weight))

        def proj_full() -> None:
            F.linear(n, weight), F.linear(n, weight), F.linear(n, weight)

        def proj_red() -> None:
            kv = reduce(n)
            F.linear(n, weight), F.linear(kv, weight), F.linear(kv, weight)

        def attn_full() -> None:
            F.scaled_dot_product_attention(q, k_full, k_full)

        def attn_red() -> None:
            F.scaled_dot_product_attention(q, k_red, k_red)

        for fn in (proj_full, proj_red, attn_full, attn_red):  # warm-up: kernel choice, allocator
            fn()
        best = [float("inf")] * 4
        start = time.perf_counter()
        for r in range(MAX_ROUNDS):
            for i, fn in enumerate((proj_full, proj_red, attn_full, attn_red)):
                best[i] = min(best[i], _timed(fn, device))
            if best[0] + scale * best[2] > BUDGET_S:
                break  # a large shape: one round gives a clear answer, more would cost seconds on a CPU
            if r + 1 >= rounds and time.perf_counter() - start > MIN_SPAN_S:
                break
        host = 0.0
        if device.type != "cpu":  # enqueue time of the reduction alone (no sync inside)
            _sync(device)
            t0 = time.perf_counter()
            reduce(n)
            host = time.perf_counter() - t0
            _sync(device)
    return best[0] + scale * best[2], best[1] + scale * best[3], host


@dataclass(frozen=True)
class _Probe:
    """What measuring one undecided key needs (check_level's arguments, bundled once per miss under _LOCK): the call's
    input n [B, N, C], its K/V reduction, the attention's heads and head width, and the timer (None: `measure`)."""

    n: torch.Tensor
    reduce: Reduce
    heads: int
    dim_head: int
    measure_fn: Callable[..., tuple[float, float, float]] | None


def check_level(  # noqa: PLR0913 - hot path: its cache lookup runs per attention call (device-aware presets); a per-call argument object would allocate
    n: torch.Tensor,
    reduce: Reduce,
    level: int,
    heads: int,
    dim_head: int,
    key: tuple[Any, ...] = (),
    measure_fn: Callable[..., tuple[float, float, float]] | None = None,
) -> LevelCheck:
    """Whether reducing this call's K/V with `reduce` pays on n's device (one answer per device, dtype, tokens,
    channels, heads and key, whatever the batch; the first one stored on this machine is everyone's answer).

    n: [B, N, C] the attention call's input; key: what else decides the reduction (e.g. the pooling kernel).
    """
    if PINNED is not None:
        return LevelCheck(level, n.shape[1], PINNED, float("nan"), float("nan"), "pinned (not measured)")
    full_key = (str(n.device), n.dtype, tuple(n.shape[1:]), heads, dim_head, level) + key
    got = _CACHE.get(full_key)
    if got is not None:
        return got
    with _LOCK:
        got = _CACHE.get(full_key)
        return got if got is not None else _decide(_Probe(n, reduce, heads, dim_head, measure_fn), level, full_key)


def _decide(probe: _Probe, level: int, full_key: tuple[Any, ...]) -> LevelCheck:
    """check_level's answer for a key this process has not decided: the stored one, else measured and stored (or,
    when another process stored first meanwhile, that one). Under _LOCK."""
    n = probe.n
    stored = calibration_store.load(full_key, n.device, LevelCheck._fields)
    if stored is not None:  # decided by an earlier process on this machine: the same decision, the same samples
        check = _from_record(stored, earlier=True)
        _CACHE[full_key] = check
        return check
    t0 = time.perf_counter()
    check = _measured(probe, level)
    # stored even when not measured: one answer per key, whichever process got there first
    theirs = calibration_store.save(full_key, n.device, check._asdict(), LevelCheck._fields)
    if theirs is not None:  # another process on this machine decided first: its decision, its samples
        check = _from_record(theirs, earlier=True)
    _CACHE[full_key] = check
    log.debug(
        "TokenFuse: calibrated /%d %s: %s (%.1f ms)",
        level,
        tuple(n.shape),
        check.reason,
        (time.perf_counter() - t0) * 1e3,
    )
    return check


def _measured(probe: _Probe, level: int) -> LevelCheck:
    """This process's own answer: measured, and the decision rule of the module docstring applied."""
    n = probe.n
    try:
        full, reduced, host = (probe.measure_fn or measure)(n, probe.reduce, probe.heads, probe.dim_head)
    except Exception as exc:  # an unforeseen shape or backend: keep the reduction the preset asks for
        return LevelCheck(level, n.shape[1], True, float("nan"), float("nan"), f"not measured ({type(exc).__name__})")
    saved = full - reduced
    host_cost = host + PATCH_HOST_S
    if saved < MARGIN * full:
        kept, reason = False, f"saves {100 * saved / full:.0f}% < {100 * MARGIN:.0f}% on {n.device.type}"
    elif n.device.type != "cpu" and saved < HOST_GUARD * host_cost:
        kept, reason = False, f"saves {saved * 1e3:.3f} ms < {HOST_GUARD:.0f}x host cost {host_cost * 1e3:.3f} ms"
    else:
        kept, reason = True, f"{full / reduced:.2f}x attention on {n.device.type}"
    return LevelCheck(level, n.shape[1], kept, full * 1e3, reduced * 1e3, reason)


def _from_record(record: dict[str, Any], earlier: bool) -> LevelCheck:
    """A LevelCheck from its stored fields; `earlier`: decided by another process (the reason says so)."""
    check = LevelCheck(*(record[f] for f in LevelCheck._fields))
    return check._replace(reason=f"{check.reason} (calibrated earlier)") if earlier else check
