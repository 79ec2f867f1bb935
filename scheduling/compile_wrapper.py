"""The DIFFUSION_MODEL wrapper that keeps TokenFuse's attention hooks traceable under torch.compile.

Shared by the U-Net patches (patches.py) and the DiT override (dit_override.py); `eager_under_compile` also by the
step cache (step_cache.py). Per compiled model call the host work runs eagerly, once, before the model (one graph
break); the traced hooks read only what it hands them in transformer_options[TRACE_KEY].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .keys import NEIGHBOURS_KEY, TRACE_KEY
from .neighbours import neighbours_of


def eager_under_compile(fn: Any) -> Any:
    """fn wrapped in torch.compiler.disable: dynamo runs it eagerly as one graph break (see patches.build_unet_hooks and
    step_cache.build_step_cache)."""
    return torch.compiler.disable(fn)  # type: ignore[no-untyped-call]


LEARN = "learn"  # decide's answer while the hooks learn a kind of call: run the whole model call eagerly


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
