"""Issue 11 §1, no device sync on the hot path: host -> device copies are queued, never blocking (scheduling/
transfer.py), and on CUDA the attention patches of every strategy cause no sync per model call (devkit/patch_replay
.sync_audit, with PyTorch's sync debug mode; bench/patch_syncs.py prints the same table on a GPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tokenfuse.devkit.patch_replay import (
    SD15_BLOCKS,
    block_tensors,
    model_call_options,
    replay,
    sync_audit,
    with_plan,
)
from tokenfuse.devkit.patch_replay import with_step_state as stepped
from tokenfuse.scheduling import reducers
from tokenfuse.scheduling.patches import build_unet_patches
from tokenfuse.scheduling.schedule import Schedule
from tokenfuse.scheduling.strategies import tome as tome_strategy
from tokenfuse.scheduling.telemetry import RunTelemetry
from tokenfuse.scheduling.transfer import to_device


def test_a_cpu_tensor_bound_for_cuda_is_pinned_and_copied_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain .to("cuda") waits for the whole stream (PyTorch's memcpy_and_sync); pinned + non_blocking is queued.
    Recorded with stand-ins for pin_memory and .to, since this machine has no CUDA."""
    calls: list[Any] = []

    def pin(self: torch.Tensor) -> torch.Tensor:
        calls.append("pin_memory")
        return self

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(("to", args, kwargs))
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    to_device(torch.zeros(3), "cuda")
    assert calls == ["pin_memory", ("to", (torch.device("cuda"),), {"non_blocking": True})]
    calls.clear()
    to_device(torch.zeros(3), torch.device("cpu"))  # not CUDA: a plain move (no pinning on CPU-only builds)
    assert calls == [("to", (torch.device("cpu"),), {})]


def test_a_failed_pinned_staging_falls_back_to_a_plain_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Page-locked memory can run out (WSL limits it): the copy still happens, blocking, and the reduction is kept."""
    calls: list[Any] = []

    def pin(self: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: out of memory (pinned)")

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((args, kwargs))
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    to_device(torch.zeros(3), "cuda")
    assert calls == [((torch.device("cuda"),), {})]


def test_to_device_keeps_values_and_dtype() -> None:
    t = torch.arange(6).reshape(2, 3)
    out = to_device(t, "cpu")
    assert out.dtype == torch.int64 and torch.equal(out, t)


def test_tome_partitions_and_plan_tensors_reach_the_device_through_to_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-step ToMe partition (src/dst indices, re-drawn every step) and the plan's per-level tensors are the
    host -> device copies on the attention path: both go through to_device (a blocking .to would be 2 syncs per step
    and level for tome on a GPU)."""
    moved: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def spy(t: torch.Tensor, device: Any) -> torch.Tensor:
        moved.append((t.dtype, tuple(t.shape)))
        return to_device(t, device)

    monkeypatch.setattr(reducers, "to_device", spy)  # the plan's tensors (ReduceState)
    monkeypatch.setattr(tome_strategy, "to_device", spy)  # the partition
    steps = 3
    opts = with_plan(stepped(model_call_options(128, steps)), 128)
    patches = build_unet_patches(Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0), RunTelemetry())
    replay(patches, opts, block_tensors(128))
    index_copies = [m for m in moved if m[0] == torch.int64]
    assert len(index_copies) == 2 * steps, moved  # src and dst of the /8 grid's partition, once per step
    assert any(m[0] == torch.bool for m in moved), moved  # the plan's protected tokens, once per plan and grid


def test_every_audited_case_replays_on_the_cpu() -> None:
    """sync_audit's cases (each strategy, with the step state, with a face plan, and the sigma-read control) run
    end to end here with a counter that counts nothing: the GPU run then only measures."""
    ran: list[int] = []

    def count(fn: Any) -> int:
        ran.append(fn())
        return 0

    rows = sync_audit(128, 3, "cpu", count=count)
    assert len(rows) == 9 and all(r["syncs_per_model_call"] == 0 for r in rows)
    assert ran == [16, 32] * 9  # the first model call, then the two later ones, of 16 attention calls each
    assert {r["variant"] for r in rows} >= {"tome 0.5 /8 /16 + plan", "balanced (sigma read, control)"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (PyTorch's sync debug mode)")
def test_no_strategy_syncs_the_device_per_model_call() -> None:
    rows = {r["variant"]: r for r in sync_audit(512, 6, "cuda")}
    control = rows.pop("balanced (sigma read, control)")
    assert control["syncs_per_model_call"] >= 1, "the sigma fallback reads once per model call: the count is broken"
    for name, row in rows.items():
        assert row["syncs_per_model_call"] == 0, (name, row)
        # the first call builds the tables; a device-aware schedule also times its levels there (calibrate.py: synced
        # on purpose, once per shape), every other one must not sync even then
        assert row["calibrates"] or row["first_call_syncs"] == 0, (name, row)


def test_a_later_run_of_the_same_patched_model_draws_no_tome_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """ToMe re-draws its src/dst partition every step; the patched model keeps a run's worth (reducers
    .PARTITIONS_KEPT), so a video's next frame or the next queue item draws and copies none, with the same merges."""
    drawn: list[int] = []
    real = tome_strategy.random_partition

    def counting(h: int, w: int, sx: int, sy: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        drawn.append(seed)
        return real(h, w, sx, sy, seed)

    monkeypatch.setattr(tome_strategy, "random_partition", counting)
    steps = 25  # more steps than the 8 partitions kept before
    opts = stepped(model_call_options(128, steps))
    tome = Schedule(strategy="tome", ratios={8: 0.5, 16: 0.5}, protect_blocks=0)
    attn1, attn1_out = build_unet_patches(tome, RunTelemetry())
    xs = block_tensors(128)
    merged: list[list[torch.Tensor]] = [[], []]
    for run in range(2):

        def recording(n: torch.Tensor, ctx: Any, val: Any, eo: dict[str, Any], run: int = run) -> Any:
            out = attn1(n, ctx, val, eo)
            merged[run].append(out[0])
            return out

        replay((recording, attn1_out), opts, xs)
        if run == 0:
            assert len(drawn) == 2 * steps  # /8 and /16, once per step
            drawn.clear()
    assert drawn == []
    assert len(merged[0]) == len(merged[1]) == 16 * steps
    assert all(torch.equal(a, b) for a, b in zip(merged[0], merged[1], strict=True))
    inputs = [xs[level] for _ in range(steps) for _, level in SD15_BLOCKS]
    assert sum(a.shape[1] < b.shape[1] for a, b in zip(merged[0], inputs, strict=True)) == 2 * 5 * steps  # merged
