"""Request bodies of `serve`, bounded as they arrive, and error texts without server paths."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path


async def read_body(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """The request body, or None as soon as it passes `limit` bytes (the rest is never read). A chunked upload
    declares no Content-Length to refuse up front: counting as the chunks arrive is what bounds the memory one
    client can make the replica (and Serve's proxy, which forwards the body as the replica reads it) hold."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


def without_paths(text: str, named: dict[Path, str], folders: list[str | Path]) -> str:
    """`text` (an error for the client) with no server path in it: each file of `named` replaced by what it is to the
    client ("the video"), then each of `folders` (a request's temp folder, the embedded ComfyUI's work folder) cut
    out, so a file inside one reads as its bare name."""
    for file, said in named.items():
        text = text.replace(str(file), said)
    for folder in folders:
        text = text.replace(str(folder) + os.sep, "").replace(str(folder), "")
    return text


async def spool_body(chunks: AsyncIterator[bytes], limit: int, dest: Path) -> int | None:
    """Write the request body to `dest` as it arrives; its size, or None as soon as it passes `limit` bytes (the
    rest is never read). A video upload is up to 2 GB: read whole, a few at once would hold tens of GB."""
    size = 0
    with dest.open("wb") as out:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                return None
            out.write(chunk)
    return size
