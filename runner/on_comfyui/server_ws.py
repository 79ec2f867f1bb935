"""Watching one prompt on a ComfyUI server's websocket (`/ws?clientId=...`), for the runner's `--server` mode.

The messages this reads (ComfyUI 0.3.64: server.py, execution.py, main.py), JSON `{"type": T, "data": D}`, sent to
the client id the prompt was queued with:
- `execution_start {prompt_id}`: the prompt left the queue and runs now;
- `executing {node, prompt_id}`: a node starts; `node` None means the prompt ended (its /history entry exists);
- `progress {value, max, node, prompt_id}`: the running node's progress bar (sampler steps);
- `executed {node, output, prompt_id}`: a node's UI output (ScheduledFusion's report text is one);
- `execution_error {prompt_id, node_id, node_type, exception_type, exception_message, ...}`;
- `execution_interrupted {prompt_id, node_id, node_type}` (broadcast to every client), `execution_success`;
- `tokenfuse.stats` (this pack's live stats, sent to the client that queued the prompt, with its `prompt_id`, while a
  TokenFuse-scheduled model samples):
  the last event of a sampling run carries its summary line, with the peak memory the server process measured.
Binary frames (previews) and the other types (status, progress_state, execution_cached, feature_flags) are ignored.

aiohttp (one of ComfyUI's requirements, so present in ComfyUI's Python) is imported only when a prompt is watched;
`websocket_available()` says whether it can be, and the client polls /history without it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .protocol import Progress

# The run wrapper's summary line (nodes/run_stats.py, peak_memory_start): "..., peak VRAM 812 MiB [...]",
# "peak VRAM <= 812 MiB (earlier peak)" when an earlier run of the server process set the peak, or on CPU
# "peak RSS 950 MiB (process)".
_PEAK_VRAM = re.compile(r"peak VRAM (<= )?(\d+(?:\.\d+)?) MiB")
_PEAK_RSS = re.compile(r"peak RSS (\d+(?:\.\d+)?) MiB")
NO_MEMORY = "not known: the server reports peak memory only while a TokenFuse-scheduled model samples"


class WebsocketUnavailable(ConnectionError):
    """No websocket to the server (aiohttp missing, or the connection was refused); the caller polls instead."""


def websocket_available() -> bool:
    return importlib.util.find_spec("aiohttp") is not None


@dataclass
class PromptEvents:
    """What the websocket told about one prompt; `feed` is the whole protocol (pure, no network).

    finished: `executing` with node None arrived (the history entry is ready). outcome: "success", "error",
    "interrupted" or "" (not told). error: the execution_error / execution_interrupted data. node: the node running
    now. ui: UI outputs per node id. peak_mib / memory_kind: the largest peak memory the pack's stats reported
    while this prompt ran (None: not reported).
    """

    prompt_id: str = ""
    started: bool = False
    finished: bool = False
    outcome: str = ""
    error: dict[str, Any] = field(default_factory=dict)
    node: str | None = None
    ui: dict[str, dict[str, Any]] = field(default_factory=dict)
    peak_mib: float | None = None
    memory_kind: str = NO_MEMORY

    def feed(self, kind: str, data: dict[str, Any], progress: Progress | None = None) -> None:
        if kind == "tokenfuse.stats":  # carries the running prompt's id (older packs: none; one prompt runs at a time)
            if self.started and not self.finished and data.get("prompt_id", self.prompt_id) == self.prompt_id:
                self._peak(data)
            return
        if data.get("prompt_id") != self.prompt_id:
            return  # another client's prompt, or one of ours from before
        if kind == "execution_start":
            self.started = True
        elif kind == "executing":
            self.started = True
            self.node = data.get("node")
            if self.node is None:
                self.finished = True
        elif kind == "progress":
            if progress is not None:
                progress(int(data.get("value", 0)), int(data.get("max", 0)))
        elif kind == "executed":
            self.ui[str(data.get("node"))] = data.get("output") or {}
        elif kind == "execution_success":
            self.outcome = "success"
        elif kind in ("execution_error", "execution_interrupted"):
            self.outcome = "error" if kind == "execution_error" else "interrupted"
            self.error = data

    def _peak(self, data: dict[str, Any]) -> None:
        summary = str(data.get("summary") or "")
        vram, rss = _PEAK_VRAM.search(summary), _PEAK_RSS.search(summary)
        if vram:
            kind = "server cuda max_memory_allocated at the end of sampling (process peak, never reset" + (
                "; an earlier prompt set it)" if vram[1] else ")"
            )
            self._raise(float(vram[2]), kind)
        elif rss:
            self._raise(float(rss[1]), "server process peak RSS at the end of sampling (cumulative)")
        elif isinstance(data.get("peak_mem_mb"), (int, float)):
            # "rss": the process peak RSS on CPU (older packs sent a number only for CUDA)
            kind = (
                "server process peak RSS during sampling (cumulative)"
                if data.get("peak_mem_kind") == "rss"
                else "server cuda max_memory_allocated during sampling (process peak)"
            )
            self._raise(float(data["peak_mem_mb"]), kind)

    def _raise(self, mib: float, kind: str) -> None:
        if self.peak_mib is None or mib >= self.peak_mib:
            self.peak_mib, self.memory_kind = mib, kind


def watch_prompt(
    ws_url: str,
    submit: Callable[[], str],
    progress: Progress | None,
    idle: Callable[[PromptEvents], bool],
    tick_s: float = 0.5,
) -> PromptEvents:
    """Connect to `ws_url`, then queue the prompt (`submit()` returns its id: connecting first means no message is
    missed) and follow it until it ends. `idle(events)` runs every `tick_s`; True stops the watch early (time-out,
    or a prompt deleted from the queue). Raises WebsocketUnavailable when no websocket could be opened (nothing was
    submitted then); a connection lost later returns the events so far (not finished).
    """
    if not websocket_available():
        raise WebsocketUnavailable("aiohttp is not installed")
    return asyncio.run(_watch(ws_url, submit, progress, idle, tick_s))


async def _watch(
    ws_url: str,
    submit: Callable[[], str],
    progress: Progress | None,
    idle: Callable[[PromptEvents], bool],
    tick_s: float,
) -> PromptEvents:
    import aiohttp

    events = PromptEvents()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as session:
        try:
            ws = await session.ws_connect(ws_url, heartbeat=30.0, max_msg_size=0)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise WebsocketUnavailable(f"websocket {ws_url}: {e}") from e
        async with ws:
            events.prompt_id = submit()
            clock = asyncio.get_running_loop().time
            check_at = clock() + tick_s
            while not events.finished:
                if clock() >= check_at:  # on a clock, not on silence: other clients' broadcasts never pause
                    if idle(events):
                        break
                    check_at = clock() + tick_s
                try:  # (a zero timeout would mean none in aiohttp)
                    msg = await ws.receive(timeout=max(check_at - clock(), 0.001))
                except asyncio.TimeoutError:
                    continue
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break  # the server went away: the caller asks /history what became of the prompt
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue  # binary previews
                try:
                    message = json.loads(msg.data)
                except json.JSONDecodeError:
                    continue
                if isinstance(message, dict) and isinstance(message.get("data"), dict):
                    events.feed(str(message.get("type")), message["data"], progress)
    return events
