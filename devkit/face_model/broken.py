"""Deliberately broken attention patches: the references the quality gate is measured against, and the bugs it must
catch (tests/test_quality_gate.py, docs/quality.md "The CI gate").

Each break wraps `balanced`'s real attn1 patch and damages only the calls balanced reduces (pooled K/V), the way a bug
in a K/V reduction would: the unreduced calls stay exact. `no_self_attention` zeroes every attn1 output instead.

- `kv_sum`: pooled K and V summed instead of averaged (a pooling that forgets to divide by the kernel area);
- `v_roll`: V shifted by one pooled token against K (an off-by-one in the pooled layout);
- `v_flip`: V in reverse token order;
- `v_perm`: V tokens randomly permuted (seeded): K and V no longer belong together ("shuffled tokens");
- `attn_off`: every self-attention output zeroed (the model without self-attention).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

import torch

from ...face_model.torch_sampling import TorchFaceModel, scheduled, with_patches
from .attention_probe import Patches, patches_of

Break = Literal["kv_sum", "v_roll", "v_flip", "v_perm", "attn_off"]
BREAKS: tuple[Break, ...] = get_args(Break)

Tokens = Callable[[torch.Tensor, int], torch.Tensor]  # (pooled K or V [B, M, C], tokens before pooling N) -> same shape


def _permute(v: torch.Tensor, _n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return v[:, torch.randperm(v.shape[1], generator=g)]


_DAMAGE: dict[str, tuple[Tokens, Tokens]] = {
    "kv_sum": (lambda k, n: k * (n / k.shape[1]), lambda v, n: v * (n / v.shape[1])),
    "v_roll": (lambda k, n: k, lambda v, n: torch.roll(v, 1, dims=1)),
    "v_flip": (lambda k, n: k, lambda v, n: torch.flip(v, dims=[1])),
    "v_perm": (lambda k, n: k, _permute),
}


def broken_patches(model: TorchFaceModel, kind: Break) -> Patches:
    """(attn1_patch list, attn1_output_patch list) of the break `kind` (see the module docstring)."""
    if kind == "attn_off":
        return [], [lambda n, extra: torch.zeros_like(n)]
    if kind not in _DAMAGE:
        raise ValueError(f"unknown break {kind!r}; choose one of {BREAKS}")
    real = patches_of(scheduled(model, "balanced"))[0][0]
    fk, fv = _DAMAGE[kind]

    def patch(n: torch.Tensor, ctx: Any, val: Any, extra: dict[str, Any]) -> tuple[Any, Any, Any]:
        n2, ctx2, val2 = real(n, ctx, val, extra)
        if ctx2 is ctx:  # a call balanced leaves unreduced stays correct
            return n2, ctx2, val2
        return n2, fk(ctx2, n.shape[1]), fv(val2, n.shape[1])

    return [patch], []


def broken_model(model: TorchFaceModel, kind: Break) -> TorchFaceModel:
    """`model` (unpatched) with the break attached, for a whole ScheduledFusion run."""
    attn1, attn1_out = broken_patches(model, kind)
    return with_patches(model, attn1, attn1_out)
