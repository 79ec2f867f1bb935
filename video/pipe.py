"""Decoding and encoding in their own threads, through bounded queues, so they overlap the per-frame work.

PyAV's decode and encode release the GIL (so do NumPy and OpenCV): a decode thread that stays a few frames ahead
and an encode thread a few frames behind take the codecs' time off the pass's critical path (DESIGN.md §11;
FaceFusion writes with ffmpeg in another process for the same reason). What reaches the writer is the same calls
in the same order as without threads (frames, then the audio packets demuxed up to each frame): the encoder and the
muxer get exactly what a single thread gives them (a lossless encode decodes to the same frames). Both ends are
bounded (`depth` items), so memory stays a few frames whatever the video's length, and an error on either
side is raised in the caller's thread.

    with Prefetch(frames_and_audio(reader), depth=4, clock=clock) as items:
        for frame, audio in items: ...
    with WriterThread(writer, depth=4, clock=clock) as out:
        out.write(frame); out.mux_audio(packets); out.finish()
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .clock import NULL_CLOCK, StageClock
from .encode import VideoWriter
from .types import Frame

T = TypeVar("T")
_END = object()
_POLL_S = 0.1  # how often a blocked thread looks whether the other side gave up


class _Failed:
    """An exception raised in a worker thread, carried to the caller's thread."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def frames_and_audio(reader: Any) -> Iterator[tuple[Frame | None, list[Any]]]:
    """(frame, audio and subtitle packets demuxed up to it) for each frame of a VideoReader, then (None, the rest):
    popped in the decoding thread right after each frame, so the writer gets the packets a single thread would."""
    for frame in reader:
        yield frame, reader.pop_audio()
    yield None, reader.pop_audio()


class Prefetch(Generic[T]):
    """Iterate `items` in a daemon thread, at most `depth` items ahead. The time each item takes to produce goes to
    stage `stage` of `clock`. Use as a context manager: leaving it stops the thread before the source is closed."""

    def __init__(self, items: Iterable[T], depth: int = 4, clock: StageClock = NULL_CLOCK, stage: str = "decode"):
        self._items, self._clock, self._stage = items, clock, stage
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenfuse-decode", daemon=True)

    def __enter__(self) -> Iterator[T]:
        self._thread.start()
        return self._iter()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._clock.timed(self._items, self._stage):
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as exc:  # raised again in the caller's thread
            self._put(_Failed(exc))
        finally:
            if inspect.isgenerator(self._items):
                self._items.close()  # here, in its own thread: a reader it opened is closed before the caller goes on

    def _iter(self) -> Iterator[T]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item


@dataclass(frozen=True)
class _Made(Generic[T]):
    """A frame to make in the encoder's thread (WriterThread.write_made)."""

    make: Callable[[T], Frame]
    arg: T


class WriterThread:
    """A VideoWriter driven from a daemon thread: `write` and `mux_audio` queue their call (at most `depth` waiting)
    and return; the writer runs them in order. `finish` waits for them, raises any error of the writer, and returns
    the writer's finish(). Leaving the context without finish stops the thread (the writer's own context then
    deletes the unfinished file). The writer's time goes to stage "encode" of `clock`."""

    def __init__(self, writer: VideoWriter, depth: int = 4, clock: StageClock = NULL_CLOCK) -> None:
        self.writer, self._clock = writer, clock
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenfuse-encode", daemon=True)
        self._thread.start()

    def __enter__(self) -> WriterThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def audio_packets(self) -> int:
        return self.writer.audio_packets

    def write(self, frame: Frame) -> None:
        self._call(self.writer.write, frame)

    def write_made(self, make: Callable[[T], Frame], arg: T) -> None:
        """Queue `make(arg)` and write the frame it returns, both in the encoder's thread: per-frame work that only
        reads what it is given (paste-back) leaves the caller's thread. make's time is not counted as "encode"."""
        self._call(_Made(make, arg), None)

    def mux_audio(self, packets: list[Any]) -> None:
        if packets:
            self._call(self.writer.mux_audio, packets)

    def finish(self) -> Any:
        """Wait for every queued call, then finish the writer (in this thread); raises the writer's error if any."""
        self._call(None, None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.writer.finish()

    def _call(self, fn: Any, arg: Any) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if not self._thread.is_alive():
                raise RuntimeError("the encoder thread has stopped")
            try:
                self._queue.put((fn, arg), timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fn, arg = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if fn is None:
                return
            try:
                if isinstance(fn, _Made):
                    made = fn
                    fn, arg = self.writer.write, made.make(made.arg)
                with self._clock.stage("encode"):
                    fn(arg)
            except BaseException as exc:  # raised again in the caller's thread by the next call or finish
                self._error = exc
                return
