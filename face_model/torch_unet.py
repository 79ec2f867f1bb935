"""The face model's U-Net in plain torch (no ComfyUI): the same forward as ComfyUI's SD-layout `UNetModel`.

CI has no ComfyUI, yet the quality gate must run the trained weights through the pack's real attention patches. This
module rebuilds exactly what `comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel` computes for the config stored
in `unet.safetensors` (SD1.5's block layout: ResBlocks, `SpatialTransformer` with conv proj_in/proj_out, GEGLU
feed-forward, nearest upsampling, stride-2 conv downsampling), with parameter names identical to ComfyUI's, so the
committed state dict loads strictly. The self-attention goes through `transformer_options["patches"]["attn1_patch"]`
/ `["attn1_output_patch"]` the way ComfyUI's BasicTransformerBlock calls them: `extra_options` is a fresh dict per
block holding every transformer_options entry except the patch lists (original_shape, block, block_index,
transformer_index, activations_shape, sigmas, sample_sigmas, cond_or_uncond, the pack's keys) plus n_heads, dim_head
and attn_precision; ctx and value are `n` itself when a patch list exists. Attention is PyTorch SDPA, ComfyUI's
`attention_pytorch` reshaping. tests/integration/test_torch_face_model.py checks equality with ComfyUI's classes.

Supported config subset (what face_model/nets.UNET_CONFIG uses; anything else raises): 2-D, eps model,
`use_spatial_transformer`, non-linear proj (`use_linear_in_transformer` false), per-level `num_res_blocks`,
`num_heads` (or `num_head_channels`), no class/ADM embedding, no temporal layers, no scale-shift norm, conv resampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Patch = Callable[..., Any]


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
    """[B] (possibly fractional) timesteps -> [B, dim] sinusoidal embedding, cos half first (ComfyUI's order)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32, device=timesteps.device) / half
    )
    args = timesteps[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class ResBlock(nn.Module):
    """GN-SiLU-conv, + Linear(SiLU(emb)), GN-SiLU-(dropout)-conv, skip (identity or 1x1 conv)."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_layers = nn.Sequential(
            nn.GroupNorm(32, channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1)
        )
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(
            nn.GroupNorm(32, out_channels),
            nn.SiLU(),
            nn.Dropout(0.0),
            nn.Conv2d(out_channels, out_channels, 3, padding=1),
        )
        self.skip_connection: nn.Module = (
            nn.Identity() if out_channels == channels else nn.Conv2d(channels, out_channels, 1)
        )

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x)
        h = h + self.emb_layers(emb).type(h.dtype)[..., None, None]
        out: torch.Tensor = self.skip_connection(x) + self.out_layers(h)
        return out


class Downsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.op(x)
        return out


class Upsample(nn.Module):
    """Nearest x2 to the skip's size (ComfyUI passes the next skip's shape: odd latents round up on the way down)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, output_shape: Any = None) -> torch.Tensor:
        size = [x.shape[2] * 2, x.shape[3] * 2] if output_shape is None else [output_shape[2], output_shape[3]]
        out: torch.Tensor = self.conv(F.interpolate(x, size=size, mode="nearest"))
        return out


def sdpa_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Nq, H*D], [B, Nk, H*D] x2 -> [B, Nq, H*D] (ComfyUI's attention_pytorch; K/V may have fewer tokens)."""
    b, _, inner = q.shape
    d = inner // heads
    q, k, v = (t.view(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
    return out.transpose(1, 2).reshape(b, -1, heads * d)


class CrossAttention(nn.Module):
    def __init__(self, query_dim: int, context_dim: int | None, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = heads * dim_head
        context_dim = context_dim or query_dim
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor, context: Any = None, value: Any = None) -> torch.Tensor:
        context = x if context is None else context
        q, k = self.to_q(x), self.to_k(context)
        v = self.to_v(value) if value is not None else self.to_v(context)
        out: torch.Tensor = self.to_out(sdpa_heads(q, k, v, self.heads))
        return out


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class BasicTransformerBlock(nn.Module):
    """x + attn1(norm1 x) [through the attn1 patches], x + attn2(norm2 x, context), x + ff(norm3 x)."""

    def __init__(self, dim: int, heads: int, dim_head: int, context_dim: int) -> None:
        super().__init__()
        self.n_heads, self.d_head = heads, dim_head
        self.attn1 = CrossAttention(dim, None, heads, dim_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, heads, dim_head)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, transformer_options: dict[str, Any]) -> torch.Tensor:
        patches: dict[str, list[Patch]] = transformer_options.get("patches", {})
        extra = {k: v for k, v in transformer_options.items() if k not in ("patches", "patches_replace")}
        extra["n_heads"], extra["dim_head"], extra["attn_precision"] = self.n_heads, self.d_head, None
        n = self.norm1(x)
        ctx: Any = None
        val: Any = None
        if "attn1_patch" in patches:
            ctx = val = n
            for p in patches["attn1_patch"]:
                n, ctx, val = p(n, ctx, val, extra)
        n = self.attn1(n, context=ctx, value=val)
        for p in patches.get("attn1_output_patch", []):
            n = p(n, extra)
        x = n + x
        x = self.attn2(self.norm2(x), context=context) + x
        out: torch.Tensor = x + self.ff(self.norm3(x))
        return out


class SpatialTransformer(nn.Module):
    def __init__(self, channels: int, heads: int, dim_head: int, context_dim: int, depth: int = 1) -> None:
        super().__init__()
        inner = heads * dim_head
        self.norm = nn.GroupNorm(32, channels, eps=1e-6)
        self.proj_in = nn.Conv2d(channels, inner, 1)
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(inner, heads, dim_head, context_dim) for _ in range(depth)]
        )
        self.proj_out = nn.Conv2d(inner, channels, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor, transformer_options: dict[str, Any]) -> torch.Tensor:
        b, c, h, w = x.shape
        transformer_options["activations_shape"] = list(x.shape)
        t = self.proj_in(self.norm(x)).movedim(1, 3).flatten(1, 2).contiguous()
        for i, block in enumerate(self.transformer_blocks):
            transformer_options["block_index"] = i
            t = block(t, context, transformer_options)
        t = t.reshape(t.shape[0], h, w, t.shape[-1]).movedim(3, 1).contiguous()
        out: torch.Tensor = self.proj_out(t) + x
        return out


class TimestepSequential(nn.Sequential):
    """ComfyUI's TimestepEmbedSequential / forward_timestep_embed: each layer gets what it needs; the transformer
    index advances after every SpatialTransformer."""

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        emb: torch.Tensor,
        context: torch.Tensor,
        transformer_options: dict[str, Any],
        output_shape: Any = None,
    ) -> torch.Tensor:
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context, transformer_options)
                transformer_options["transformer_index"] += 1
            elif isinstance(layer, Upsample):
                x = layer(x, output_shape)
            else:
                x = layer(x)
        return x


_SUPPORTED = {
    "in_channels",
    "out_channels",
    "model_channels",
    "num_res_blocks",
    "channel_mult",
    "transformer_depth",
    "transformer_depth_middle",
    "transformer_depth_output",
    "context_dim",
    "num_heads",
    "num_head_channels",
    "use_spatial_transformer",
    "use_linear_in_transformer",
    "legacy",
    "image_size",
    "use_checkpoint",
    "adm_in_channels",
    "use_temporal_attention",
    "use_temporal_resblock",
    "dtype",
}


def _check_config(cfg: dict[str, Any]) -> None:
    unknown = sorted(set(cfg) - _SUPPORTED)
    bad = [
        name
        for name, ok in (
            ("use_spatial_transformer", cfg.get("use_spatial_transformer", True)),
            ("use_linear_in_transformer", not cfg.get("use_linear_in_transformer", False)),
            ("adm_in_channels", cfg.get("adm_in_channels") is None),
            ("use_temporal_attention", not cfg.get("use_temporal_attention", False)),
            ("use_temporal_resblock", not cfg.get("use_temporal_resblock", False)),
        )
        if not ok
    ]
    if unknown or bad:
        raise ValueError(f"torch_unet supports the face model's SD-layout config only; unsupported: {unknown + bad}")


class TorchUNet(nn.Module):
    """SD-layout UNetModel (see module docstring). forward(x [B,4,h,w], timesteps [B], context [B,T,D],
    transformer_options) -> eps [B,4,h,w]; transformer_options is filled in place as ComfyUI does."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        _check_config(cfg)
        mc: int = cfg["model_channels"]
        mult: list[int] = list(cfg["channel_mult"])
        nres = cfg["num_res_blocks"]
        nres = [nres] * len(mult) if isinstance(nres, int) else list(nres)
        depth_in = list(cfg["transformer_depth"])
        depth_out = list(cfg["transformer_depth_output"])
        ctx_dim: int = cfg["context_dim"]
        heads = int(cfg.get("num_heads", 8) or 8)
        head_ch = int(cfg.get("num_head_channels", -1) or -1)
        legacy = bool(cfg.get("legacy", False))

        def attn(ch: int, depth: int) -> SpatialTransformer:
            n_heads, d_head = (ch // head_ch, head_ch) if head_ch != -1 else (heads, ch // heads)
            if legacy:
                d_head = ch // n_heads
            return SpatialTransformer(ch, n_heads, d_head, ctx_dim, depth)

        self.model_channels = mc
        emb_dim = mc * 4
        self.time_embed = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.input_blocks = nn.ModuleList([TimestepSequential(nn.Conv2d(cfg["in_channels"], mc, 3, padding=1))])
        chans = [mc]
        ch = mc
        for level, m in enumerate(mult):
            for _ in range(nres[level]):
                layers: list[nn.Module] = [ResBlock(ch, emb_dim, m * mc)]
                ch = m * mc
                d = depth_in.pop(0)
                if d > 0:
                    layers.append(attn(ch, d))
                self.input_blocks.append(TimestepSequential(*layers))
                chans.append(ch)
            if level != len(mult) - 1:
                self.input_blocks.append(TimestepSequential(Downsample(ch)))
                chans.append(ch)
        mid: list[nn.Module] = [ResBlock(ch, emb_dim, ch)]
        if cfg["transformer_depth_middle"] >= 0:
            mid += [attn(ch, cfg["transformer_depth_middle"]), ResBlock(ch, emb_dim, ch)]
        self.middle_block = TimestepSequential(*mid)
        self.output_blocks = nn.ModuleList()
        for level, m in list(enumerate(mult))[::-1]:
            for i in range(nres[level] + 1):
                skip = chans.pop()
                layers = [ResBlock(ch + skip, emb_dim, mc * m)]
                ch = mc * m
                d = depth_out.pop()
                if d > 0:
                    layers.append(attn(ch, d))
                if level and i == nres[level]:
                    layers.append(Upsample(ch))
                self.output_blocks.append(TimestepSequential(*layers))
        self.out = nn.Sequential(nn.GroupNorm(32, ch), nn.SiLU(), nn.Conv2d(mc, cfg["out_channels"], 3, padding=1))

    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: torch.Tensor,
        transformer_options: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        to = {} if transformer_options is None else transformer_options
        to["original_shape"] = list(x.shape)  # a new list per call: the pack's patches key their tables on it
        to["transformer_index"] = 0
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(x.dtype))
        hs = []
        h = x
        for i, block in enumerate(self.input_blocks):
            to["block"] = ("input", i)
            h = block(h, emb, context, to)
            hs.append(h)
        to["block"] = ("middle", 0)
        h = self.middle_block(h, emb, context, to)
        for i, block in enumerate(self.output_blocks):
            to["block"] = ("output", i)
            h = torch.cat([h, hs.pop()], dim=1)
            h = block(h, emb, context, to, hs[-1].shape if hs else None)
        out: torch.Tensor = self.out(h.type(x.dtype))
        return out
