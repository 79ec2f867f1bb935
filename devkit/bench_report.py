"""What the bench scripts share when they report (bench/unet_step.py, bench/step_cache.py).

- write_json: a --json file written through a temporary file and an atomic rename, so a bench rewrites it after
  every finished table and a run stopped mid-way (a step of bench/gpu_issue11.sh reaching its `timeout` cap) leaves
  the last complete file, never a truncated one.
- quick_settings: a --quick smoke run's small values, for the options the command line did not give (an explicit
  `--repeats 5 --quick` keeps 5 repeats, even when 5 is the default).
- calibration_origin: whether the device-aware schedules' level decisions (scheduling/calibrate.py) were measured in
  this process or read from an earlier run's answers (scheduling/calibration_store.py, per machine on disk).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Sequence
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


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> set[str]:
    """The dests of the options `argv` (default: sys.argv[1:]) sets explicitly, whatever their values: argv parsed
    again by a copy of `parser` whose defaults are all suppressed, so only what was given lands in the namespace."""
    probe = copy.deepcopy(parser)
    for action in probe._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    given, _ = probe.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    return set(vars(given))


def quick_settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None, values: dict[str, Any]
) -> None:
    """--quick: set each of `values` (dest -> the smoke run's value) on args, except the options argv gave."""
    given = given_options(parser, argv)
    for dest, value in values.items():
        if dest not in given:
            setattr(args, dest, value)


def calibration_origin() -> str:
    """One line: how many level decisions this process measured and how many it read from an earlier run's store
    (their reason ends "(calibrated earlier)"), with the store's folder; from the loaded pack's calibration cache."""
    calibrate = sys.modules.get("tokenfuse.scheduling.calibrate")
    store = sys.modules.get("tokenfuse.scheduling.calibration_store")
    checks = list(getattr(calibrate, "_CACHE", {}).values())
    if not checks:
        return "level calibration: none in this run (no device-aware schedule ran, or calibration pinned)"
    earlier = sum("(calibrated earlier)" in c.reason for c in checks)
    try:
        where = f" ({store.folder()})" if store is not None else ""
    except OSError:  # no home folder (a container uid without one): the decisions stayed in the process
        where = " (no store: no home folder)"
    return f"level calibration: {len(checks) - earlier} measured in this run, {earlier} read from an earlier run{where}"
