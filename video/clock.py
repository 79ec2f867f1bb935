"""Per-stage wall-clock accounting for the video passes, cheap enough to leave on.

A `StageClock` is a handful of `perf_counter` accumulators, one per stage name. The passes take one as an optional
argument; without it they use `NULL_CLOCK`, whose `stage` returns a shared do-nothing context, so timing never
slows a run that does not ask for it. Stages timed in another thread (a decode or encode thread) add up there:
the stages' sum may then exceed the wall time (the overlap is the point of the threads).

    clock = StageClock()
    with clock.stage("flow"):
        ...
    clock.seconds["flow"], clock.ms_per_frame(n)

`StageClock(timer=time.thread_time)` counts the CPU time of the thread a stage runs in instead: what a stage costs
without the waits for a core that wall time includes when threads share a small machine (work handed to other
threads, such as OpenCV's pool or the codecs' own threads, is not counted there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

STAGES: tuple[str, ...] = ("decode", "detect", "crop", "diffusion", "flow", "propagation", "paste", "encode")
"""decode: PyAV decode + RGB conversion; detect: detection, scene cuts and track building (pass 1); crop: aligned
crops and their grey flow images (pass 2); diffusion: the refine calls (key frames and flow failures); flow: DIS
flow and its validity maps; propagation: mixing the warped changes (and the refined detail); paste: paste-back into
the frame; encode: RGB -> YUV and the encoder."""


class _Span:
    """The context `StageClock.stage` returns: adds the time spent inside it to one stage."""

    __slots__ = ("_clock", "_name", "_t0")

    def __init__(self, clock: StageClock, name: str) -> None:
        self._clock, self._name, self._t0 = clock, name, 0.0

    def __enter__(self) -> None:
        self._t0 = self._clock.timer()

    def __exit__(self, *exc: object) -> None:
        self._clock.add(self._name, self._clock.timer() - self._t0)


class _NoSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


class StageClock:
    """Seconds per stage (see STAGES; other names are accepted too). Any thread may time any stage (`add` is locked:
    a few uncontended lock rounds per frame). timer: the clock read at a stage's start and end (wall time by default;
    time.thread_time for the CPU time of the timing thread)."""

    enabled = True

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.timer = timer
        self._lock = threading.Lock()

    def stage(self, name: str) -> _Span | _NoSpan:
        """A context manager adding its duration to stage `name`."""
        return _Span(self, name)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def timed(self, items: Iterable[T], name: str) -> Iterator[T]:
        """Iterate `items`, adding the time each `next` takes (e.g. decoding) to stage `name`."""
        it = iter(items)
        while True:
            t0 = self.timer()
            try:
                item = next(it)
            except StopIteration:
                self.add(name, self.timer() - t0)
                return
            self.add(name, self.timer() - t0)
            yield item

    def ms_per_frame(self, frames: int) -> dict[str, float]:
        """Milliseconds per frame of each stage."""
        n = max(frames, 1)
        return {k: v * 1000.0 / n for k, v in self.seconds.items()}


class _NullClock(StageClock):
    """A clock that measures nothing (the default)."""

    enabled = False

    def stage(self, name: str) -> _Span | _NoSpan:
        return _NO_SPAN

    def add(self, name: str, seconds: float) -> None:
        return None

    def timed(self, items: Iterable[T], name: str) -> Iterator[T]:
        return iter(items)


NULL_CLOCK: StageClock = _NullClock()
