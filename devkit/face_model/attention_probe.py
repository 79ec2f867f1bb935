"""Attention fidelity of a patched model, measured on the trained face model's own activations.

Why: on this small model the whole-image gate cannot tell a correct K/V reduction from a broken one. Its
self-attention is diffuse (head dim 4), so an output that loses all positional information (V reversed or permuted
against K: every query gets a near-mean of V) moves the final face by about as much as a correct 2x2 K/V pooling does
(astronaut, CI settings: balanced 41.8 dB, top-k 40.1 dB, permuted V 40.4 dB vs unscheduled). The difference is stark
one level down, at the attention output itself.

How: while ScheduledFusion samples, every BasicTransformerBlock of the plain-torch U-Net (torch_unet.py) computes
- `full`: its self-attention without any patch (what the unscheduled model computes),
- `patched`: the same call through the model's attn1_patch / attn1_output_patch chain (what the preset computes),
- `uniform`: uniform attention, `to_out(mean over tokens of V)`: the output of an attention that has lost every
  query-key relation, the reference "broken" answer,
and then continues with `full`, so every variant is measured on the unscheduled trajectory (same inputs, same
activations). Per variant, over the calls its patches changed:

    fidelity_error = sqrt(sum |patched - full|^2 / sum |uniform - full|^2)

0 = exact; 1 = as far from the real attention as "no query-key relation at all". Shapes: x, n, full, patched,
uniform are [B, N, C] (B = 2 with cond/uncond in ComfyUI, 1 here at cfg 1; N tokens of the level; C channels).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ...face_model.torch_unet import BasicTransformerBlock


@dataclass
class FidelityStats:
    """Sums over the attn1 calls of one run. changed: calls whose patched output differs from the full one."""

    calls: int = 0
    changed: int = 0
    err_sq: float = 0.0
    ref_sq: float = 0.0
    worst: float = 0.0  # largest per-call ratio |patched - full| / |uniform - full|
    per_level: dict[int, list[float]] = field(default_factory=dict)  # tokens -> [err_sq, ref_sq]
    struct_err_sq: float = 0.0  # sum |pc - fc|^2, pc / fc: patched / full minus their mean over tokens
    struct_ref_sq: float = 0.0  # sum |fc|^2 (= |uniform_c - fc|^2: uniform attention has no token structure)
    struct_dot: float = 0.0  # sum <pc, fc>
    struct_pp: float = 0.0  # sum |pc|^2

    @property
    def structure_error(self) -> float:
        """sqrt(sum |pc - fc|^2 / sum |fc|^2): error of the token-to-token variation of the attention output (0 =
        exact, 1 = none left, as with uniform attention; about 1.4 for an unrelated variation of the same size)."""
        return (self.struct_err_sq / self.struct_ref_sq) ** 0.5 if self.struct_ref_sq > 0 else 0.0

    @property
    def structure_corr(self) -> float:
        """sum <pc, fc> / sqrt(sum |pc|^2 sum |fc|^2): 1 = the same spatial pattern, 0 = unrelated."""
        den = (self.struct_pp * self.struct_ref_sq) ** 0.5
        return self.struct_dot / den if den > 0 else 1.0

    @property
    def error(self) -> float:
        """fidelity_error (0 = exact, 1 = as wrong as uniform attention); 0.0 when no call was changed."""
        return (self.err_sq / self.ref_sq) ** 0.5 if self.ref_sq > 0 else 0.0


Patches = tuple[list[Any], list[Any]]  # (attn1_patch list, attn1_output_patch list)


def patches_of(model: Any) -> Patches:
    """The attn1 / attn1_output patch lists of a TorchFaceModel (torch_sampling.scheduled / with_patches)."""
    p = model.options.get("patches", {})
    return list(p.get("attn1_patch", [])), list(p.get("attn1_output_patch", []))


def _patched_attention(block: BasicTransformerBlock, n: torch.Tensor, patches: Patches, extra: dict[str, Any]) -> Any:
    """attn1 through a patch chain, as BasicTransformerBlock calls it (torch_unet.py / ComfyUI's attention.py)."""
    attn1, attn1_out = patches
    extra = dict(extra)  # one dict per chain, shared by its patches (tome's attn1_patch leaves its unmerge there)
    pn: Any = n
    ctx: Any = None
    val: Any = None
    if attn1:
        ctx = val = n
        for p in attn1:
            pn, ctx, val = p(pn, ctx, val, extra)
    out = block.attn1(pn, context=ctx, value=val)
    for p in attn1_out:
        out = p(out, extra)
    return out


def _accumulate(stats: FidelityStats, n: torch.Tensor, full: torch.Tensor, uniform: torch.Tensor, patched: Any) -> None:
    stats.calls += 1
    if patched.shape != full.shape:
        raise ValueError(f"attn1 patches returned {tuple(patched.shape)} for {tuple(full.shape)} tokens")
    if torch.equal(patched, full):
        return
    p, f = patched.float(), full.float()
    e = float(((p - f) ** 2).sum())
    r = float(((uniform - f) ** 2).sum())
    stats.changed += 1
    stats.err_sq += e
    stats.ref_sq += r
    stats.worst = max(stats.worst, (e / r) ** 0.5 if r > 0 else 0.0)
    lvl = stats.per_level.setdefault(int(n.shape[1]), [0.0, 0.0])
    lvl[0] += e
    lvl[1] += r
    pc = p - p.mean(dim=1, keepdim=True)
    fc = f - f.mean(dim=1, keepdim=True)
    stats.struct_err_sq += float(((pc - fc) ** 2).sum())
    stats.struct_ref_sq += float((fc**2).sum())
    stats.struct_dot += float((pc * fc).sum())
    stats.struct_pp += float((pc**2).sum())


def _probe_forward(block: BasicTransformerBlock, variants: dict[str, Patches], stats: dict[str, FidelityStats]) -> Any:
    def forward(x: torch.Tensor, context: torch.Tensor, transformer_options: dict[str, Any]) -> torch.Tensor:
        extra = {k: v for k, v in transformer_options.items() if k not in ("patches", "patches_replace")}
        extra["n_heads"], extra["dim_head"], extra["attn_precision"] = block.n_heads, block.d_head, None
        n = block.norm1(x)
        full = block.attn1(n)
        v = block.attn1.to_v(n)
        uniform = block.attn1.to_out(v.mean(dim=1, keepdim=True)).expand_as(full).float()
        for name, patches in variants.items():
            _accumulate(stats[name], n, full, uniform, _patched_attention(block, n, patches, extra))
        # continue on the unpatched trajectory
        x = full + x
        x = block.attn2(block.norm2(x), context=context) + x
        out: torch.Tensor = x + block.ff(block.norm3(x))
        return out

    return forward


@contextmanager
def attention_probe(unet: torch.nn.Module, variants: dict[str, Patches]) -> Iterator[dict[str, FidelityStats]]:
    """Inside: every BasicTransformerBlock of `unet` computes its unpatched self-attention for the residual (run the
    plain model: the trajectory is the unscheduled one) and measures each variant's patch chain on the same call
    (see the module docstring). Yields name -> FidelityStats; the blocks are restored on exit."""
    stats = {name: FidelityStats() for name in variants}
    blocks = [m for m in unet.modules() if isinstance(m, BasicTransformerBlock)]
    if not blocks:
        raise ValueError("attention_probe: no BasicTransformerBlock in this U-Net")
    for b in blocks:
        b.forward = _probe_forward(b, variants, stats)  # type: ignore[method-assign]
    try:
        yield stats
    finally:
        for b in blocks:
            del b.forward
