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

The parts: unet_state.py (the per-model state object the parts share), unet_table.py (the call table), unet_eager.py
(the eager patches), unet_trace.py (the table under compile), compile_wrapper.py (the DIFFUSION_MODEL wrapper),
strategies/ (what each strategy does: one module each, one registry).

Every closure returns its inputs unchanged (same objects) when the schedule is off, outside the sigma window, in a
protected block, at a level with ratio 0, or when the call does not look like a known token grid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .compile_wrapper import eager_under_compile, traced_call_wrapper
from .keys import DISABLED_KEY, TRACE_KEY, TRACED_UNMERGE_KEY, UNMERGE_KEY
from .schedule import Schedule
from .telemetry import RunTelemetry
from .unet_eager import AttnPatch, OutputPatch, eager_attn1_output_patch, eager_attn1_patch, elsewhere
from .unet_state import UnetState
from .unet_table import EAGER
from .unet_trace import after_call, trace_table


class UnetHooks(NamedTuple):
    """What `build_unet_hooks` returns: the two attn1 patches and the DIFFUSION_MODEL wrapper feeding them under
    torch.compile (see the module docstring)."""

    attn1_patch: AttnPatch
    attn1_output_patch: OutputPatch
    diffusion_model_wrapper: Callable[..., Any]


def build_unet_patches(schedule: Schedule, telemetry: RunTelemetry) -> tuple[AttnPatch, OutputPatch]:
    """(attn1_patch, attn1_output_patch) closures for a U-Net model (see module docstring). Without the wrapper of
    `build_unet_hooks` they still work under torch.compile, each call one graph break."""
    hooks = build_unet_hooks(schedule, telemetry)
    return hooks.attn1_patch, hooks.attn1_output_patch


def build_unet_hooks(schedule: Schedule, telemetry: RunTelemetry) -> UnetHooks:
    """The attn1 patches of a U-Net model and the DIFFUSION_MODEL wrapper that keeps them traceable under compile.

    Under ComfyUI's TorchCompileModel dynamo would trace into the eager patches and guard on the tables they fill and
    the per-model-call objects they compare (a recompile every step until the recompile limit, then eager). So the
    host work runs eagerly: per model call in the wrapper (one graph break before the U-Net), and the traced patches
    read only the frozen table (a guard that changes with the step window, not per step). A call the table does not
    settle is one graph break into the eager patch. Eager (not compiling) the patches run directly.
    """
    st = UnetState(schedule, telemetry)
    attn1_patch, attn1_output_patch = eager_attn1_patch(st), eager_attn1_output_patch(st)
    attn1_eager, output_eager = eager_under_compile(attn1_patch), eager_under_compile(attn1_output_patch)
    static_off, traced = st.static_off, st.strategy.traced

    def attn1_traced(
        n: torch.Tensor, ctx: Any, val: Any, extra_options: dict[str, Any]
    ) -> tuple[torch.Tensor, Any, Any]:
        table = extra_options.get(TRACE_KEY)  # only in a compiled model call (the wrapper)
        if table is None:
            if not torch.compiler.is_compiling():
                return attn1_patch(n, ctx, val, extra_options)
            if static_off or n.ndim != 3 or extra_options.get(DISABLED_KEY):
                return n, ctx, val
            out: tuple[torch.Tensor, Any, Any] = attn1_eager(n, ctx, val, extra_options)  # no wrapper: a graph break
            return out
        if elsewhere(st, n, extra_options):
            return n, ctx, val
        # The table's action, traced, or run eagerly where dynamo left a frame eager: either way the wrapper replays
        # the telemetry of a settled call, so this path never records it.
        action = table.get((n.shape[1], extra_options.get("transformer_index")), EAGER) if n.ndim == 3 else None
        if action is None:
            return n, ctx, val
        if isinstance(action, str):  # EAGER: the eager patch, which records its own telemetry
            out = attn1_eager(n, ctx, val, extra_options)
            return out
        return traced(action, n, ctx, val, extra_options)

    def attn1_output_traced(n: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return attn1_output_patch(n, extra_options)
        traced_unmerge = extra_options.pop(TRACED_UNMERGE_KEY, None)  # a merge traced in this graph: unmerge in it
        if traced_unmerge is not None:
            unmerge, merged_len = traced_unmerge
            return unmerge(n) if n.ndim == 3 and n.shape[1] == merged_len else n  # another patch changed it: as is
        if UNMERGE_KEY not in extra_options:  # only a merge done by the eager patch leaves an unmerge
            return n
        out: torch.Tensor = output_eager(n, extra_options)
        return out

    wrapper = traced_call_wrapper(lambda shape, o: trace_table(st, shape, o), lambda o: after_call(st, o), attn1_traced)
    return UnetHooks(attn1_traced, attn1_output_traced, wrapper)
