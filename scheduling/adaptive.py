"""Content-adaptive ratio: flat token maps merge more, busy ones less. One cheap statistic per level and step.

The statistic a step adapts to is the one the previous step measured at the same level (`LaggedComplexity`): read a
step late, its value is long computed, so taking it to the host never stalls the device queue (a same-step read would
be one blocking device sync per level and step; issue 11).
"""

from __future__ import annotations

from typing import Any

import torch

COMPLEXITY_DIM = 64
NEUTRAL = 0.5  # adapt_ratio leaves the ratio as it is: the first step of a run, before anything was measured


def complexity_stat(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Neighbour-difference energy of a token grid relative to its variance, in [0, 1], as a 0-d float32 tensor on
    x's device (no host read).

    x: [B, h*w, C]. 0 = flat (neighbours equal), ~1 = no spatial structure (white noise). Reads a channel slice only.
    """
    if h < 2 or w < 2:
        return torch.full((), NEUTRAL, dtype=torch.float32, device=x.device)
    with torch.no_grad():
        t = x[..., :COMPLEXITY_DIM].float().reshape(x.shape[0], h, w, -1)
        diff = (t[:, :, 1:] - t[:, :, :-1]).pow(2).mean() + (t[:, 1:] - t[:, :-1]).pow(2).mean()
        var = t.var(dim=(1, 2)).mean().clamp_min(1e-12)
        return (diff / (4.0 * var)).clamp(0.0, 1.0)


class _Pending:
    """A statistic on its way to the host: on CUDA a non-blocking copy into pinned memory and an event after it, so a
    later read waits for that copy only, not for the work queued since (other accelerators: a plain read, a sync)."""

    __slots__ = ("host", "event")

    def __init__(self, stat: torch.Tensor) -> None:
        self.event: Any = None
        self.host = stat
        if stat.is_cuda:
            try:
                host = torch.empty((), dtype=stat.dtype, pin_memory=True)
            except RuntimeError:  # no page-locked memory (some hosts limit it): a plain read later, a sync then
                return
            self.host = host
            self.host.copy_(stat, non_blocking=True)
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.event.record()

    def read(self) -> float:
        if self.event is not None:
            self.event.synchronize()
        return float(self.host)


class LaggedComplexity:
    """The complexity a level adapts to at a step: what the previous measured step of the same sampling run measured
    there (`NEUTRAL` on a run's first step). Deterministic per run; no device sync.

    Per key (level, batch), per step: the first call starts this step's statistic and returns the earlier one; later
    calls of the step (other blocks at the level, a second evaluation of a multi-evaluation sampler) return the same
    value. `run` is an object that is new per sampling run (ComfyUI's sample_sigmas): a new run starts over. With no
    step (-1: a caller without sampling steps), or `now` (a compiled U-Net's learning call, whose choice is held for a
    step window: one read per level and window), it measures the tokens it is given, synchronously.
    """

    def __init__(self) -> None:
        self._by: dict[Any, tuple[Any, int, float, _Pending | None, float]] = {}  # key -> run, step, sigma, stat, value

    def __call__(  # noqa: PLR0913 - hot path: called per attention call (adaptive ratio); a per-call argument object would allocate
        self, key: Any, run: Any, step: int, sigma: float, x: torch.Tensor, h: int, w: int, now: bool = False
    ) -> float:
        entry = self._by.get(key)
        same_run = entry is not None and entry[0] is run
        if entry is not None and same_run and entry[1] == step and (step >= 0 or entry[2] == sigma):
            return entry[4]
        stat = complexity_stat(x, h, w)
        if step < 0 or now:
            value = float(stat)
            self._by[key] = (run, step, sigma, None, value)
            return value
        value = NEUTRAL
        if entry is not None and same_run and 0 <= entry[1] < step:
            value = entry[4] if entry[3] is None else entry[3].read()
        self._by[key] = (run, step, sigma, _Pending(stat), value)
        return value


def adapt_ratio(ratio: float, complexity: float, strength: float, cap: float) -> float:
    """Scale ratio by 1 + strength * (1 - 2 * complexity): up to (1 + strength) when flat, (1 - strength) when busy."""
    if ratio <= 0.0 or strength <= 0.0:
        return ratio
    return max(0.0, min(cap, ratio * (1.0 + strength * (1.0 - 2.0 * complexity))))
