"""The browser extension in web/: its pure JS functions (node's test runner) and their agreement with Python.

ComfyUI imports every `.js` under WEB_DIRECTORY in the browser, so the JS tests are `.mjs` files (never served as
extensions) and no `.js` file may import a Node-only module.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenfuse.scheduling.schedule import FAMILY_LEVELS, Schedule, preset_schedule

REPO = Path(__file__).resolve().parents[1]
WEB = REPO / "web"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js not installed (CI machines have Node 20): JS tests skip")


def _node_eval(script: str) -> object:
    """Run an ES-module snippet with web/lib importable as ./lib and return its JSON stdout."""
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script], cwd=WEB, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@needs_node
def test_js_unit_tests_pass() -> None:
    out = subprocess.run(
        [NODE, "--test", "web/test/"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    summary = "\n".join(ln for ln in out.stdout.splitlines() if re.match(r"# (tests|pass|fail)", ln))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"# pass [1-9]", summary), summary


@needs_node
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_js_presets_match_python_schedule(family: str) -> None:
    """The chart draws exactly the per-block ratios Schedule.ratio_for applies, for every preset."""
    presets = ["off", "balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb"]
    js = _node_eval(
        "import { presetSchedule, pyramidSeries } from './lib/pyramid.js';"
        f"const out = {{}}; for (const p of {json.dumps(presets)}) "
        f"out[p] = pyramidSeries(presetSchedule(p, '{family}'), '{family}');"
        "console.log(JSON.stringify(out));"
    )
    for name in presets:
        sched = preset_schedule(name, family)
        got = [b["ratio"] for b in js[name]]
        want = [sched.ratio_for(b["level"], b["index"]) for b in js[name]]
        assert got == pytest.approx(want, abs=1e-4), name
        assert {b["level"] for b in js[name]} == set(FAMILY_LEVELS[family]), "block levels disagree with FAMILY_LEVELS"


@needs_node
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_js_widgets_match_python_schedule_from_widgets(family: str) -> None:
    """Widget values → chart: the same Schedule the node builds (preset, strategy, ratio, schedule_text)."""
    from tokenfuse.nodes.scheduler_node import schedule_from_widgets

    cases = [
        {"preset": "balanced", "strategy": "preset", "ratio": 0.0, "schedule_text": ""},
        {"preset": "balanced", "strategy": "tome", "ratio": 0.3, "schedule_text": ""},
        {"preset": "off", "strategy": "todo", "ratio": 0.5, "schedule_text": ""},
        {"preset": "lowvram_6gb", "strategy": "preset", "ratio": 0.4, "schedule_text": '{"protect_blocks": 3}'},
        {
            "preset": "lowvram_4gb",
            "strategy": "topk",
            "ratio": 0.0,
            "schedule_text": '{"ratios": {"16": 0.2, "32": 0.6}, "ramp_start": 1, "ramp_step": 0.1, "ramp_every": 3}',
        },
    ]
    js = _node_eval(
        "import { resolveSchedule, pyramidSeries } from './lib/pyramid.js';"
        f"const out = {json.dumps(cases)}.map((c) => {{ const s = resolveSchedule(c, '{family}');"
        f" return {{ strategy: s.strategy, error: s.textError, series: pyramidSeries(s, '{family}') }}; }});"
        "console.log(JSON.stringify(out));"
    )
    for case, got in zip(cases, js, strict=True):
        sched = schedule_from_widgets(case["preset"], case["strategy"], case["ratio"], family, case["schedule_text"])
        assert got["error"] is None, got["error"]
        assert got["strategy"] == sched.strategy, case
        want = [sched.ratio_for(b["level"], b["index"]) for b in got["series"]]
        assert [b["ratio"] for b in got["series"]] == pytest.approx(want, abs=1e-4), case


@needs_node
def test_js_knows_every_schedule_field() -> None:
    """schedule_text validation in the chart accepts exactly the Schedule dataclass fields."""
    js = _node_eval("import { SCHEDULE_FIELDS } from './lib/pyramid.js'; console.log(JSON.stringify(SCHEDULE_FIELDS));")
    assert js == [f.name for f in dataclasses.fields(Schedule)]


@needs_node
def test_documented_stats_event_is_accepted() -> None:
    """The payload example in web/README.md (what the Python side sends) passes the extension's validation."""
    readme = (WEB / "README.md").read_text(encoding="utf-8")
    example = json.loads(re.search(r"```json\n(.*?)```", readme, flags=re.S).group(1))
    assert set(example) == {"node", "step", "steps", "step_time_s", "peak_mem_mb", "levels", "final", "summary"}
    got = _node_eval(
        "import { normalizeStats } from './lib/stats.js';"
        f"console.log(JSON.stringify(normalizeStats({json.dumps(example)})));"
    )
    assert got is not None
    assert got["node"] == example["node"] and got["steps"] == example["steps"]
    assert [lv["level"] for lv in got["levels"]] == sorted(lv["level"] for lv in example["levels"])


@needs_node
def test_extension_files_parse_as_es_modules() -> None:
    """The extension entry points are not imported by the unit tests: at least check their syntax."""
    for path in sorted(WEB.rglob("*.js")):
        out = subprocess.run([NODE, "--check", str(path)], capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, f"{path}: {out.stderr}"


def test_served_js_files_are_browser_modules() -> None:
    """Every .js under web/ is imported by the ComfyUI frontend: none may need Node, tests must be .mjs."""
    files = sorted(WEB.rglob("*.js"))
    assert files, "web/ has no extension"
    for path in files:
        src = path.read_text(encoding="utf-8")
        assert not re.search(r"""from\s+["']node:""", src), f"{path} imports a Node module but is served to browsers"
        for spec in re.findall(r"""^\s*import[^'"]*["']([^"']+)["']""", src, flags=re.M):
            assert spec.startswith("."), f"{path}: bare import {spec!r} does not resolve in the browser"
            if not spec.startswith("../../scripts/"):
                assert (path.parent / spec).resolve().is_file(), f"{path}: {spec} not found"
    assert not list((WEB / "test").glob("*.js")), "JS tests must be .mjs so ComfyUI does not load them"
