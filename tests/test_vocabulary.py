"""One vocabulary (scheduling/vocabulary.py): declared once in Python, derived by the UI, mirrored by the browser code.

The browser code cannot import Python: it imports web/lib/vocabulary.js, generated from the Python declarations by
tools/gen_vocabulary_js.py (checked up to date here), and declares none of those words itself. What it still mirrors
(the schedule defaults, the chart's per-family tables) is read here with Node and compared with Python.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
import tokenfuse
from tokenfuse.scheduling import downsample, merge, topk, vocabulary
from tokenfuse.scheduling.schedule import FAMILY_LEVELS, MAX_RATIO, Family, Schedule, Strategy
from tokenfuse.scheduling.vocabulary import (
    LEVELS,
    MODEL_EXTENSIONS,
    PRESET_ORDER,
    STRATEGY_LABELS,
    Device,
    Level,
    Preset,
)

REPO = Path(__file__).resolve().parents[1]
WEB = REPO / "web"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js not installed (CI machines have Node 20): JS tests skip")
PACK_DIRS = ("scheduling", "faces", "fusion", "video", "nodes")


def _node_eval(script: str) -> object:
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script], cwd=WEB, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_levels_come_from_the_level_literal() -> None:
    assert LEVELS == get_args(Level) == (8, 16, 32, 64)
    assert set(FAMILY_LEVELS["sd15"]) == set(LEVELS)
    assert all(set(levels) <= set(LEVELS) for levels in FAMILY_LEVELS.values())


def test_preset_order_is_every_preset_once_weakest_first() -> None:
    assert sorted(PRESET_ORDER) == sorted(get_args(Preset))
    assert PRESET_ORDER[0] == "off" and PRESET_ORDER[-1] == "lowvram_4gb"
    # weakest -> strongest: the 4 GB preset removes at least as many tokens as the 8 GB one at every level
    from tokenfuse.scheduling.schedule import preset_schedule

    removed = [sum(preset_schedule(p, "sd15").ratios.values()) for p in PRESET_ORDER]
    assert removed == sorted(removed)


def test_identity_is_one_object() -> None:
    """merge, downsample and top-K return the same do_nothing, so `fn is do_nothing` means the same everywhere."""
    assert merge.do_nothing is downsample.do_nothing is topk.do_nothing is vocabulary.do_nothing
    x = object()
    assert vocabulary.do_nothing(x) is x


def test_node_choices_are_derived_from_the_vocabulary() -> None:
    nodes = tokenfuse.NODE_CLASS_MAPPINGS
    detect = nodes["TokenFuseFaceDetect"].INPUT_TYPES()["required"]
    assert detect["device"][0] == list(get_args(Device))
    tokenize = nodes["TokenFusePatchTokenize"].INPUT_TYPES()["required"]
    assert tokenize["preview_level"][0] == [str(f) for f in LEVELS]
    controller = nodes["TokenFuseTokenSchedulerController"].INPUT_TYPES()["required"]
    assert controller["preset"][0] == list(get_args(Preset))


def test_the_restorer_loads_every_extension_the_model_list_offers(tmp_path: Path) -> None:
    """GFPGANEnhance lists files with MODEL_EXTENSIONS; the loader must not refuse one of them for its type."""
    from tokenfuse.fusion.restore import RestorerLoadError, load_state_dict

    assert all(e.startswith(".") and e == e.lower() for e in MODEL_EXTENSIONS)
    for ext in (*MODEL_EXTENSIONS, ".py"):
        path = tmp_path / f"model{ext}"
        path.write_bytes(b"not a model")
        with pytest.raises(Exception) as caught:  # noqa: B017 - garbage content fails; only the reason matters
            load_state_dict(path)
        refused = isinstance(caught.value, RestorerLoadError) and "unsupported model file type" in str(caught.value)
        assert refused == (ext == ".py"), (ext, caught.value)


def _redeclarations(path: Path) -> list[str]:
    """Top-level re-declarations of vocabulary words in one pack file."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "do_nothing":
            found.append(f"{path.name}:{node.lineno} def do_nothing")
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            src = ast.unparse(node.value)
            if re.fullmatch(r"\(?8, 16, 32, 64\)?", src):
                found.append(f"{path.name}:{node.lineno} level factors")
            if src == "Literal['cpu', 'auto']":
                found.append(f"{path.name}:{node.lineno} Device")
            if "'.safetensors'" in src and "'.pth'" in src:
                found.append(f"{path.name}:{node.lineno} model extensions")
            listed = isinstance(node.value, (ast.Tuple, ast.List, ast.Subscript))  # not a table keyed by preset
            if listed and "'lowvram_8gb'" in src and "'lowvram_4gb'" in src:
                found.append(f"{path.name}:{node.lineno} preset names")
    return found


def test_vocabulary_is_declared_once() -> None:
    files = [p for d in PACK_DIRS for p in sorted((REPO / d).rglob("*.py")) if p.name != "vocabulary.py"]
    offenders = [hit for p in files for hit in _redeclarations(p)]
    assert not offenders, offenders


def test_the_redeclaration_check_finds_a_copy(tmp_path: Path) -> None:
    copy = tmp_path / "copy.py"
    copy.write_text(
        "LEVELS = (8, 16, 32, 64)\nD = Literal['cpu', 'auto']\nX = ('.safetensors', '.pth')\n"
        "ORDER = ('off', 'lowvram_8gb', 'lowvram_4gb')\nTABLE = {'lowvram_8gb': 1, 'lowvram_4gb': 2}\n"
        "def do_nothing(x):\n    return x\n",
        encoding="utf-8",
    )
    assert len(_redeclarations(copy)) == 5  # the table keyed by preset is content, not a copy


@needs_node
def test_js_mirror_matches_the_python_vocabulary() -> None:
    js = _node_eval(
        "import * as pyramid from './lib/pyramid.js'; import * as labels from './lib/labels.js';"
        f"const presets = {json.dumps(list(get_args(Preset)))};"
        "console.log(JSON.stringify({"
        " levels: pyramid.LEVELS, maxRatio: pyramid.MAX_RATIO, familyLevels: pyramid.FAMILY_LEVELS,"
        " blockLevels: pyramid.BLOCK_LEVELS, defaults: pyramid.SCHEDULE_DEFAULTS,"
        " strategies: Object.keys(labels.STRATEGY_LABELS), families: Object.keys(labels.FAMILY_LABELS),"
        " presets: presets.map((p) => pyramid.presetSchedule(p) !== null),"
        " unknownPreset: pyramid.presetSchedule('no_such_preset'),"
        "}));"
    )
    assert isinstance(js, dict)
    assert tuple(js["levels"]) == LEVELS
    assert js["maxRatio"] == MAX_RATIO
    assert {k: tuple(v) for k, v in js["familyLevels"].items()} == FAMILY_LEVELS
    for family, levels in js["blockLevels"].items():
        assert set(levels) == set(FAMILY_LEVELS[family]), family
    assert sorted(js["strategies"]) == sorted(get_args(Strategy))
    assert sorted(js["families"]) == sorted(get_args(Family))
    assert all(js["presets"]) and js["unknownPreset"] is None
    defaults = {f.name: f.default for f in dataclasses.fields(Schedule)}
    camel = {re.sub(r"_(\w)", lambda m: m.group(1).upper(), k): v for k, v in defaults.items()}
    for key, value in js["defaults"].items():
        assert camel[key] == pytest.approx(value), key


def test_generated_vocabulary_js_is_up_to_date() -> None:
    """web/lib/vocabulary.js is what tools/gen_vocabulary_js.py writes from the Python vocabulary today."""
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_vocabulary_js.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert list(STRATEGY_LABELS) == sorted(STRATEGY_LABELS)
    assert set(STRATEGY_LABELS) == set(get_args(Strategy))


def _js_copies(text: str, name: str) -> list[str]:
    """Literal lists / objects in browser code that spell out a vocabulary: every strategy, every preset, or the
    levels."""
    words_of = {
        "strategies": set(get_args(Strategy)),
        "presets": set(get_args(Preset)),
    }
    found = []
    for group in re.findall(r"[\[{][^\[\]{}]*[\]}]", text):
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", group))
        found += [f"{name}: {what}" for what, vocab in words_of.items() if vocab <= words]
        if re.findall(r"\d+", group) == [str(lv) for lv in LEVELS]:
            found.append(f"{name}: levels")
    return found


def test_browser_code_declares_no_vocabulary_of_its_own() -> None:
    files = sorted([*WEB.glob("*.js"), *(WEB / "lib").glob("*.js")])
    offenders = [
        hit for p in files if p.name != "vocabulary.js" for hit in _js_copies(p.read_text(encoding="utf-8"), p.name)
    ]
    assert not offenders, offenders
    copy = 'const S = Object.freeze(["tome", "todo", "topk"]);\nconst L = { todo: "a", tome: "b", topk: "c" };\n'
    copy += "const LEVELS = [8, 16, 32, 64];\n"
    assert _js_copies(copy, "copy.js") == ["copy.js: strategies", "copy.js: strategies", "copy.js: levels"]
