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
