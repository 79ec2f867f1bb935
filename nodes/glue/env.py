"""Is ComfyUI there; progress bar and cancel point; OOM / interrupt classification; device memory figures."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class ComfyUnavailableError(RuntimeError):
    """Raised when a feature needs ComfyUI and the `comfy` package cannot be imported."""


def comfy_available() -> bool:
    """True when ComfyUI's `comfy` package is importable (inside ComfyUI or with its folder on sys.path)."""
    return "comfy" in sys.modules or importlib.util.find_spec("comfy") is not None


def require_comfy(feature: str) -> None:
    """Raise a clear error when `feature` needs ComfyUI and it is absent."""
    if not comfy_available():
        raise ComfyUnavailableError(
            f"{feature} needs ComfyUI: run it inside ComfyUI (or put the ComfyUI folder on sys.path)."
        )


# ----------------------------------------------------------------------------------------------- progress / cancel
class _NoProgress:
    """Stand-in for comfy.utils.ProgressBar outside ComfyUI."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.current = 0

    def update(self, value: int) -> None:
        self.current += value

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        self.current = value
        if total is not None:
            self.total = total


def progress_bar(total: int) -> Any:
    """comfy.utils.ProgressBar(total) inside ComfyUI (its update() raises on user cancel); a no-op outside."""
    if comfy_available():
        try:
            import comfy.utils

            return comfy.utils.ProgressBar(total)
        except ImportError:
            pass
    return _NoProgress(total)


class StepProgress:
    """ScheduledFusion's bar: faces x sampling steps, moved from the sampler's per-step callback (as KSampler's bar
    moves), so a photo with one face shows each step instead of 0/1 for the whole sampling.

    A batch of B faces sampled from face `done` on moves the bar from done*steps to (done+B)*steps over its steps;
    face_done() (once per face when its batch is finished, fallbacks included) moves it to that face's end if the
    sampler did not (denoise 0, a failed batch). The bar never goes back: a fallback's rerun of a batch (split into
    single faces after an out-of-memory error) holds it where it was until the rerun passes that point."""

    def __init__(self, faces: int, steps: int) -> None:
        self.steps = max(1, int(steps))
        self.bar = progress_bar(max(1, int(faces)) * self.steps)
        self.done = 0  # faces finished
        self.position = 0

    def face_done(self) -> None:
        self.done += 1
        if self.done * self.steps > self.position:
            self._show(self.done * self.steps)

    def on_step(self, batch: int) -> Callable[[int, int], None]:
        """The sampler callback's part for a batch of `batch` faces: on_step(steps done, steps in this run)."""
        base, width = self.done * self.steps, max(1, batch) * self.steps

        def step(i: int, total: int) -> None:
            value = base + width * i // max(1, total)
            if value > self.position:  # never backwards: a fallback's rerun of a batch waits where the bar was
                self._show(value)

        return step

    def _show(self, value: int) -> None:
        self.position = value
        self.bar.update_absolute(value)


def throw_if_interrupted() -> None:
    """Raise ComfyUI's interrupt exception when the user pressed cancel; no-op outside ComfyUI."""
    if "comfy.model_management" in sys.modules:
        sys.modules["comfy.model_management"].throw_exception_if_processing_interrupted()


def oom_exception() -> type[BaseException]:
    """comfy.model_management.OOM_EXCEPTION inside ComfyUI (torch.cuda.OutOfMemoryError), MemoryError outside."""
    mm = sys.modules.get("comfy.model_management")
    if mm is None and comfy_available():
        mm = importlib.import_module("comfy.model_management")
    return getattr(mm, "OOM_EXCEPTION", MemoryError) if mm is not None else MemoryError


def is_oom(exc: BaseException) -> bool:
    oom = oom_exception()
    return isinstance(exc, MemoryError) or (oom is not Exception and isinstance(exc, oom))


def is_interrupt(exc: BaseException) -> bool:
    """True for ComfyUI's cancel exception (it must propagate, never count as a failed face)."""
    return type(exc).__name__ == "InterruptProcessingException"


def compute_device(model: Any) -> Any:
    """The device sampling runs on (model.load_device; ComfyUI's torch device otherwise)."""
    dev = getattr(model, "load_device", None)
    if dev is None and comfy_available():
        import comfy.model_management as mm

        dev = mm.get_torch_device()
    return dev


def peak_reset(device: Any) -> None:
    import torch

    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: Any) -> int | None:
    """Peak allocated device memory since peak_reset (CUDA); None where the device cannot tell (CPU)."""
    import torch

    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(device))
    return None


def empty_cache() -> None:
    if "comfy.model_management" in sys.modules:
        sys.modules["comfy.model_management"].soft_empty_cache()
