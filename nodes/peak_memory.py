"""Peak memory of one sampling run, for the run summary line and the live stats: CUDA's max_memory_allocated on a
GPU (never reset: callers measure their own spans with it), the process's peak RSS on CPU."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

PeakKind = Literal["vram", "rss"]


def peak_memory_kind(device: Any) -> PeakKind | None:
    """What peak_memory_start measures on `device`: "vram" (CUDA's max_memory_allocated), "rss" (the process peak
    RSS, on CPU), None (neither: CPU on Windows)."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return "vram"
    return "rss" if process_peak_rss_mib() is not None else None


def process_peak_rss_mib() -> float | None:
    """The process's peak resident set size in MiB (getrusage: KiB on Linux, bytes on macOS); None on Windows."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def peak_memory_start(device: Any) -> tuple[Callable[[], str], Callable[[], float | None]]:
    """Start measuring peak memory on `device`: (format the peak since now, peak MiB: the device's on CUDA, the
    process peak RSS on CPU, what the run summary says too; None where neither is known)."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        # Never reset the allocator's peak: callers (ScheduledFusion, benches) measure their own spans with it.
        # A peak above the one held before the run was set by this run, so it is this run's peak exactly.
        before = torch.cuda.max_memory_allocated(dev) / 2**20

        def cuda_mib() -> float:
            return torch.cuda.max_memory_allocated(dev) / 2**20

        def cuda_text() -> str:
            now = cuda_mib()
            return f"peak VRAM {now:.0f} MiB" if now > before else f"peak VRAM <= {before:.0f} MiB (earlier peak)"

        return cuda_text, cuda_mib
    if process_peak_rss_mib() is None:
        return (lambda: "peak memory n/a on CPU"), lambda: None

    def rss() -> str:
        return f"peak RSS {process_peak_rss_mib():.0f} MiB (process)"

    return rss, process_peak_rss_mib
