"""The content-adaptive ratio's statistic, read a step late (scheduling/adaptive.py)."""

from __future__ import annotations

import pytest
import torch
from tokenfuse.scheduling.adaptive import NEUTRAL, LaggedComplexity, complexity_stat

H = W = 8


def grid(kind: str) -> torch.Tensor:
    """[2, H*W, 16] tokens: 'flat' a smooth ramp (complexity near 0), 'noise' white noise (near 1)."""
    if kind == "flat":
        return torch.linspace(0, 1, H * W).view(1, H * W, 1).expand(2, H * W, 16).contiguous()
    return torch.randn(2, H * W, 16, generator=torch.Generator().manual_seed(0))


def test_statistic_orders_flat_below_noise_without_a_host_read() -> None:
    flat, noise = complexity_stat(grid("flat"), H, W), complexity_stat(grid("noise"), H, W)
    assert flat.ndim == 0 and flat.dtype == torch.float32
    assert float(flat) < 0.1 < 0.8 < float(noise) <= 1.0
    assert float(complexity_stat(grid("noise")[:, :8], 1, 8)) == NEUTRAL  # a row of tokens has no 2-D structure


def test_each_step_reads_the_statistic_its_previous_step_measured() -> None:
    lag, run = LaggedComplexity(), object()
    seen = [
        lag((8, 2), run, step, 1.0 - step / 10, grid(kind), H, W) for step, kind in enumerate(["flat", "noise", "flat"])
    ]
    assert seen[0] == NEUTRAL
    assert seen[1] < 0.1 and seen[2] > 0.8, seen
    # the same step again (another block at the level, or a second evaluation at another sigma): the same value
    assert lag((8, 2), run, 2, 0.5, grid("flat"), H, W) == seen[2]
    # levels and batch sizes keep their own statistics
    assert lag((16, 2), run, 3, 0.1, grid("flat"), H, W) == NEUTRAL
    assert lag((8, 2), run, 3, 0.1, grid("noise"), H, W) < 0.1  # step 2 measured flat tokens
    # skipped steps (a step cache's cached steps leave out the deep levels): the last measured step is read
    assert lag((8, 2), run, 7, 0.05, grid("noise"), H, W) > 0.8


def test_a_new_run_and_unknown_steps() -> None:
    lag = LaggedComplexity()
    first, second = object(), object()
    lag((8, 2), first, 0, 1.0, grid("noise"), H, W)
    assert lag((8, 2), second, 1, 0.9, grid("noise"), H, W) == NEUTRAL, "a new run read the last run's statistic"
    # steps going back within one object (a caller that reuses sample_sigmas for a second run): start over too
    lag((8, 2), first, 5, 0.5, grid("flat"), H, W)
    assert lag((8, 2), first, 0, 1.0, grid("noise"), H, W) == NEUTRAL
    # no step known (a caller without sampling steps): the tokens given, measured now, once per sigma
    run = object()
    assert lag((8, 2), run, -1, 0.7, grid("flat"), H, W) < 0.1
    assert lag((8, 2), run, -1, 0.7, grid("noise"), H, W) < 0.1  # same sigma: the same value
    assert lag((8, 2), run, -1, 0.6, grid("noise"), H, W) > 0.8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the pinned-memory, event-timed read)")
def test_cuda_statistic_is_read_from_pinned_memory_after_its_event() -> None:
    lag, run = LaggedComplexity(), object()
    noise = grid("noise").cuda()
    lag((8, 2), run, 0, 1.0, noise, H, W)
    pending = lag._by[(8, 2)][3]
    assert pending is not None and pending.host.is_pinned() and pending.event is not None
    assert lag((8, 2), run, 1, 0.9, noise, H, W) == pytest.approx(float(complexity_stat(noise, H, W)), abs=1e-6)


def test_without_pinned_memory_the_statistic_is_read_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Page-locked memory can be unavailable: the statistic is then read as it is (a sync on a GPU), not lost."""
    from tokenfuse.scheduling import adaptive

    class DeviceStat:  # stands in for a 0-d CUDA tensor on this CPU machine
        is_cuda = True
        dtype = torch.float32

        def __float__(self) -> float:
            return 0.25

    real_empty = torch.empty

    def empty(*args: object, **kwargs: object) -> torch.Tensor:
        if kwargs.get("pin_memory"):
            raise RuntimeError("CUDA error: out of memory (pinned)")
        return real_empty(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(adaptive.torch, "empty", empty)
    pending = adaptive._Pending(DeviceStat())  # type: ignore[arg-type]
    assert pending.event is None and pending.read() == 0.25
