"""Host -> device copies that never drain the device queue (issue 11 §1: no device sync on the hot path).

A plain `cpu_tensor.to("cuda")` is a blocking copy: PyTorch issues it and then waits for the whole stream to finish
(`memcpy_and_sync`), a device sync in the middle of the U-Net, like reading a value to the host. Staged through
page-locked memory and issued non-blocking, the copy is queued on the stream like a kernel: work queued after it sees
the data, the host goes on. The pinned staging block stays reserved until the copy has run (PyTorch's caching host
allocator records an event on it), so the source may be dropped at once.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
_pin_failed: list[bool] = []  # warned once per process


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """t (any shape) on device; a CPU tensor bound for CUDA is staged in pinned memory and copied without blocking.
    Other moves (CPU, MPS, XPU, already there) are a plain `.to`, and so is a copy whose pinned staging fails (page-
    locked memory is limited on some hosts, e.g. WSL): a sync then, never a lost reduction."""
    target = torch.device(device)
    if target.type == "cuda" and t.device.type == "cpu":
        try:
            staged = t.pin_memory()
        except RuntimeError as exc:
            if not _pin_failed:
                _pin_failed.append(True)
                log.warning("TokenFuse: pinned host memory unavailable (%s); host->GPU copies will block", exc)
        else:
            return staged.to(target, non_blocking=True)
    return t.to(target)
