"""The DiT attention override (Flux, SD3, Wan, Qwen-Image, HunyuanVideo, LTXV): top-K keys/values on the 1-D sequence.

`build_attention_override` -> override(func, *args, **kwargs) for `transformer_options["optimized_attention_override"]`
(the grid is unknown, so saliency picks the kept K/V tokens). `build_dit_hooks` adds the DIFFUSION_MODEL wrapper that
keeps it traceable under torch.compile (ComfyUI's TorchCompileModel): the step window's state per model call.
`build_plan_wrapper` maps a TOKEN_PLAN onto the joint sequence of the Flux family (text tokens, then the 2x2-patchified
latent grid), so face tokens and the prompt's tokens win the top-K there as face tokens do on a U-Net.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from .compile_wrapper import (
    LEARN,
    eager_under_compile,
    traced_call_wrapper,
    transformer_options_of,
    with_transformer_options,
)
from .keys import DISABLED_KEY, DIT_PLAN_KEY, PLAN_KEY, TRACE_KEY
from .schedule import Schedule
from .step_tracker import StepTracker
from .telemetry import RunTelemetry
from .topk import gather_tokens, keep_count, topk_indices
from .transfer import to_device

log = logging.getLogger(__name__)

MIN_DIT_TOKENS = 64
TEXT_BONUS = 3.0  # above a protected face token's importance + 2: the prompt's tokens are kept first


class DitPlan(NamedTuple):
    """A TOKEN_PLAN mapped onto one DiT model call's joint sequence (`build_plan_wrapper`).

    bonus: [B, T + gh * gw] ROI bonus on the call's device (text tokens TEXT_BONUS, image tokens importance + 2 where
    protected); tokens after those (reference latents) get none. min_keep: T + the most protected image tokens.
    """

    bonus: torch.Tensor
    min_keep: int


def plan_bonus(plan: Any, text_tokens: int, grid_h: int, grid_w: int, x: torch.Tensor) -> DitPlan:
    """The plan on a [text (T), latent grid (grid_h x grid_w, row-major)] sequence, as the U-Net top-K reads it.

    x: the model call's latent [B, C, H, W] (its batch size and device). Built on the CPU and copied to x's device
    once: the protected count is read on the host, never from the device."""
    batch, device = int(x.shape[0]), x.device
    imp = plan.level_importance(grid_h, grid_w, batch).cpu()
    protected = imp >= float(plan.protect_threshold)
    text = torch.full((batch, text_tokens), TEXT_BONUS, dtype=imp.dtype)
    bonus = torch.cat([text, imp + 2.0 * protected.to(imp.dtype)], dim=1)
    return DitPlan(to_device(bonus, device), text_tokens + int(protected.sum(1).max()))


def build_plan_wrapper(patch_size: int) -> Callable[..., Any]:
    """DIFFUSION_MODEL wrapper for the Flux family (Flux, Chroma): per model call with a TOKEN_PLAN, the plan mapped
    onto its joint sequence goes to the attention override in transformer_options[DIT_PLAN_KEY].

    Flux-style models patchify the latent x [B, C, H, W] (padded up to the patch size) into ceil(H / p) x ceil(W / p)
    tokens and attend over [text (context's T tokens), image tokens, reference latents]; the double and the single
    blocks see that same sequence. Without a plan, or with scheduling off, the call passes through untouched.
    Computed eagerly (a graph break under torch.compile), cached for the last (plan, T, grid, batch, device).
    """
    last: list[tuple[tuple[Any, ...], Any, DitPlan]] = []

    def mapped(plan: Any, x: torch.Tensor, text_tokens: int) -> DitPlan:
        gh, gw = -(-int(x.shape[-2]) // patch_size), -(-int(x.shape[-1]) // patch_size)
        key = (id(plan), text_tokens, gh, gw, int(x.shape[0]), x.device)
        if not last or last[0][0] != key or last[0][1] is not plan:
            last[:] = [(key, plan, plan_bonus(plan, text_tokens, gh, gw, x))]
        return last[0][2]

    mapped_eager = eager_under_compile(mapped)

    def tokenfuse_dit_plan(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        where, opts = transformer_options_of(args, kwargs)
        x = args[0] if args else None
        context = args[2] if len(args) > 2 else kwargs.get("context")
        plan = opts.get(PLAN_KEY) if opts is not None else None
        if (
            opts is None
            or plan is None
            or not hasattr(plan, "level_importance")
            or opts.get(DISABLED_KEY)
            or not isinstance(x, torch.Tensor)
            or x.ndim != 4
            or not isinstance(context, torch.Tensor)
            or context.ndim != 3
        ):
            return executor(*args, **kwargs)
        fn = mapped_eager if torch.compiler.is_compiling() else mapped
        opts = {**opts, DIT_PLAN_KEY: fn(plan, x, int(context.shape[1]))}
        args, kwargs = with_transformer_options(where, opts, args, kwargs)
        return executor(*args, **kwargs)

    return tokenfuse_dit_plan


def build_attention_override(schedule: Schedule, telemetry: RunTelemetry) -> Callable[..., Any]:
    """override(func, *args, **kwargs) for transformer_options["optimized_attention_override"] (DiT families).

    ComfyUI calls it as override(attention_fn, q, k, v, heads, [mask], ..., skip_reshape=..., transformer_options=...);
    q/k/v are projected: [B, N, H*D], or [B, H, N, D] with skip_reshape (SD3's MMDiT passes v as [B, N, H, D]).
    Inside the window and past the protected blocks, self-attention calls (k has q's token count, no mask) keep the
    top (1 - dit_ratio) K/V tokens by saliency; everything else is passed through untouched. Without the wrapper of
    `build_dit_hooks`, torch.compile recompiles it every step (it reads the step).
    """
    return build_dit_hooks(schedule, telemetry).override


@dataclass
class _DitFlight:
    """The compiled DiT model call in flight: the (shape, window state) it learns eagerly and that call's telemetry
    records, or the key whose records a traced call replays."""

    learning: tuple[tuple[int, ...], bool, int] | None = None
    records: list[tuple[str, int, int]] = field(default_factory=list)
    traced: tuple[tuple[int, ...], bool, int] | None = None


class DitHooks(NamedTuple):
    """What `build_dit_hooks` returns: the attention override and the DIFFUSION_MODEL wrapper that keeps it traceable
    under torch.compile."""

    override: Callable[..., Any]
    diffusion_model_wrapper: Callable[..., Any]


class DitState:
    """What one patched DiT's override and wrapper share: the schedule and telemetry, the step of a model call, the
    learnt telemetry records per (latent shape, window state, plan) and the compiled call in flight."""

    def __init__(self, schedule: Schedule, telemetry: RunTelemetry) -> None:
        self.schedule = schedule
        self.telemetry = telemetry
        self.steps = StepTracker()
        self.replays: dict[tuple[tuple[int, ...], bool, int], list[tuple[str, int, int]]] = {}
        self.flight = _DitFlight()
        self.off = schedule.dit_ratio <= 0.0 or schedule.end_percent <= schedule.start_percent
        self.plan_unused_warned = False  # a TOKEN_PLAN reached a call without its sequence mapping


def _plan_importance(topts: dict[str, Any], k: torch.Tensor, n_tok: int) -> tuple[torch.Tensor | None, int]:
    """(importance [B, n_tok] or None, tokens to keep at least) of the call's mapped plan (`build_plan_wrapper`)."""
    plan = topts.get(DIT_PLAN_KEY)
    if isinstance(plan, DitPlan) and plan.bonus.shape[0] == k.shape[0] and plan.bonus.shape[1] <= n_tok:
        # an image-only sequence (no text in front) is shorter than the plan's: it passes without the plan
        extra = n_tok - plan.bonus.shape[1]  # reference latents after the image: no bonus
        return (plan.bonus if extra == 0 else F.pad(plan.bonus, (0, extra))), plan.min_keep
    return None, 0


def top_kv(
    st: DitState, args: tuple[Any, ...], kwargs: dict[str, Any], active: bool
) -> tuple[Any, Any, int, int] | None:
    """The tensor side of a call (traceable): (k', v', tokens, kept) with the top-K K/V when active and past the
    protected blocks, else None."""
    k, v = args[1], args[2]
    topts = kwargs.get("transformer_options") or {}
    bidx = topts.get("block_index")
    tok_dim = 2 if kwargs.get("skip_reshape", False) else 1
    n_tok = k.shape[tok_dim]
    importance, min_keep = _plan_importance(topts, k, n_tok)
    keep = keep_count(n_tok, st.schedule.dit_ratio, min_keep)
    if not active or (isinstance(bidx, int) and bidx < st.schedule.protect_blocks) or keep >= n_tok:
        return None
    idx = topk_indices(k, keep, importance, tok_dim)
    return gather_tokens(k, idx, tok_dim), gather_tokens(v, idx, tok_dim), n_tok, keep


def _warn_plan_unused(st: DitState, topts: dict[str, Any]) -> None:
    if not st.plan_unused_warned and topts.get(PLAN_KEY) is not None and topts.get(DIT_PLAN_KEY) is None:
        st.plan_unused_warned = True  # e.g. ScheduledFusion's crop plan on SD3 / Wan: say so, once per patched model
        log.warning(
            "TokenFuse: the TOKEN_PLAN is not used by this model's attention (where its image tokens sit in the "
            "sequence is known for Flux-family models only); every token is treated alike"
        )


def eager_override(st: DitState, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One attention call, eagerly: the step read here, the telemetry recorded (and kept while a compiled call
    learns)."""
    topts = kwargs.get("transformer_options") or {}
    _warn_plan_unused(st, topts)
    info = st.steps(topts)
    t0 = time.perf_counter() if st.schedule.time_calls else 0.0
    top = top_kv(st, args, kwargs, st.schedule.active_at(info.progress))
    label = str(topts.get("block_index", "?"))
    if top is None:  # counted unreduced (outside the step window, or nothing to drop), as the U-Net path does
        n_tok = args[1].shape[2 if kwargs.get("skip_reshape", False) else 1]
        st.telemetry.record(label, 0, info.step, info.sigma, n_tok, n_tok, n_tok, n_tok, "topk", None)
        if st.flight.learning is not None:
            st.flight.records.append((label, n_tok, n_tok))
        return func(*args, **kwargs)
    k2, v2, n_tok, keep = top
    seconds = (time.perf_counter() - t0) if st.schedule.time_calls else None
    st.telemetry.record(label, 0, info.step, info.sigma, n_tok, n_tok, n_tok, keep, "topk", seconds)
    if st.flight.learning is not None:
        st.flight.records.append((label, n_tok, keep))
    return func(args[0], k2, v2, *args[3:], **kwargs)


def with_flat_v(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The call's args with SD3's v flattened like q and k (MMDiT hands v as [B, N, heads, D] with q, k flattened:
    the same tokens); other calls' args as they are."""
    k, v = args[1], args[2]
    flat = not kwargs.get("skip_reshape", False)
    if flat and isinstance(v, torch.Tensor) and v.ndim == 4 and isinstance(k, torch.Tensor) and k.ndim == 3:
        return (args[0], k, v.flatten(2), *args[3:])
    return args


def is_self_attention(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the override may reduce this call: self-attention (k has q's token count), no mask, enough tokens."""
    q, k, v = args[0], args[1], args[2]
    mask = args[4] if len(args) > 4 else kwargs.get("mask")
    tok_dim = 2 if kwargs.get("skip_reshape", False) else 1
    return not (
        mask is not None
        or not all(isinstance(t, torch.Tensor) for t in (q, k, v))
        or k.ndim != tok_dim + 2
        or k.shape != v.shape
        or k.shape[tok_dim] != q.shape[tok_dim]
        or k.shape[tok_dim] < MIN_DIT_TOKENS
    )


def window(st: DitState, shape: tuple[int, ...], options: dict[str, Any]) -> bool | str | None:
    """Once per compiled model call, eagerly: the window state for the traced override, LEARN for the first call
    of a (shape, window state, plan), None when the override passes everything through."""
    flight = st.flight
    flight.learning = flight.traced = None
    if st.off or options.get(DISABLED_KEY):
        return None
    # the plan too: a new face crop's plan keeps other tokens (the same graph, other telemetry to replay)
    key = (shape, st.schedule.active_at(st.steps(options).progress), id(options.get(PLAN_KEY)))
    if key not in st.replays:
        flight.learning, flight.records = key, []
        return LEARN
    flight.traced = key
    return key[1]


def after_call(st: DitState, options: dict[str, Any]) -> None:
    """After a compiled model call, eagerly: keep the learning call's records, or replay them for a traced call."""
    flight = st.flight
    if flight.learning is not None:
        st.replays[flight.learning] = flight.records
        flight.learning = None
    if flight.traced is None:
        return
    info = st.steps(options)
    for label, n_tok, keep in st.replays[flight.traced]:
        st.telemetry.record(label, 0, info.step, info.sigma, n_tok, n_tok, n_tok, keep, "topk")


def build_dit_hooks(schedule: Schedule, telemetry: RunTelemetry) -> DitHooks:
    """The DiT attention override (see `build_attention_override`) and its DIFFUSION_MODEL wrapper.

    Under torch.compile the override reads no step: the wrapper passes, per model call, whether the step window is
    active (TRACE_KEY), computed eagerly; dynamo guards on that flag, so a run compiles one graph per window state.
    The first model call of a (latent shape, window state, plan) runs eagerly, whole, and its telemetry records are
    replayed after each later (traced) call of that kind.
    """
    st = DitState(schedule, telemetry)
    eager_call = eager_under_compile(lambda func, args, kwargs: eager_override(st, func, args, kwargs))

    def override(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if st.off or len(args) < 3:
            return func(*args, **kwargs)
        topts = kwargs.get("transformer_options") or {}
        if topts.get(DISABLED_KEY):
            return func(*args, **kwargs)
        args = with_flat_v(args, kwargs)
        if not is_self_attention(args, kwargs):
            return func(*args, **kwargs)
        active = topts.get(TRACE_KEY)  # only in a compiled model call (the wrapper); its telemetry is replayed
        if active is None:
            if not torch.compiler.is_compiling():
                return eager_override(st, func, args, kwargs)
            return eager_call(func, args, kwargs)  # no wrapper: the step is read eagerly, one graph break per call
        top = top_kv(st, args, kwargs, bool(active))
        if top is None:
            return func(*args, **kwargs)
        return func(args[0], top[0], top[1], *args[3:], **kwargs)

    return DitHooks(override, traced_call_wrapper(lambda s, o: window(st, s, o), lambda o: after_call(st, o)))
