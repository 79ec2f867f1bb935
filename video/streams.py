"""Copying an input's audio and subtitle streams into an output: packets as they are, with their language, title and
default flag; audio the output container cannot hold (AMR of phone .3gp clips, u8 / ADPCM PCM of camera AVIs,
mu-law MOV in an MP4) is transcoded to AAC instead, with a warning, so no output loses its sound.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

STREAM_TAGS = ("language", "title")  # what players show in their track menus; DURATION & co. are the muxer's own


def add_copy(container: Any, stream: Any) -> Any:
    """An output stream for `stream`'s packets (codec parameters, tags, disposition). ValueError when the container
    cannot hold the codec."""
    out = container.add_stream_from_template(stream)
    copy_tags(container, stream, out)
    return out


def copy_tags(container: Any, stream: Any, out: Any) -> None:
    """Language, title and disposition of `stream` onto `out`. MP4 / MOV keep a track's title as its handler name
    (what players list); their muxer drops a `title` tag."""
    for key in STREAM_TAGS:
        value = stream.metadata.get(key)
        if value:
            out.metadata[key] = value
    title = stream.metadata.get("title") or stream.metadata.get("handler_name")
    if title and container.format.name in ("mp4", "mov"):
        out.metadata["handler_name"] = title
    try:
        out.disposition = stream.disposition
    except TypeError:  # PyAV 14-17 (ComfyUI allows av>=14.2): the setter takes the flags as an int, not a Disposition
        out.disposition = int(getattr(stream.disposition, "value", stream.disposition))


class StreamCopy:
    """One input audio or subtitle stream in an output: packets copied (`transcode` False) or, for audio the
    container cannot hold, decoded and re-encoded as AAC.

    mux(packet): the input packet (its stream is the input stream); finish(): flush a transcoder. `packets` counts
    what was muxed (input packets for a copy, AAC packets for a transcode)."""

    def __init__(self, container: Any, stream: Any, name: str) -> None:
        self.container, self.source, self.packets = container, stream, 0
        try:
            self.stream, self.transcode = add_copy(container, stream), False
        except ValueError as exc:
            if stream.type != "audio":
                raise
            rate, layout = stream.codec_context.sample_rate or 48000, stream.codec_context.layout.name
            self.stream = container.add_stream("aac", rate=rate, layout=layout)
            self.stream.codec_context.bit_rate = 128_000 if stream.codec_context.layout.nb_channels > 1 else 96_000
            copy_tags(container, stream, self.stream)
            self.transcode = True
            log.warning(
                "%s: audio stream #%d (%s) cannot be copied (%s); transcoded to AAC",
                name,
                stream.index,
                stream.codec_context.name,
                exc,
            )

    def mux(self, packet: Any) -> None:
        if not self.transcode:
            packet.stream = self.stream
            self.container.mux(packet)
            self.packets += 1
            return
        for frame in self.source.codec_context.decode(packet):
            self._encode(frame)

    def finish(self) -> None:
        if self.transcode:
            for frame in self.source.codec_context.decode(None):
                self._encode(frame)
            self._encode(None)

    def _encode(self, frame: Any) -> None:
        for out in self.stream.encode(frame):
            self.container.mux(out)
            self.packets += 1
