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
def test_js_dit_chart_matches_python_schedule() -> None:
    """DiT has no U-Net levels: the chart draws one bar, the share of K/V the DiT override drops in every attention
    call (dit_ratio), for every preset and the ratio / schedule_text widgets, and the run's level-0 stats mean DiT."""
    from tokenfuse.nodes.scheduler_node import schedule_from_widgets

    cases = [
        {"preset": p, "strategy": "preset", "ratio": 0.0, "schedule_text": ""}
        for p in ["off", "balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb"]
    ] + [
        {"preset": "balanced", "strategy": "tome", "ratio": 0.3, "schedule_text": ""},
        {"preset": "lowvram_4gb", "strategy": "preset", "ratio": 0.0, "schedule_text": '{"dit_ratio": 0.2}'},
    ]
    js = _node_eval(
        "import { chartFamily, resolveSchedule, pyramidSeries } from './lib/pyramid.js';"
        f"const out = {json.dumps(cases)}.map((c) => {{ const s = resolveSchedule(c, 'dit');"
        " return { protect: s.protectBlocks, strategy: s.strategy, series: pyramidSeries(s, 'dit') }; });"
        "console.log(JSON.stringify({ out, family: chartFamily(undefined, [{ level: 0 }]) }));"
    )
    assert js["family"] == "dit"
    for case, got in zip(cases, js["out"], strict=True):
        sched = schedule_from_widgets(case["preset"], case["strategy"], case["ratio"], "dit", case["schedule_text"])
        assert got["series"] == [{"index": 0, "level": 0, "ratio": pytest.approx(sched.dit_ratio)}], case
        assert (got["protect"], got["strategy"]) == (sched.protect_blocks, sched.strategy), case


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
    assert set(example) == {
        "node",
        "prompt_id",
        "step",
        "steps",
        "step_time_s",
        "peak_mem_mb",
        "peak_mem_kind",
        "levels",
        "final",
        "summary",
        "status",
    }
    got = _node_eval(
        "import { normalizeStats } from './lib/stats.js';"
        f"console.log(JSON.stringify(normalizeStats({json.dumps(example)})));"
    )
    assert got is not None
    assert got["node"] == example["node"] and got["steps"] == example["steps"]
    assert got["promptId"] == example["prompt_id"]
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


def _python_verdict(text: str, preset: str = "balanced") -> str | None:
    """What a run says about a schedule_text: None when the node accepts it, else the ScheduleError's message."""
    from tokenfuse.nodes.scheduler_node import schedule_from_widgets
    from tokenfuse.scheduling.schedule import ScheduleError

    try:
        schedule_from_widgets(preset, "preset", 0.0, "sd15", text)
    except ScheduleError as exc:
        return str(exc)
    return None


def _js_verdicts(texts: list[str], preset: str = "balanced") -> list[str | None]:
    got = _node_eval(
        "import { resolveSchedule } from './lib/pyramid.js';"
        f"console.log(JSON.stringify({json.dumps(texts)}.map((t) => "
        f"resolveSchedule({{ preset: {json.dumps(preset)}, schedule_text: t }}, 'sd15').textError)));"
    )
    assert isinstance(got, list)
    return got


SCHEDULE_TEXTS = [
    "",
    "null",
    "{}",
    "[1]",
    "42",
    '"todo"',
    '{"bogus": 1, "zz": 2}',
    '{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}',
    '{"strategy": "tome"}',
    '{"strategy": "bogus"}',
    '{"strategy": 3}',
    '{"pool": "nearest"}',
    '{"pool": "max"}',
    '{"ratios": []}',
    '{"ratios": {"8": 0.5, "32": 0.9}}',
    '{"ratios": {"08": 0.5, " 16 ": 0.25, "3_2": 0.1}}',
    '{"ratios": {"7": 0.1}}',
    '{"ratios": {"8.0": 0.1}}',
    '{"ratios": {"0x8": 0.1}}',
    '{"ratios": {"8": 0.95}}',
    '{"ratios": {"8": -0.1}}',
    '{"ratios": {"8": "0.5"}}',
    '{"ratios": {"8": true}}',
    '{"ratios": {"8": null}}',
    '{"ratios": {"8": NaN}}',
    '{"protect_blocks": 2.0}',
    '{"protect_blocks": 2e0}',
    '{"protect_blocks": true}',
    '{"protect_blocks": "2"}',
    '{"start_percent": 0.5, "end_percent": 0.2}',
    '{"start_percent": 1, "end_percent": 0.5}',
    '{"end_percent": 0.5, "start_percent": 0.5}',
    '{"cache_start_percent": 0.6, "cache_end_percent": 0.4}',
    '{"adaptive": Infinity}',
    '{"dit_ratio": -Infinity}',
    '{"time_calls": 1}',
    '{"device_aware": "yes"}',
    '{"telemetry_jsonl": "run.jsonl"}',
    '{"telemetry_jsonl": "../run.jsonl"}',
    '{"telemetry_jsonl": "a/b.jsonl"}',
    '{"telemetry_jsonl": 5}',
    '{"seed": 9223372036854775807}',
    '{"seed": 9223372036854775808}',
    '{"seed": -1}',
    '{"seed": 123456789012345678901234567890123456789012345}',
    '{"strategy": "' + "x" * 200 + '"}',
    '{"strategy": [1, 2, 3, 4, 5, [6, [7]]]}',
    '{"strategy": {"b": 1, "a": 2}}',
    '{"strategy": "it\'s"}',
    '{"ratios": {"8": 0.5}, "cache_interval": 3, "cache_depth": 11, "cache_threshold": 10}',
    "{" * 9 + "}" * 9,
    '{"pool": "' + "x" * 16_400 + '"}',
]


CASES_TABLE = WEB / "test" / "schedule_cases.json"  # shared with web/test/schedule_check.test.mjs


def test_shared_schedule_cases_hold_for_python() -> None:
    """The table the chart's JS test checks against says what a run says: Python's message for each refused text
    (the first bad `ratios` entry in the text's order), the levels it keeps for an accepted one."""
    from tokenfuse.nodes.scheduler_node import schedule_from_widgets

    table = json.loads(CASES_TABLE.read_text(encoding="utf-8"))
    w = table["widgets"]
    assert len(table["cases"]) >= 20
    for case in table["cases"]:
        assert _python_verdict(case["text"], w["preset"]) == case["error"], case["text"]
        if case["error"] is None:
            sched = schedule_from_widgets(w["preset"], w["strategy"], w["ratio"], w["family"], case["text"])
            assert {str(k): v for k, v in sched.ratios.items()} == case["ratios"], case["text"]


@needs_node
def test_js_schedule_text_verdicts_match_python() -> None:
    """The chart refuses exactly the schedule_text a run refuses, with the server's message (JSON text; YAML is
    left to the run and only noted)."""
    table = [c["text"] for c in json.loads(CASES_TABLE.read_text(encoding="utf-8"))["cases"]]
    texts = SCHEDULE_TEXTS + table
    js = _js_verdicts(texts)
    for text, got in zip(texts, js, strict=True):
        assert got == _python_verdict(text), text[:120]


@needs_node
def test_js_schedule_ranges_match_python() -> None:
    """Every range the chart checks, probed at and just beyond its bounds against Schedule: a range changed on one
    side only fails here. Every Schedule field is checked by the chart."""
    checks = _node_eval(
        "import { FIELD_CHECKS } from './lib/schedule_check.js';"
        "console.log(JSON.stringify(FIELD_CHECKS.map(([f, k, lo, hi]) => [f, k, String(lo), String(hi)])));"
    )
    assert isinstance(checks, list)
    checked = {name for name, *_ in checks} | {"strategy", "pool", "ratios"}
    assert checked == {f.name for f in dataclasses.fields(Schedule)}
    texts = []
    for name, kind, lo, hi in checks:
        if kind == "int":
            probes = [lo, hi, str(int(lo) - 1), str(int(hi) + 1), f"{lo}.0", "true"]
        elif kind == "float":
            probes = [lo, hi, repr(float(lo) - 1e-6), repr(float(hi) + 1e-6), f'"{lo}"', "NaN"]
        else:
            continue
        texts += [json.dumps({name: "@"}).replace('"@"', p) for p in probes]
    texts += [f'{{"ratios": {{"{lv}": {p}}}}}' for lv in (8, 16, 32, 64, 4, 128) for p in ("0", "0.9", "0.90001")]
    js = _js_verdicts(texts, preset="off")
    for text, got in zip(texts, js, strict=True):
        assert got == _python_verdict(text, preset="off"), text
