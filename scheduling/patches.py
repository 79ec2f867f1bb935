"""Attention patch closures built from a Schedule: what the ComfyUI glue attaches to a cloned model.

U-Net families (SD1.x/2.x, SDXL): `build_unet_patches` -> (attn1_patch, attn1_output_patch) for
`m.set_model_attn1_patch(f)` / `m.set_model_attn1_output_patch(g)`.
- f(n, ctx, val, extra_options) -> (n, ctx, val): n = norm1(x) [B, N, C] before projection; ComfyUI passes ctx and val
  as the same object as n for self-attention. tome merges n (and ctx/val when they are the same tokens); todo and topk
  shrink only ctx/val. Other packs' patches may run before or after ours: we only touch ctx/val that still have N
  tokens, and merge q-only when they do not.
- g(n, extra_options) -> n restores N tokens after a tome merge. The unmerge travels from f to g inside
  `extra_options`, a fresh dict per BasicTransformerBlock call, so concurrent blocks can never mix them up.
- Under torch.compile (ComfyUI's TorchCompileModel) `build_unet_hooks` adds a DIFFUSION_MODEL wrapper: once per model
  call, eagerly, it hands the patches a frozen table of what each attention call does (TRACE_KEY), so they trace to
  plain tensor ops (K/V pooling, around a TOKEN_PLAN's protected cells too; top-K K/V, a fixed count selected in the
  graph; or nothing) and the U-Net stays one graph. The first model call of a (shape, step window, plan) runs
  eagerly, whole, while the patches fill that table (a new TOKEN_PLAN, e.g. each face crop, is learnt again).
  Adaptive ratios (the lowvram presets) hold what their learning call adapted to for the window, and tome the
  learning call's src/dst partition (eager re-draws it every step); its merge and unmerge trace in the graph, the
  unmerge passed between the two patches in extra_options (TRACED_UNMERGE_KEY). K/V that another pack's patch
  already replaced are reduced in the graph too (where they still hold the block's tokens, as eagerly); only a call
  the table misses is one graph break into the eager patch (and its row is learnt again).
DiT families: scheduling/dit_override.py (the attention override).

Every closure returns its inputs unchanged (same objects) when the schedule is off, outside the sigma window, in a
protected block, at a level with ratio 0, or when the call does not look like a known token grid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from . import calibrate
from .adaptive import LaggedComplexity, adapt_ratio
from .downsample import kernel_for_ratio, pool_keeping, pool_tokens
from .keys import (
    DISABLED_KEY,
    NEIGHBOURS_KEY,
    PLAN_KEY,
    SHALLOW_KEY,
    STEP_KEY,
    TRACE_KEY,
    TRACED_UNMERGE_KEY,
    UNMERGE_KEY,
)
from .merge import bipartite_soft_matching_2d
from .neighbours import neighbours_of, stands_aside
from .reducers import LRU, REDUCERS, ReduceState, kv_targets, tome_parts
from .schedule import MAX_RATIO, Schedule
from .step_state import run_steps
from .telemetry import RunTelemetry
from .topk import gather_tokens, keep_count, topk_indices
from .vocabulary import do_nothing

log = logging.getLogger(__name__)


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


class StepTracker:
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


class TopK(NamedTuple):
    """A traced top-K K/V call: how many tokens to keep and the plan's ROI bonus [B, N] (None without a plan)."""

    keep: int
    bonus: torch.Tensor | None


class Tome(NamedTuple):
    """A traced tome call: the src/dst partition and protected tokens on the device, and the merge count r."""

    src: torch.Tensor
    dst: torch.Tensor
    r: int
    protected: torch.Tensor | None


class _Call(NamedTuple):
    """What attention calls at one (token count, transformer index) do in one table row (built once, then looked up)."""

    label: str  # telemetry block label, e.g. "input.1.0"
    level: int  # 8 / 16 / 32 / 64
    h: int
    w: int
    ratio: float  # base ratio after block protection, ramp and step window (0 = identity)
    fn: Callable[[torch.Tensor], torch.Tensor] | None  # prebuilt K/V reduction for non-adaptive todo
    keep: tuple[torch.Tensor, torch.Tensor] | None = None  # with a plan: (free cells, full-resolution tokens)
    topk: TopK | None = None  # top-K K/V: what a traced call needs (the eager call selects through the reducer)
    tome: Tome | None = None  # tome under compile: the learning call's partition, held for the step window


# A traced call's action: None = identity, EAGER = the eager patch, TopK, Tome, or K/V pooling (h, w, kernel, pool mode,
# free cells, full-resolution tokens), the last two None without a plan (downsample.pool_tokens / pool_keeping)
TraceAction = tuple[int, int, tuple[int, int], str, torch.Tensor | None, torch.Tensor | None] | TopK | Tome | str | None
EAGER = "eager"
LEARN = "learn"  # trace_table's answer while a row is learnt: run the model call eagerly


def _call_with(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


def traced_call_wrapper(
    decide: Callable[[tuple[int, ...], dict[str, Any]], Any],
    after: Callable[[dict[str, Any]], None],
    ours: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """The DIFFUSION_MODEL wrapper the U-Net patches and the DiT override share under torch.compile.

    Per compiled model call, eagerly (one graph break before the model): decide(latent shape, transformer_options)
    gives what the traced patches read from transformer_options[TRACE_KEY], LEARN to run the whole call eagerly
    (traced, its graph breaks would compile fragments and use up dynamo's recompile limits), or None for nothing;
    after(transformer_options) runs eagerly once the call is done. Not compiling, it only calls the model. ours: the
    attn1 patch as registered (U-Net): the call's Neighbours of it go to the patches in NEIGHBOURS_KEY.
    """
    decide_eager, after_eager, call_eager = (eager_under_compile(f) for f in (decide, after, _call_with))

    def diffusion_model_wrapper(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        compiling = torch.compiler.is_compiling()
        if (not compiling and ours is None) or not args or not isinstance(args[0], torch.Tensor):
            return executor(*args, **kwargs)
        where, opts = transformer_options_of(args, kwargs)
        if opts is None:
            return executor(*args, **kwargs)
        if ours is not None and (nb := neighbours_of(opts, ours)) is not None:
            opts = {**opts, NEIGHBOURS_KEY: nb}
            args, kwargs = with_transformer_options(where, opts, args, kwargs)
        if not compiling:
            return executor(*args, **kwargs)
        value = decide_eager(tuple(args[0].shape), opts)
        if value is LEARN:
            out = call_eager(executor, args, kwargs)
        else:
            if value is not None:
                opts = {**opts, TRACE_KEY: value}
                args, kwargs = with_transformer_options(where, opts, args, kwargs)
            out = executor(*args, **kwargs)
        after_eager(opts)
        return out

    return diffusion_model_wrapper


def with_transformer_options(
    where: int | str, opts: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of a DIFFUSION_MODEL call with its transformer_options (found at `where`) replaced by opts."""
    if isinstance(where, int):
        return (*args[:where], opts, *args[where + 1 :]), kwargs
    return args, {**kwargs, "transformer_options": opts}


def transformer_options_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | str, dict[str, Any] | None]:
    """Where a DIFFUSION_MODEL executor call carries transformer_options (the argument order differs per model): the
    keyword, else the last positional dict (after `control`, which can be a dict too)."""
    opts = kwargs.get("transformer_options")
    if isinstance(opts, dict):
        return "transformer_options", opts
    for i in range(len(args) - 1, -1, -1):
        if isinstance(args[i], dict):
            return i, args[i]
    return "", None


@dataclass
class _Row:
    """What the attention calls of one (latent shape, step window, plan) do: entries built by the eager patch, then,
    for compiled U-Nets, frozen into the table the traced patch reads."""

    calls: dict[int, dict[Any, _Call | None]] = field(default_factory=dict)  # token count -> transformer index -> call
    learning: bool = False  # the eager patches are filling this row for the trace table (one model call)
    learnt: bool = False  # ... and a whole U-Net call did (not a step cache's cached step: it skips the deep blocks)
    # the learning call's telemetry records, replayed per traced call: (call key, block, (label, level, tokens...))
    replay: list[tuple[tuple[int, Any], Any, tuple[str, int, int, int, int, int]]] = field(default_factory=list)
    # under compile, adaptive ratios and tome: the learning call's reduction per call key, held for the row's window
    held: dict[tuple[int, Any], _Call] = field(default_factory=dict)
    frozen: dict[tuple[int, Any], TraceAction] | None = None


def _runs_shallow(block: Any, shallow: tuple[int, int]) -> bool:
    """Whether a block runs in a step cache's cached step: (depth d, n output blocks) -> input < d, output >= n - d."""
    depth, n_blocks = shallow
    if not (isinstance(block, (tuple, list)) and len(block) >= 2):
        return True
    kind, index = block[0], int(block[1])
    return (kind == "input" and index < depth) or (kind == "output" and index >= n_blocks - depth)


class UnetHooks(NamedTuple):
    """What `build_unet_hooks` returns: the two attn1 patches and the DIFFUSION_MODEL wrapper feeding them under
    torch.compile (see the module docstring)."""

    attn1_patch: AttnPatch
    attn1_output_patch: OutputPatch
    diffusion_model_wrapper: Callable[..., Any]


def _block_label(options: dict[str, Any]) -> str:
    block = options.get("block")
    if isinstance(block, (tuple, list)) and len(block) >= 2:
        return f"{block[0]}.{block[1]}.{options.get('block_index', 0)}"
    return str(options.get("block_index", "?"))


def build_unet_patches(schedule: Schedule, telemetry: RunTelemetry) -> tuple[AttnPatch, OutputPatch]:
    """(attn1_patch, attn1_output_patch) closures for a U-Net model (see module docstring). Without the wrapper of
    `build_unet_hooks` they still work under torch.compile, each call one graph break."""
    hooks = build_unet_hooks(schedule, telemetry)
    return hooks.attn1_patch, hooks.attn1_output_patch


def build_unet_hooks(schedule: Schedule, telemetry: RunTelemetry) -> UnetHooks:
    """The attn1 patches of a U-Net model and the DIFFUSION_MODEL wrapper that keeps them traceable under compile."""
    steps = StepTracker()
    state = ReduceState(schedule)  # the reducers' caches (partitions, plan ROI tensors, pooling closures)
    reduce = REDUCERS[schedule.strategy]
    complexity = LaggedComplexity()  # a step adapts to its previous step's statistic: no device sync
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
        _Row(),
        StepInfo(-1, 0, 0.0, float("nan")),
    ]  # shape, sig, ss, plan, row, info
    static_off = schedule.is_off or not schedule.ratios

    def repick(options: dict[str, Any], shape: Any = _MISSING) -> None:
        shape = options.get("original_shape") if shape is _MISSING else shape
        plan = options.get(PLAN_KEY)
        info = steps(options)
        key = (
            tuple(int(d) for d in shape) if isinstance(shape, (list, tuple)) else None,
            schedule.active_at(info.progress),
            id(plan),
        )
        if plan is not current[3]:
            rows.clear()  # a new plan: its ids may be reused later, never serve an old plan's row
        current[:] = [shape, options.get("sigmas"), options.get("sample_sigmas"), plan, rows.get_or(key, _Row), info]

    def elsewhere(n: torch.Tensor, options: dict[str, Any]) -> bool:
        """A call to leave alone whatever the table says: tiles of another patch (HyperTile: a batch of tiles, whose
        token count can equal a coarser level's), or a block whose neighbours need its own K/V (Neighbours)."""
        shape = options.get("original_shape")
        if shape is not None and len(shape) > 0 and n.shape[0] != shape[0]:
            warn_once(
                "tiles",
                "TokenFuse: attention calls with a batch of %d for a latent batch of %d (another node tiles them, e.g. "
                "HyperTile) are left unreduced",
                n.shape[0],
                shape[0],
            )
            return True
        nb = options.get(NEIGHBOURS_KEY)
        if nb is not None and stands_aside(nb, options, schedule.strategy):
            if nb.followed and schedule.strategy == "topk":
                warn_once(
                    "followed",
                    "TokenFuse: another attn1 patch runs after TokenFuse (e.g. HyperTile) and needs the keys/values "
                    "as a grid: strategy topk leaves attention unreduced (todo keeps a grid; or apply that node "
                    "before TokenSchedulerController)",
                )
            else:
                warn_once(
                    "replaced",
                    "TokenFuse: attention of blocks another node replaces (e.g. PAG, SAG: %s) left unreduced: the "
                    "replacement needs the block's own keys/values",
                    sorted(nb.replaced, key=str),
                )
            return True
        return False

    def entry_for(n: torch.Tensor, tidx: Any, options: dict[str, Any]) -> _Call | None:
        """Build (once) what a call with n's token count at transformer index tidx does in the current row."""
        grid = infer_grid(n.shape[1], options.get("original_shape"))
        if grid is None and options.get("original_shape") is not None:  # once per table row and token count
            warn_once(
                "grid",
                "TokenFuse: an attention call with %d tokens matches no latent grid of this image (another node merged "
                "tokens before TokenFuse, e.g. ComfyUI's TomePatchModel applied first?); TokenFuse leaves those calls "
                "alone. Apply TomePatchModel after TokenSchedulerController, or use one of them.",
                n.shape[1],
            )
        if grid is None:
            return None
        level, h, w = grid
        t = int(options.get("transformer_index", options.get("block_index", 0)) or 0)
        info: StepInfo = current[5]
        ratio = schedule.ratio_for(level, t) if schedule.active_at(info.progress) else 0.0
        call = _Call(_block_label(options), level, h, w, ratio, None)
        if ratio > 0.0 and schedule.adaptive == 0.0 and schedule.strategy != "tome":  # tome: per step, eagerly
            call = settled(call, n, ratio, info.step)
        if ratio > 0.0 and schedule.device_aware and not calibrated(n, options, level, h, w, ratio, call.fn, info.step):
            call = call._replace(ratio=0.0, fn=None, keep=None, topk=None)
        return call

    def settled(call: _Call, n: torch.Tensor, ratio: float, step: int) -> _Call:
        """call at this ratio with what its reduction needs in the current row (around its plan's protected tokens):
        todo's prebuilt K/V pooling, top-K's kept count and ROI bonus, tome's partition of this step and r."""
        plan, batch, h, w = current[3], n.shape[0], call.h, call.w
        if ratio <= 0.0:
            return call._replace(ratio=ratio)
        if schedule.strategy == "tome":
            return call._replace(ratio=ratio, tome=Tome(*tome_parts(state, n, plan, h, w, ratio, step)))
        if schedule.strategy == "topk":
            bonus, min_keep = (None, 0) if plan is None else state.topk_bonus(plan, h, w, batch, n.device)
            return call._replace(ratio=ratio, topk=TopK(keep_count(h * w, ratio, min_keep), bonus))
        if plan is None:
            return call._replace(ratio=ratio, fn=state.pool_fn(h, w, ratio))
        fn = state.plan_pool_fn(plan, h, w, batch, ratio, n.device)
        return call._replace(
            ratio=ratio, fn=fn, keep=state.plan_keep(plan, h, w, batch, kernel_for_ratio(ratio), n.device)
        )

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
        shape = current[0]
        if ((shape is not None and n.shape[0] != shape[0]) or NEIGHBOURS_KEY in extra_options) and elsewhere(
            n, extra_options
        ):
            return n, ctx, val
        n_tok = n.shape[1]
        tidx = extra_options.get("transformer_index")
        row: _Row = current[4]
        by_tidx = row.calls.get(n_tok)
        if by_tidx is None:
            by_tidx = row.calls[n_tok] = {}
        call = by_tidx.get(tidx, _MISSING)
        if call is _MISSING:
            call = by_tidx[tidx] = entry_for(n, tidx, extra_options)
            row.frozen = None  # a call the frozen table missed (its learning call skipped blocks): learn it again
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
                        key = (call.level, n.shape[0])
                        c = complexity(key, current[2], info.step, info.sigma, n, call.h, call.w, now=row.learning)
                        ratio = adapt_ratio(ratio, c, schedule.adaptive, MAX_RATIO)
                    if row.learning and (schedule.adaptive > 0.0 or schedule.strategy == "tome"):
                        row.held[(n_tok, tidx)] = settled(call, n, ratio, info.step)  # compiled calls hold it
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
        if row.learning:
            rec = (call.label, call.level, n_tok, new_n.shape[1], kv_in, kv_out)
            row.replay.append(((n_tok, tidx), extra_options.get("block"), rec))
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

    def traced_action(call: _Call | None) -> TraceAction:
        if call is None or call.ratio <= 0.0 or call.fn is do_nothing:
            return None
        if call.topk is not None:
            return None if call.topk.keep >= call.h * call.w else call.topk
        if call.tome is not None:
            return call.tome if 0 < call.tome.r and call.tome.dst.numel() > 0 else None
        if call.fn is None:
            return EAGER
        free, full = call.keep if call.keep is not None and call.keep[1].numel() > 0 else (None, None)
        return (call.h, call.w, kernel_for_ratio(call.ratio), schedule.pool, free, full)

    pending: list[_Row | None] = [None]  # the row of the compiled model call in flight

    def trace_table(shape: tuple[int, ...], options: dict[str, Any]) -> dict[tuple[int, Any], TraceAction] | str | None:
        """Once per compiled model call, eagerly, before it: the frozen table of the current row, LEARN while the
        eager patches learn it, None when the patches pass everything through."""
        pending[0] = None
        if static_off or options.get(DISABLED_KEY):
            return None
        repick(options, list(shape))
        row: _Row = current[4]
        pending[0] = row
        if row.frozen is None and row.learning and row.learnt:
            table = {
                (n_tok, t): traced_action(row.held.get((n_tok, t), c))
                for n_tok, by in row.calls.items()
                for t, c in by.items()
            }
            row.replay = [r for r in row.replay if table[r[0]] != EAGER]  # eager calls record themselves
            row.frozen, row.learning = table, False
            if EAGER in table.values():
                warn_once(
                    "compile",
                    "TokenFuse: under torch.compile this schedule (strategy %s) runs %d kinds of attention call "
                    "eagerly (calls its learning model call did not settle), one graph break each, which can make the "
                    "compiled model slower than unpatched",
                    schedule.strategy,
                    sum(1 for a in table.values() if a == EAGER),
                )
            if row.held:
                held = [f"the adaptive ratio (adaptive {schedule.adaptive})"] if schedule.adaptive > 0.0 else []
                held += ["tome's src/dst partition"] if schedule.strategy == "tome" else []
                warn_once(
                    "held",
                    "TokenFuse: under torch.compile %s is chosen on the first model call of each step window and held "
                    "for the window (eager chooses it every step), so compiled samples can differ slightly from eager "
                    "ones",
                    " and ".join(held),
                )
        if row.frozen is None:
            row.learning, row.learnt, row.replay, row.held = True, False, [], {}
            return LEARN
        return row.frozen

    def after_call(options: dict[str, Any]) -> None:
        """After a compiled model call, eagerly: the telemetry of its traced calls (a cached step of the step cache,
        SHALLOW_KEY, ran only the shallow blocks), or whether a learning call was a whole U-Net call."""
        row = pending[0]
        if row is None:
            return
        shallow = options.get(SHALLOW_KEY)
        if row.learning:
            row.learnt = shallow is None and bool(row.calls)
            return
        info: StepInfo = current[5]
        for _, block, (label, level, q_in, q_out, kv_in, kv_out) in row.replay:
            if shallow is None or _runs_shallow(block, shallow):
                telemetry.record(label, level, info.step, info.sigma, q_in, q_out, kv_in, kv_out, schedule.strategy)

    # Under ComfyUI's TorchCompileModel dynamo would trace into the closures and guard on the tables they fill and the
    # per-model-call objects they compare (a recompile every step until the recompile limit, then eager). So the host
    # work runs eagerly: per model call in the wrapper (one graph break before the U-Net), and the traced patches
    # read only the frozen table (a guard that changes with the step window, not per step). A call the table does not
    # settle is one graph break into the eager patch. Eager (not compiling) the patches run directly.
    attn1_eager, output_eager = eager_under_compile(attn1_patch), eager_under_compile(attn1_output_patch)

    def attn1_traced(
        n: torch.Tensor, ctx: Any, val: Any, extra_options: dict[str, Any]
    ) -> tuple[torch.Tensor, Any, Any]:
        table = extra_options.get(TRACE_KEY)  # only in a compiled model call (the wrapper, build_unet_hooks)
        if table is None:
            if not torch.compiler.is_compiling():
                return attn1_patch(n, ctx, val, extra_options)
            if static_off or n.ndim != 3 or extra_options.get(DISABLED_KEY):
                return n, ctx, val
            out: tuple[torch.Tensor, Any, Any] = attn1_eager(n, ctx, val, extra_options)  # no wrapper: a graph break
            return out
        if elsewhere(n, extra_options):
            return n, ctx, val
        # The table's action, traced, or run eagerly where dynamo left a frame eager: either way the wrapper replays
        # the telemetry of a settled call, so this path never records it.
        action = table.get((n.shape[1], extra_options.get("transformer_index")), EAGER) if n.ndim == 3 else None
        if action is None:
            return n, ctx, val
        if not isinstance(action, tuple):  # EAGER: the eager patch, which records its own telemetry
            out = attn1_eager(n, ctx, val, extra_options)
            return out
        if isinstance(action, Tome):
            merge, unmerge = bipartite_soft_matching_2d(n, action.src, action.dst, action.r, action.protected)
            merged = merge(n)
            extra_options[TRACED_UNMERGE_KEY] = (unmerge, merged.shape[1])
            return (merged, *kv_targets(n, ctx, val, merge, merged))
        if isinstance(action, TopK):
            idx = topk_indices(n, action.keep, action.bonus)
            return (n, *kv_targets(n, ctx, val, lambda t: gather_tokens(t, idx)))
        h, w, kernel, mode, free, full = action
        if free is None:
            return (n, *kv_targets(n, ctx, val, lambda t: pool_tokens(t, h, w, kernel, mode)))
        return (n, *kv_targets(n, ctx, val, lambda t: pool_keeping(t, h, w, kernel, mode, free, full)))

    def attn1_output_traced(n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return attn1_output_patch(n, extra_options)
        traced = extra_options.pop(TRACED_UNMERGE_KEY, None)  # a tome merge traced in this graph: unmerge in it too
        if traced is not None:
            unmerge, merged_len = traced
            return unmerge(n) if n.ndim == 3 and n.shape[1] == merged_len else n  # another patch changed it: as is
        if UNMERGE_KEY not in extra_options:  # only a tome merge done by the eager patch leaves an unmerge
            return n
        out: torch.Tensor = output_eager(n, extra_options)
        return out

    return UnetHooks(attn1_traced, attn1_output_traced, traced_call_wrapper(trace_table, after_call, attn1_traced))
