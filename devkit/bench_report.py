"""What the bench scripts share when they report (bench/unet_step.py, bench/step_cache.py).

- write_json: a --json file written through a temporary file and an atomic rename, so a bench rewrites it after
  every finished table and a run stopped mid-way (a step of bench/gpu_issue11.sh reaching its `timeout` cap) leaves
  the last complete file, never a truncated one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: str | Path, data: Any, indent: int = 1) -> None:
    """data as JSON to path (nothing without a path; its folder is made), through path + ".tmp" and os.replace.
    Values JSON cannot hold are written as str()."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, target)
