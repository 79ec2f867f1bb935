"""What the ComfyUI frontend sees: live stats websocket events and node previews in the temp folder."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from .env import comfy_available

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ live stats
def stats_listener_present() -> bool:
    """True when a ComfyUI server runs in this process (so live stats have somewhere to go)."""
    server = sys.modules.get("server")
    return getattr(getattr(server, "PromptServer", None), "instance", None) is not None


def running_prompt_id() -> str | None:
    """ComfyUI's id of the prompt being executed (the server sets it before each run), or None without a server.

    The editor files live stats under the workflow tab that queued this prompt: one page's tabs share a client id.
    """
    server = sys.modules.get("server")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    prompt_id = getattr(instance, "last_prompt_id", None)
    return prompt_id if isinstance(prompt_id, str) and prompt_id else None


def send_stats(event: str, data: dict[str, Any]) -> bool:
    """Send a websocket event to the ComfyUI frontend when a server runs; False (no-op) otherwise.

    Reads `server` from sys.modules instead of importing it: outside a running server there is nobody to tell, and
    importing the server module would be expensive.
    """
    server = sys.modules.get("server")
    prompt_server = getattr(server, "PromptServer", None)
    instance = getattr(prompt_server, "instance", None)
    if instance is None:
        return False
    try:
        # to the client that queued the running prompt, as ComfyUI's own progress events go (None: every client):
        # another browser's idle node with the same id must not show this run's stats
        instance.send_sync(event, data, getattr(instance, "client_id", None))
    except Exception as exc:  # a stats event must never break sampling
        log.debug("send_sync(%s) failed: %s", event, exc)
        return False
    return True


def save_temp_previews(images: Any, prefix: str = "tokenfuse_preview") -> list[dict[str, str]]:
    """Save IMAGE previews [B, H, W, 3] in 0..1 to ComfyUI's temp folder, as PreviewImage does, for a node's
    `{"ui": {"images": ...}}` (the editor shows them in the node). Without ComfyUI: nothing saved, []."""
    if not comfy_available() or images is None or len(images) == 0:
        return []
    import os
    import uuid

    import numpy as np
    from PIL import Image

    folder_paths = importlib.import_module("folder_paths")
    out_dir = folder_paths.get_temp_directory()
    os.makedirs(out_dir, exist_ok=True)
    saved = []
    for img in images:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}.png"
        pixels = (np.clip(img.detach().cpu().numpy(), 0.0, 1.0) * 255.0).round().astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(out_dir, name), compress_level=1)
        saved.append({"filename": name, "subfolder": "", "type": "temp"})
    return saved
