"""One progress counter for a fusion pass: frames written of frames total, kept moving while key frames diffuse.

The fusion pass writes frames in bursts: frames wait in the buffer for the key frames on both sides of them, and
while a key-frame batch diffuses (seconds to minutes on a small GPU or a CPU) nothing is written. A bar that counts
frames written would stand still for the whole batch. So the refine may be given `tick` (keyword only, see
fuse_pass.Refine) and call it per sampler step; each tick moves the shown count one frame further into the frames
already read and waiting (they are what the batch unlocks), never past them. Frames written then catch up. The
shown count only grows, ends at the frames written, and every report goes through the one callback, so ComfyUI's
bar, the runner's progress line and `serve` follow the same numbers:

    counter = FrameProgress(progress, total)       # progress(done, total), e.g. ProgressBar.update_absolute
    counter.read(n)         # frames decoded so far (the ceiling of a tick)
    counter.written(n)      # frames written so far: reported at once
    counter.tick()          # a heartbeat from inside refine (a cancel point too: the callback may raise)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .track_pass import Progress


class FrameProgress:
    """See module doc. callback: progress(done, total), or None (then nothing is reported; tick still counts).
    total: the frames the pass will write (0 when unknown)."""

    def __init__(self, callback: Progress | None, total: int) -> None:
        self.callback, self.total = callback, total
        self.shown = 0
        self.frames_read = 0
        self.frames_written = 0
        self.ticks = 0

    def read(self, frames: int) -> None:
        """Frames decoded (and buffered or written) so far."""
        self.frames_read = max(self.frames_read, frames)

    def written(self, frames: int) -> None:
        """Frames written so far: the shown count becomes at least that, and is reported."""
        self.frames_written = frames
        self.frames_read = max(self.frames_read, frames)
        self.shown = max(self.shown, frames)
        self._report()

    def tick(self) -> None:
        """A heartbeat (a sampler step): one frame further, at most to the frames read; reported either way."""
        self.ticks += 1
        if self.shown < self.frames_read:
            self.shown += 1
        self._report()

    def _report(self) -> None:
        if self.callback is not None:
            self.callback(self.shown, self.total)


def takes_tick(refine: Callable[..., Any]) -> bool:
    """Whether `refine` accepts the keyword `tick` (a parameter of that name, or **kwargs): then it is given one."""
    try:
        params = inspect.signature(refine).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return False
    return any(p.name == "tick" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
