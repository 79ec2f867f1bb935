"""Generate NODES.md (every node: inputs, outputs, tooltips) from the node classes.

    python tools/gen_nodes_md.py           # write NODES.md
    python tools/gen_nodes_md.py --check   # exit 1 when NODES.md is out of date

The pack is loaded by path as package `tokenfuse`, the way ComfyUI (and tests/conftest.py) loads it, so the text
comes from the same INPUT_TYPES / RETURN_TYPES / OUTPUT_TOOLTIPS / DESCRIPTION that ComfyUI shows. Run it outside
ComfyUI (plain Python): choices that come from model folders then show their stand-alone values, and ComfyUI's
sampler and scheduler lists are named rather than listed, so the file is the same on every machine.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

NODES_MD = REPO / "NODES.md"
HEADER = (
    "# TokenFuse nodes\n\n"
    "<!-- Generated from the node classes by `python tools/gen_nodes_md.py`; edit the tooltips there, not here. -->\n\n"
    "Every node with its inputs and outputs, as ComfyUI shows them (the same text appears as tooltips).\n"
)


def _cell(text: Any) -> str:
    """One markdown table cell: single line, pipes escaped."""
    s = " ".join(str(text).split())
    return s.replace("|", "\\|")


def _fmt_number(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


# Choice lists that ComfyUI fills in (the stand-alone lists are only a fallback): named, not listed.
COMFY_LISTS = {"sampler_name": "ComfyUI's samplers", "scheduler": "ComfyUI's schedulers"}


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (but - and _), each space a hyphen."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def _input_row(name: str, entry: tuple, optional: bool) -> str:
    kind = entry[0]
    opts: dict[str, Any] = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
    if isinstance(kind, (list, tuple)) and name in COMFY_LISTS:
        type_txt = f"choice: {COMFY_LISTS[name]} (those of the ComfyUI it runs in)"
        default = opts.get("default", kind[0] if kind else "")
    elif isinstance(kind, (list, tuple)):
        type_txt = "choice: " + ", ".join(f"`{c}`" for c in kind)
        default = opts.get("default", kind[0] if kind else "")
    else:
        type_txt = f"`{kind}`"
        default = opts.get("default", "")
    if kind in ("INT", "FLOAT"):
        lo, hi = opts.get("min"), opts.get("max")
        step = opts.get("step")
        rng = f"{_fmt_number(lo)} – {_fmt_number(hi)}" + (f" (step {_fmt_number(step)})" if step is not None else "")
        type_txt += f" {rng}"
    if isinstance(default, bool):
        default_txt = "true" if default else "false"
    elif isinstance(default, str):
        default_txt = f"`{default}`" if default else ('`""`' if "default" in opts else "")
    else:
        default_txt = f"`{_fmt_number(default)}`" if default != "" else ""
    label = f"`{name}`" + (" (optional)" if optional else "")
    return f"| {label} | {_cell(type_txt)} | {_cell(default_txt)} | {_cell(opts.get('tooltip', ''))} |"


def render_node(node_id: str, cls: type, display: str) -> str:
    lines = [f"## {display}", "", f"`{node_id}` · category `{cls.CATEGORY}`", "", " ".join(cls.DESCRIPTION.split()), ""]
    spec = cls.INPUT_TYPES()
    rows = [_input_row(n, e, False) for n, e in spec.get("required", {}).items()]
    rows += [_input_row(n, e, True) for n, e in spec.get("optional", {}).items()]
    lines += ["**Inputs**", ""]
    if rows:
        lines += ["| input | type | default | what it does |", "|---|---|---|---|", *rows]
    else:
        lines.append("none")
    names = getattr(cls, "RETURN_NAMES", None) or tuple(t.lower() for t in cls.RETURN_TYPES)
    tips = getattr(cls, "OUTPUT_TOOLTIPS", None) or ("",) * len(cls.RETURN_TYPES)
    lines += ["", "**Outputs**", ""]
    if cls.RETURN_TYPES:
        lines += ["| output | type | what it is |", "|---|---|---|"]
        lines += [f"| `{n}` | `{t}` | {_cell(tip)} |" for n, t, tip in zip(names, cls.RETURN_TYPES, tips, strict=False)]
    else:
        lines.append("none (output node)")
    return "\n".join(lines) + "\n"


def render(pack: ModuleType | None = None) -> str:
    """The full NODES.md text, nodes sorted by category, then display name."""
    pack = pack or load_pack()
    mappings: dict[str, type] = pack.NODE_CLASS_MAPPINGS
    names: dict[str, str] = pack.NODE_DISPLAY_NAME_MAPPINGS
    order = sorted(mappings, key=lambda k: (mappings[k].CATEGORY, names.get(k, k)))
    parts = [HEADER]
    if order:
        parts.append(
            "\n| node | category | id |\n|---|---|---|\n"
            + "".join(
                f"| [{names.get(k, k)}](#{anchor(names.get(k, k))}) | `{mappings[k].CATEGORY}` | `{k}` |\n"
                for k in order
            )
        )
    else:
        parts.append("\nNo nodes yet.\n")
    parts += ["\n" + render_node(k, mappings[k], names.get(k, k)) for k in order]
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if NODES.md differs from the node classes")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = NODES_MD.read_text(encoding="utf-8") if NODES_MD.exists() else ""
        if current != text:
            diff = list(
                difflib.unified_diff(current.splitlines(), text.splitlines(), "NODES.md", "generated", lineterm="")
            )
            sys.stderr.write("\n".join(diff[:80]) + "\nNODES.md is out of date: run python tools/gen_nodes_md.py\n")
            return 1
        return 0
    NODES_MD.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {NODES_MD} ({len(load_pack().NODE_CLASS_MAPPINGS)} nodes)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
