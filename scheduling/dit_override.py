"""The DiT attention override (Flux, Wan, Qwen-Image, HunyuanVideo, LTXV): top-K keys/values on the 1-D sequence.

`build_attention_override` -> override(func, *args, **kwargs) for `transformer_options["optimized_attention_override"]`
(the grid is unknown, so saliency picks the kept K/V tokens). `build_dit_hooks` adds the DIFFUSION_MODEL wrapper that
keeps it traceable under torch.compile (ComfyUI's TorchCompileModel): the step window's state per model call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from .keys import DISABLED_KEY, TRACE_KEY
from .patches import LEARN, StepTracker, eager_under_compile, traced_call_wrapper
from .schedule import Schedule
from .telemetry import RunTelemetry
from .topk import gather_tokens, keep_count, topk_indices

MIN_DIT_TOKENS = 64


def build_attention_override(schedule: Schedule, telemetry: RunTelemetry) -> Callable[..., Any]:
    """override(func, *args, **kwargs) for transformer_options["optimized_attention_override"] (DiT families).

    ComfyUI calls it as override(attention_fn, q, k, v, heads, [mask], ..., skip_reshape=..., transformer_options=...);
    q/k/v are projected: [B, N, H*D], or [B, H, N, D] with skip_reshape. Inside the window and past the protected
    blocks, self-attention calls (k has q's token count, no mask) keep the top (1 - dit_ratio) K/V tokens by
    saliency; everything else is passed through untouched. Without the wrapper of `build_dit_hooks`, torch.compile
    recompiles it every step (it reads the step).
    """
    return build_dit_hooks(schedule, telemetry).override


@dataclass
class _DitFlight:
    """The compiled DiT model call in flight: the (shape, window state) it learns eagerly and that call's telemetry
    records, or the key whose records a traced call replays."""

    learning: tuple[tuple[int, ...], bool] | None = None
    records: list[tuple[str, int, int]] = field(default_factory=list)
    traced: tuple[tuple[int, ...], bool] | None = None


class DitHooks(NamedTuple):
    """What `build_dit_hooks` returns: the attention override and the DIFFUSION_MODEL wrapper that keeps it traceable
    under torch.compile."""

    override: Callable[..., Any]
    diffusion_model_wrapper: Callable[..., Any]


def build_dit_hooks(schedule: Schedule, telemetry: RunTelemetry) -> DitHooks:
    """The DiT attention override (see `build_attention_override`) and its DIFFUSION_MODEL wrapper.

    Under torch.compile the override reads no step: the wrapper passes, per model call, whether the step window is
    active (TRACE_KEY), computed eagerly; dynamo guards on that flag, so a run compiles one graph per window state.
    The first model call of a (latent shape, window state) runs eagerly, whole, and its telemetry records are replayed
    after each later (traced) call of that kind.
    """
    steps = StepTracker()
    replays: dict[tuple[tuple[int, ...], bool], list[tuple[str, int, int]]] = {}
    flight = _DitFlight()
    off = schedule.dit_ratio <= 0.0 or schedule.end_percent <= schedule.start_percent

    def top_kv(args: tuple[Any, ...], kwargs: dict[str, Any], active: bool) -> tuple[Any, Any, int, int] | None:
        """The tensor side of a call (traceable): (k', v', tokens, kept) with the top-K K/V when active and past the
        protected blocks, else None."""
        k, v = args[1], args[2]
        bidx = (kwargs.get("transformer_options") or {}).get("block_index")
        tok_dim = 2 if kwargs.get("skip_reshape", False) else 1
        n_tok = k.shape[tok_dim]
        keep = keep_count(n_tok, schedule.dit_ratio)
        if not active or (isinstance(bidx, int) and bidx < schedule.protect_blocks) or keep >= n_tok:
            return None
        idx = topk_indices(k, keep, None, tok_dim)
        return gather_tokens(k, idx, tok_dim), gather_tokens(v, idx, tok_dim), n_tok, keep

    def eager_override(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        topts = kwargs.get("transformer_options") or {}
        info = steps(topts)
        t0 = time.perf_counter() if schedule.time_calls else 0.0
        top = top_kv(args, kwargs, schedule.active_at(info.progress))
        label = str(topts.get("block_index", "?"))
        if top is None:  # counted unreduced (outside the step window, or nothing to drop), as the U-Net path does
            n_tok = args[1].shape[2 if kwargs.get("skip_reshape", False) else 1]
            telemetry.record(label, 0, info.step, info.sigma, n_tok, n_tok, n_tok, n_tok, "topk", None)
            if flight.learning is not None:
                flight.records.append((label, n_tok, n_tok))
            return func(*args, **kwargs)
        k2, v2, n_tok, keep = top
        seconds = (time.perf_counter() - t0) if schedule.time_calls else None
        telemetry.record(label, 0, info.step, info.sigma, n_tok, n_tok, n_tok, keep, "topk", seconds)
        if flight.learning is not None:
            flight.records.append((label, n_tok, keep))
        return func(args[0], k2, v2, *args[3:], **kwargs)

    eager_call = eager_under_compile(eager_override)

    def override(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if off or len(args) < 3:
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
        active = topts.get(TRACE_KEY)  # only in a compiled model call (the wrapper); its telemetry is replayed
        if active is None:
            if not torch.compiler.is_compiling():
                return eager_override(func, args, kwargs)
            return eager_call(func, args, kwargs)  # no wrapper: the step is read eagerly, one graph break per call
        top = top_kv(args, kwargs, bool(active))
        if top is None:
            return func(*args, **kwargs)
        return func(args[0], top[0], top[1], *args[3:], **kwargs)

    def window(shape: tuple[int, ...], options: dict[str, Any]) -> bool | str | None:
        """Once per compiled model call, eagerly: the window state for the traced override, LEARN for the first call
        of a (shape, window state), None when the override passes everything through."""
        flight.learning = flight.traced = None
        if off or options.get(DISABLED_KEY):
            return None
        key = (shape, schedule.active_at(steps(options).progress))
        if key not in replays:
            flight.learning, flight.records = key, []
            return LEARN
        flight.traced = key
        return key[1]

    def after_call(options: dict[str, Any]) -> None:
        """After a compiled model call, eagerly: keep the learning call's records, or replay them for a traced call."""
        if flight.learning is not None:
            replays[flight.learning] = flight.records
            flight.learning = None
        if flight.traced is None:
            return
        info = steps(options)
        for label, n_tok, keep in replays[flight.traced]:
            telemetry.record(label, 0, info.step, info.sigma, n_tok, n_tok, n_tok, keep, "topk")

    return DitHooks(override, traced_call_wrapper(window, after_call))
