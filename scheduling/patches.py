"""Attention patch closures built from a Schedule: what the ComfyUI glue attaches to a cloned model.

U-Net families (SD1.x/2.x, SDXL): `build_unet_patches` -> (attn1_patch, attn1_output_patch) for
`m.set_model_attn1_patch(f)` / `m.set_model_attn1_output_patch(g)`.
- f(n, ctx, val, extra_options) -> (n, ctx, val): n = norm1(x) [B, N, C] before projection; ComfyUI passes ctx and val
  as the same object as n for self-attention. tome merges n (and ctx/val when they are the same tokens); todo and topk
  shrink only ctx/val. Other packs' patches may run before or after ours: we only touch ctx/val that still have N
  tokens, and merge q-only when they do not.
- g(n, extra_options) -> n restores N tokens after a tome merge. The unmerge travels from f to g inside
  `extra_options`, a fresh dict per BasicTransformerBlock call, so concurrent blocks can never mix them up.
DiT families: `build_attention_override` -> override(func, *args, **kwargs) for
`transformer_options["optimized_attention_override"]`; top-K K/V on the 1-D sequence (the grid is unknown).

Every closure returns its inputs unchanged (same objects) when the schedule is off, outside the sigma window, in a
protected block, at a level with ratio 0, or when the call does not look like a known token grid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from . import calibrate
from .adaptive import adapt_ratio, token_complexity
from .downsample import kernel_for_ratio
from .keys import DISABLED_KEY, PLAN_KEY, STEP_KEY, UNMERGE_KEY
from .reducers import LRU, REDUCERS, ReduceState
from .schedule import MAX_RATIO, Schedule
from .step_state import run_steps
from .telemetry import RunTelemetry
from .topk import gather_tokens, keep_count, topk_indices

log = logging.getLogger(__name__)

MIN_DIT_TOKENS = 64

AttnPatch = Callable[[torch.Tensor, Any, Any, dict[str, Any]], tuple[torch.Tensor, Any, Any]]
OutputPatch = Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]


def infer_grid(n_tokens: int, original_shape: Any) -> tuple[int, int, int] | None:
    """(level factor 8/16/32/64, grid_h, grid_w) for a token count, from the latent (…, H, W); None if no match.

    ComfyUI's stride-2 convs round up, so level k has ceil(H / 2^k) x ceil(W / 2^k) tokens.
    """
    if original_shape is None or len(original_shape) < 2:
        return None
    h, w = int(original_shape[-2]), int(original_shape[-1])
    for k in range(4):
        if h * w == n_tokens:
            return 8 << k, h, w
        h, w = (h + 1) // 2, (w + 1) // 2
    return None


@dataclass(frozen=True)
class StepInfo:
    step: int  # index into sample_sigmas (-1 when unknown)
    steps: int  # number of sampling steps (0 when unknown)
    progress: float  # fraction of sampling done, in [0, 1)
    sigma: float


class _StepTracker:
    """Step progress of a model call, cached per call.

    With the run's SamplingSteps in options[STEP_KEY] (ComfyUI's sampler path, nodes/sampler_steps.py) the step is an
    attribute read: no device sync (see scheduling/step_state.py for the step semantics of multi-evaluation
    samplers). Without it (plain-torch callers, unit tests, samplers the wrapper does not know) the step is the
    nearest extra_options["sample_sigmas"] entry to extra_options["sigmas"]: one host read of the current sigma per
    model call, which on a GPU is a blocking device sync.
    """

    def __init__(self) -> None:
        self._sig: Any = None
        self._ss: Any = None
        self._ss_vals: list[float] = []
        self._info = StepInfo(-1, 0, 0.0, float("nan"))
        self._state: Any = None
        self._state_step = -1

    def __call__(self, options: dict[str, Any]) -> StepInfo:
        state = run_steps(options, STEP_KEY)
        if state is not None:
            if state is not self._state or state.step != self._state_step:
                step = state.step
                self._info = StepInfo(step, state.steps, min(step / state.steps, 1.0), state.sigma)
                self._state, self._state_step, self._sig = state, step, None
            return self._info
        sig, ss = options.get("sigmas"), options.get("sample_sigmas")
        if sig is None:
            return StepInfo(-1, 0, 0.0, float("nan"))
        if sig is self._sig and ss is self._ss:
            return self._info
        sigma = float(sig.reshape(-1)[0]) if isinstance(sig, torch.Tensor) else float(sig)
        if ss is not self._ss:
            self._ss_vals = [float(s) for s in ss.reshape(-1).tolist()] if isinstance(ss, torch.Tensor) else []
        if len(self._ss_vals) >= 2:
            step = min(range(len(self._ss_vals)), key=lambda i: abs(self._ss_vals[i] - sigma))
            steps = len(self._ss_vals) - 1
            info = StepInfo(step, steps, min(step / steps, 1.0), sigma)
        else:
            info = StepInfo(-1, 0, 0.0, sigma)
        self._sig, self._ss, self._info, self._state = sig, ss, info, None
        return info


_MISSING: Any = object()


def eager_under_compile(fn: Any) -> Any:
    """fn wrapped in torch.compiler.disable: dynamo runs it eagerly as one graph break (see build_unet_patches and
    step_cache.build_step_cache)."""
    return torch.compiler.disable(fn)  # type: ignore[no-untyped-call]


class _Call(NamedTuple):
    """What attention calls at one (token count, transformer index) do in one table row (built once, then looked up)."""

    label: str  # telemetry block label, e.g. "input.1.0"
    level: int  # 8 / 16 / 32 / 64
    h: int
    w: int
    ratio: float  # base ratio after block protection, ramp and step window (0 = identity)
    fn: Callable[[torch.Tensor], torch.Tensor] | None  # prebuilt K/V reduction for plan-free, non-adaptive todo


def _block_label(options: dict[str, Any]) -> str:
    block = options.get("block")
    if isinstance(block, (tuple, list)) and len(block) >= 2:
        return f"{block[0]}.{block[1]}.{options.get('block_index', 0)}"
    return str(options.get("block_index", "?"))


def build_unet_patches(schedule: Schedule, telemetry: RunTelemetry) -> tuple[AttnPatch, OutputPatch]:
    """(attn1_patch, attn1_output_patch) closures for a U-Net model (see module docstring)."""
    steps = _StepTracker()
    state = ReduceState(schedule)  # the reducers' caches (partitions, plan ROI tensors, pooling closures)
    reduce = REDUCERS[schedule.strategy]
    complexity = LRU(16)
    warned: set[str] = set()
    timing = schedule.time_calls

    def warn_once(key: str, msg: str, *args: Any) -> None:
        if key not in warned:
            warned.add(key)
            log.warning(msg, *args)

    # The hot path (issue 11): the host work of a call is a lookup in a table built once per (latent shape, step
    # window, plan). `current` holds the objects the table was picked for; ComfyUI makes a new `sigmas` tensor and
    # `original_shape` list per model call, so a re-pick happens once per model call, not once per attention call.
    rows = LRU(16)
    current: list[Any] = [
        None,
        None,
        None,
        None,
        {},
        StepInfo(-1, 0, 0.0, float("nan")),
    ]  # shape, sig, ss, plan, row, info
    static_off = schedule.is_off or not schedule.ratios

    def repick(options: dict[str, Any]) -> None:
        shape, plan = options.get("original_shape"), options.get(PLAN_KEY)
        info = steps(options)
        key = (
            tuple(int(d) for d in shape) if isinstance(shape, (list, tuple)) else None,
            schedule.active_at(info.progress),
            id(plan),
        )
        if plan is not current[3]:
            rows.clear()  # a new plan: its ids may be reused later, never serve an old plan's row
        current[:] = [shape, options.get("sigmas"), options.get("sample_sigmas"), plan, rows.get_or(key, dict), info]

    def entry_for(n: torch.Tensor, tidx: Any, options: dict[str, Any]) -> _Call | None:
        """Build (once) what a call with n's token count at transformer index tidx does in the current row."""
        grid = infer_grid(n.shape[1], options.get("original_shape"))
        if grid is None:
            return None
        level, h, w = grid
        t = int(options.get("transformer_index", options.get("block_index", 0)) or 0)
        info: StepInfo = current[5]
        ratio = schedule.ratio_for(level, t) if schedule.active_at(info.progress) else 0.0
        fn = None
        if ratio > 0.0 and schedule.strategy == "todo" and schedule.adaptive == 0.0 and current[3] is None:
            fn = state.pool_fn(h, w, ratio)
        if ratio > 0.0 and schedule.device_aware and not calibrated(n, options, level, h, w, ratio, fn, info.step):
            ratio, fn = 0.0, None
        return _Call(_block_label(options), level, h, w, ratio, fn)

    def calibrated(
        n: torch.Tensor, options: dict[str, Any], level: int, h: int, w: int, ratio: float, fn: Any, step: int
    ) -> bool:
        """Device-aware schedules: whether reducing this level pays here (measured once per shape, see calibrate.py)."""

        def kv_of(x: torch.Tensor) -> torch.Tensor:
            if fn is not None:
                out: torch.Tensor = fn(x)
                return out
            return reduce(state, x, x, x, dict(options), level, h, w, ratio, step)[1]  # type: ignore[no-any-return]

        heads = int(options.get("n_heads") or 8)
        dim_head = int(options.get("dim_head") or max(1, n.shape[2] // heads))
        key = (schedule.strategy, kernel_for_ratio(ratio), options.get(PLAN_KEY) is not None)
        check = calibrate.check_level(n, kv_of, level, heads, dim_head, key)
        telemetry.note_level(check)
        return check.kept

    def attn1_patch(
        n: torch.Tensor, ctx: Any, val: Any, extra_options: dict[str, Any]
    ) -> tuple[torch.Tensor, Any, Any]:
        if static_off or n.ndim != 3 or extra_options.get(DISABLED_KEY):
            return n, ctx, val
        t0 = time.perf_counter() if timing else 0.0
        if (
            extra_options.get("sigmas") is not current[1]
            or extra_options.get("original_shape") is not current[0]
            or extra_options.get(PLAN_KEY) is not current[3]
            or extra_options.get("sample_sigmas") is not current[2]
        ):
            repick(extra_options)
        n_tok = n.shape[1]
        tidx = extra_options.get("transformer_index")
        by_tidx = current[4].get(n_tok)
        if by_tidx is None:
            by_tidx = current[4][n_tok] = {}
        call = by_tidx.get(tidx, _MISSING)
        if call is _MISSING:
            call = by_tidx[tidx] = entry_for(n, tidx, extra_options)
        if call is None:
            return n, ctx, val
        info: StepInfo = current[5]
        kv_in = ctx.shape[1] if isinstance(ctx, torch.Tensor) and ctx.ndim == 3 else n_tok
        out = (n, ctx, val)
        if call.ratio > 0.0:
            try:
                if call.fn is not None and ctx is n and val is n:  # the common todo case: one pool, shared K/V
                    kv = call.fn(n)
                    out = (n, kv, kv)
                else:
                    ratio = call.ratio
                    if schedule.adaptive > 0.0:
                        c = complexity.get_or(
                            (info.step, info.sigma, call.level, n.shape[0]), lambda: token_complexity(n, call.h, call.w)
                        )
                        ratio = adapt_ratio(ratio, c, schedule.adaptive, MAX_RATIO)
                    if ratio > 0.0:
                        out = reduce(state, n, ctx, val, extra_options, call.level, call.h, call.w, ratio, info.step)
            except Exception as exc:  # a shape we did not foresee: run this call unreduced, never crash sampling
                warn_once(
                    "reduce",
                    "TokenFuse: token reduction skipped (%s: %s); attention runs unchanged",
                    type(exc).__name__,
                    exc,
                )
                out = (n, ctx, val)
        new_n, new_ctx = out[0], out[1]
        kv_out = new_ctx.shape[1] if isinstance(new_ctx, torch.Tensor) and new_ctx.ndim == 3 else new_n.shape[1]
        telemetry.record(
            call.label,
            call.level,
            info.step,
            info.sigma,
            n_tok,
            new_n.shape[1],
            kv_in,
            kv_out,
            schedule.strategy,
            (time.perf_counter() - t0) if timing else None,
        )
        return out

    def attn1_output_patch(n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        entry = extra_options.pop(UNMERGE_KEY, None)
        if entry is None:
            return n
        unmerge, merged_len = entry
        if n.ndim != 3 or n.shape[1] != merged_len:
            warn_once(
                "unmerge",
                "TokenFuse: attention output has %s tokens, expected %d (another patch changed it); left as is",
                tuple(n.shape),
                merged_len,
            )
            return n
        t0 = time.perf_counter() if timing else 0.0
        out: torch.Tensor = unmerge(n)
        if timing:
            telemetry.add_seconds(time.perf_counter() - t0)
        return out

    # Under ComfyUI's TorchCompileModel dynamo would trace into the closures and guard on the tables they fill and the
    # per-model-call objects they compare (a recompile every step until the recompile limit, then eager). Disabled for
    # dynamo, each patch is one graph break that runs eagerly (microseconds of host work) and the graphs between them
    # stay stable across steps. Eager cost of the wrapper: ~0.3 us per call.
    return eager_under_compile(attn1_patch), eager_under_compile(attn1_output_patch)


def build_attention_override(schedule: Schedule, telemetry: RunTelemetry) -> Callable[..., Any]:
    """override(func, *args, **kwargs) for transformer_options["optimized_attention_override"] (DiT families).

    ComfyUI calls it as override(attention_fn, q, k, v, heads, [mask], ..., skip_reshape=..., transformer_options=...);
    q/k/v are projected: [B, N, H*D], or [B, H, N, D] with skip_reshape. Inside the window and past the protected
    blocks, self-attention calls (k has q's token count, no mask) keep the top (1 - dit_ratio) K/V tokens by
    saliency; everything else is passed through untouched.
    """
    steps = _StepTracker()

    def override(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if schedule.dit_ratio <= 0.0 or schedule.end_percent <= schedule.start_percent or len(args) < 3:
            return func(*args, **kwargs)
        q, k, v = args[0], args[1], args[2]
        mask = args[4] if len(args) > 4 else kwargs.get("mask")
        topts = kwargs.get("transformer_options") or {}
        if topts.get(DISABLED_KEY):
            return func(*args, **kwargs)
        tok_dim = 2 if kwargs.get("skip_reshape", False) else 1
        if (
            mask is not None
            or not all(isinstance(t, torch.Tensor) for t in (q, k, v))
            or k.ndim != tok_dim + 2
            or k.shape != v.shape
            or k.shape[tok_dim] != q.shape[tok_dim]
            or k.shape[tok_dim] < MIN_DIT_TOKENS
        ):
            return func(*args, **kwargs)
        info = steps(topts)
        bidx = topts.get("block_index")
        if not schedule.active_at(info.progress) or (isinstance(bidx, int) and bidx < schedule.protect_blocks):
            return func(*args, **kwargs)
        t0 = time.perf_counter() if schedule.time_calls else 0.0
        n_tok = k.shape[tok_dim]
        keep = keep_count(n_tok, schedule.dit_ratio)
        if keep >= n_tok:
            return func(*args, **kwargs)
        idx = topk_indices(k, keep, None, tok_dim)
        k2, v2 = gather_tokens(k, idx, tok_dim), gather_tokens(v, idx, tok_dim)
        telemetry.record(
            str(topts.get("block_index", "?")),
            0,
            info.step,
            info.sigma,
            n_tok,
            n_tok,
            n_tok,
            keep,
            "topk",
            (time.perf_counter() - t0) if schedule.time_calls else None,
        )
        return func(q, k2, v2, *args[3:], **kwargs)

    return override
