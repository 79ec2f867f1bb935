"""NODES.md is generated from the node classes (tools/gen_nodes_md.py) and must not drift from them."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import tokenfuse

REPO = Path(__file__).resolve().parents[1]
GEN = REPO / "tools" / "gen_nodes_md.py"


def _gen_module():
    spec = importlib.util.spec_from_file_location("tokenfuse_gen_nodes_md", GEN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_nodes_md_matches_node_classes() -> None:
    """Regenerated in a fresh interpreter without ComfyUI (as CI and the generator's users run it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, str(GEN), "--check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"{out.stderr[-6000:]}\nrun python tools/gen_nodes_md.py"


def test_every_node_input_and_output_is_documented() -> None:
    text = _gen_module().render(tokenfuse)
    for node_id, cls in tokenfuse.NODE_CLASS_MAPPINGS.items():
        section = text.split(f"`{node_id}` · category", 1)
        assert len(section) == 2, f"{node_id} missing"
        body = section[1].split("\n## ", 1)[0]
        spec = cls.INPUT_TYPES()
        for name in [*spec.get("required", {}), *spec.get("optional", {})]:
            assert f"| `{name}`" in body, f"{node_id}.{name} missing"
        for name in cls.RETURN_NAMES:
            assert f"| `{name}` |" in body, f"{node_id} output {name} missing"


def test_table_cells_stay_on_one_row() -> None:
    gen = _gen_module()
    assert gen._cell("a | b\nc") == "a \\| b c"

    class Fake:
        CATEGORY = "TokenFuse"
        DESCRIPTION = "A fake node\nwith two lines."
        RETURN_TYPES = ("IMAGE",)
        RETURN_NAMES = ("image",)
        OUTPUT_TOOLTIPS = ("out | tip",)

        @classmethod
        def INPUT_TYPES(cls):
            return {
                "required": {
                    "x": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "tooltip": "t|t"}),
                    "mode": (["a", "b"], {"tooltip": "m"}),
                },
                "hidden": {"uid": "UNIQUE_ID"},
            }

    md = gen.render_node("TokenFuseFake", Fake, "Fake")
    assert "| `x` | `FLOAT` 0 – 1 | `0.5` | t\\|t |" in md
    assert "| `mode` | choice: `a`, `b` | `a` | m |" in md
    assert "uid" not in md
    assert "| `image` | `IMAGE` | out \\| tip |" in md


def test_index_links_reach_their_headings_as_github_makes_anchors() -> None:
    """A link target with spaces or a slash is not a link on GitHub: the index used `name.lower()` and two of its
    entries showed as plain text. GitHub's anchor: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    gen = _gen_module()
    assert (
        gen.anchor("Face Refine / Swap / Detailer (ScheduledFusion)") == "face-refine--swap--detailer-scheduledfusion"
    )
    text = gen.render(tokenfuse)
    headings = {gen.anchor(line[3:]) for line in text.splitlines() if line.startswith("## ")}
    targets = re.findall(r"\]\(#([^)]*)\)", text)
    assert len(targets) == len(tokenfuse.NODE_CLASS_MAPPINGS)
    assert all(re.fullmatch(r"[a-z0-9_-]+", t) and t in headings for t in targets), targets


def test_comfyui_filled_choice_lists_are_named_not_listed() -> None:
    """Outside ComfyUI the sampler and scheduler widgets hold a 3-item fallback; NODES.md must not present that as
    the node's list."""
    text = _gen_module().render(tokenfuse)
    assert "choice: ComfyUI's samplers" in text and "choice: ComfyUI's schedulers" in text
    assert "`euler_ancestral`" not in text
