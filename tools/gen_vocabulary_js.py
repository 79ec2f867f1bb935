"""Generate web/lib/vocabulary.js (the words the web chart shares with Python) from scheduling/vocabulary.py.

    python tools/gen_vocabulary_js.py           # write web/lib/vocabulary.js
    python tools/gen_vocabulary_js.py --check   # exit 1 when web/lib/vocabulary.js is out of date

The browser code cannot import Python, so the vocabulary (levels, presets, strategies and their labels, pool modes,
model families and their levels, the largest ratio) is written out as a small ES module that web/lib/*.js import.
A new strategy or preset is declared in Python only; rerun this and commit the file (tests/test_vocabulary.py runs
the check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, get_args

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

VOCABULARY_JS = REPO / "web" / "lib" / "vocabulary.js"
HEADER = (
    "// The pack's vocabulary for the browser code, generated from scheduling/vocabulary.py and\n"
    "// scheduling/schedule.py by `python tools/gen_vocabulary_js.py`: edit those, not this file.\n"
)


def vocabulary() -> dict[str, Any]:
    """NAME -> JSON value of every word the browser code shares with Python, in a fixed order."""
    load_pack()
    from tokenfuse.scheduling import schedule
    from tokenfuse.scheduling import vocabulary as voc

    return {
        "LEVELS": list(voc.LEVELS),
        "MAX_RATIO": schedule.MAX_RATIO,
        "PRESETS": list(get_args(voc.Preset)),
        "PRESET_ORDER": list(voc.PRESET_ORDER),
        "STRATEGIES": list(get_args(voc.Strategy)),
        "STRATEGY_LABELS": dict(voc.STRATEGY_LABELS),
        "POOL_MODES": list(get_args(schedule.PoolMode)),
        "FAMILIES": list(get_args(schedule.Family)),
        "FAMILY_LEVELS": {k: list(v) for k, v in schedule.FAMILY_LEVELS.items()},
    }


def render() -> str:
    """The module text: one frozen export per word."""
    lines = [HEADER]
    for name, value in vocabulary().items():
        text = json.dumps(value)
        lines.append(f"export const {name} = {text if isinstance(value, (int, float)) else f'Object.freeze({text})'};")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if web/lib/vocabulary.js differs from Python")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = VOCABULARY_JS.read_text(encoding="utf-8") if VOCABULARY_JS.exists() else ""
        if current != text:
            sys.stderr.write("web/lib/vocabulary.js is out of date: run python tools/gen_vocabulary_js.py\n")
            return 1
        return 0
    VOCABULARY_JS.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {VOCABULARY_JS.relative_to(REPO)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
