"""The face model's VAE in plain torch (no ComfyUI): ComfyUI's `AutoencoderKL` Encoder/Decoder for the config stored
in `vae.safetensors`, parameter names identical (strict load), and `comfy.sd.VAE`'s pixel handling.

encode(pixels [B, H, W, 3] 0..1) -> latent [B, 4, H/8, W/8] (posterior mode, unscaled: the sampler applies SD1.5's
0.18215 as ComfyUI's latent format does); decode(latent) -> pixels [B, H, W, 3] clamped to 0..1. Sides that are not a
multiple of 8 are centre-cropped first, as comfy.sd.VAE does. Supported: 2-D, no attention outside the mid blocks
(`attn_resolutions` empty), conv resampling, `double_z`; anything else raises.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _norm(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, ch, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        out: torch.Tensor = (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h
        return out


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 convs (ComfyUI's VAE attention, SDPA form)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = _norm(ch)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c = x.shape[:2]
        q, k, v = (t.view(b, 1, c, -1).transpose(2, 3).contiguous() for t in (self.q(h), self.k(h), self.v(h)))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        res: torch.Tensor = x + self.proj_out(out.transpose(2, 3).reshape(x.shape))
        return res


class Downsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0))  # asymmetric, as in SD
        return out


class Upsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return out


class _Level(nn.Module):
    """One resolution level: res blocks, an (empty) attn list and an optional resampler (names as in ComfyUI)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.ModuleList()
        self.attn = nn.ModuleList()

    def run(self, h: torch.Tensor) -> torch.Tensor:
        """The res blocks, then the level's downsample (encoder) or upsample (decoder) when it has one."""
        for block in self.block:
            h = block(h)
        for name in ("downsample", "upsample"):
            if name in self._modules:
                h = self._modules[name](h)  # type: ignore[misc]
        return h


def _levels(modules: nn.ModuleList) -> list[_Level]:
    return [m for m in modules if isinstance(m, _Level)]


class _Mid(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(ch, ch), AttnBlock(ch), ResnetBlock(ch, ch)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block_2(self.attn_1(self.block_1(h)))
        return out


class Encoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        ch, mult, nres = cfg["ch"], list(cfg["ch_mult"]), cfg["num_res_blocks"]
        self.conv_in = nn.Conv2d(cfg["in_channels"], ch, 3, padding=1)
        in_mult = (1, *mult)
        self.down = nn.ModuleList()
        for i, m in enumerate(mult):
            level = _Level()
            cin = ch * in_mult[i]
            for _ in range(nres):
                level.block.append(ResnetBlock(cin, ch * m))
                cin = ch * m
            if i != len(mult) - 1:
                level.downsample = Downsample(cin)
            self.down.append(level)
        self.mid = _Mid(cin)
        self.norm_out = _norm(cin)
        z = cfg["z_channels"] * (2 if cfg.get("double_z", True) else 1)
        self.conv_out = nn.Conv2d(cin, z, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in _levels(self.down):
            h = level.run(h)
        h = self.mid(h)
        out: torch.Tensor = self.conv_out(F.silu(self.norm_out(h)))
        return out


class Decoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        ch, mult, nres = cfg["ch"], list(cfg["ch_mult"]), cfg["num_res_blocks"]
        cin = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg["z_channels"], cin, 3, padding=1)
        self.mid = _Mid(cin)
        levels: list[_Level] = []
        for i in reversed(range(len(mult))):
            level = _Level()
            for _ in range(nres + 1):
                level.block.append(ResnetBlock(cin, ch * mult[i]))
                cin = ch * mult[i]
            if i != 0:
                level.upsample = Upsample(cin)
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, cfg["out_ch"], 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(_levels(self.up)):
            h = level.run(h)
        out: torch.Tensor = self.conv_out(F.silu(self.norm_out(h)))
        return out


class TorchVAE(nn.Module):
    """AutoencoderKL (encoder, quant_conv, post_quant_conv, decoder) + comfy.sd.VAE's 0..1 <-> -1..1 handling."""

    factor = 8

    def __init__(self, ddconfig: dict[str, Any], embed_dim: int) -> None:
        super().__init__()
        if ddconfig.get("attn_resolutions") or not ddconfig.get("double_z", True):
            raise ValueError("torch_vae supports SD's AutoencoderKL without attn_resolutions (double_z) only")
        self.encoder = Encoder(ddconfig)
        self.decoder = Decoder(ddconfig)
        z = ddconfig["z_channels"]
        self.quant_conv = nn.Conv2d(2 * z, 2 * embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, z, 1)

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, H, W, 3] 0..1 -> [B, 4, H/8, W/8] posterior mode (centre-cropped to multiples of 8 first)."""
        h, w = pixels.shape[1:3]
        hh, ww = h // self.factor * self.factor, w // self.factor * self.factor
        y0, x0 = (h % self.factor) // 2, (w % self.factor) // 2
        x = pixels[:, y0 : y0 + hh, x0 : x0 + ww, :3].movedim(-1, 1).float() * 2.0 - 1.0
        moments = self.quant_conv(self.encoder(x))
        out: torch.Tensor = moments.chunk(2, dim=1)[0].float()
        return out

    @torch.no_grad()
    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """[B, 4, h, w] -> [B, 8h, 8w, 3] clamped 0..1."""
        x = self.decoder(self.post_quant_conv(latent.float()))
        return torch.clamp((x + 1.0) / 2.0, 0.0, 1.0).movedim(1, -1)
