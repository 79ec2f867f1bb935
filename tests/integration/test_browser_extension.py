"""The web/ extension in a real ComfyUI page, in headless Chromium (integration; skipped without its tools).

Needs COMFYUI_PATH (a ComfyUI checkout; the shared `comfy_server` fixture runs it with this Python), Node.js, a
Chromium (CHROMIUM or `chromium` on PATH) and playwright-core (PLAYWRIGHT_CORE_DIR: a folder where `npm install
playwright-core` ran). Set TOKENFUSE_SCREENSHOT=<path.png> to keep the screenshot.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from comfy_http import run_node_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "integration" / "browser_check.mjs"
pytestmark = pytest.mark.integration


def _ours(line: str) -> bool:
    return "/extensions/" in line or "tokenfuse" in line.lower()


def test_scheduler_chart_in_real_frontend(
    browser_tools: tuple[str, dict[str, str]], comfy_server: SimpleNamespace, tmp_path: Path
) -> None:
    shot = Path(os.environ.get("TOKENFUSE_SCREENSHOT") or tmp_path / "web.png")
    res = json.loads(run_node_script(browser_tools, SCRIPT, comfy_server.url, str(shot), timeout=240))
    assert not res.get("fatal"), res["fatal"]
    assert {"tokenfuse.scheduler", "tokenfuse.planPreview"} <= set(res["extensions"]), res["extensions"]
    assert res["nodeCreated"]
    assert res["widgets"][-1] == "tokenfuse_chart", res["widgets"]
    assert res["changed"] == {"preset": True, "ratio": True}, "widget names changed: update web/tokenfuse_scheduler.js"
    assert res["reloaded"] is not None, "node lost when the saved workflow was loaded again"
    assert res["reloaded"]["widgets"] == res["widgets"], res["reloaded"]
    assert res["reloaded"]["values"][:3] == ["lowvram_8gb", "preset", 0.5], res["reloaded"]
    # The chart is display-only: not in the prompt, not in the saved workflow.
    assert "tokenfuse_chart" not in res["promptInputs"], res["promptInputs"]
    assert res["widgetsValues"] is not None and len(res["widgetsValues"]) == len(res["widgets"]) - 1
    if res["planNodeCreated"]:  # PatchTokenize registered: its preview is shown in the room made when it was created
        prev = res["planPreview"]
        assert prev["after"] == prev["before"] and prev["imgs"] >= 1, prev
    ours = [e for e in res["consoleErrors"] + res["pageErrors"] + res["failedRequests"] if _ours(e)]
    assert not ours, ours
    assert shot.is_file() and shot.stat().st_size > 10_000


STATE_SCRIPT = REPO / "tests" / "integration" / "editor_state_check.mjs"
REFUSED_TEXTS = [
    '{"protect_blocks": 99}',
    '{"start_percent": 0.5, "end_percent": 0.2}',
    '{"strategy": "bogus"}',
    '{"ratios": {"8": "0.5"}}',
    '{"ratio": 0.95}',
    '{"preset": "fast"}',
]


@pytest.fixture(scope="module")
def editor_state(browser_tools: tuple[str, dict[str, str]], comfy_server: SimpleNamespace) -> dict:
    texts = [*REFUSED_TEXTS, '{"end_percent": 0.6}', '{"ratio": 0.5}']
    out = run_node_script(browser_tools, STATE_SCRIPT, comfy_server.url, json.dumps({"schedule_texts": texts}))
    return json.loads(out)


@pytest.mark.parametrize("text", REFUSED_TEXTS)
def test_chart_refuses_schedule_text_the_server_refuses(editor_state: dict, text: str) -> None:
    """The chart names what a run would refuse, with the server's own message (it drew them as valid)."""
    from tokenfuse.nodes.scheduler_node import schedule_from_widgets
    from tokenfuse.scheduling.schedule import ScheduleError

    with pytest.raises(ScheduleError) as refused:
        schedule_from_widgets("balanced", "preset", 0.0, "sd15", text)
    assert str(refused.value) in editor_state["scheduleText"][text]


def test_chart_draws_schedule_text_the_server_accepts(editor_state: dict) -> None:
    drawn = editor_state["scheduleText"]['{"end_percent": 0.6}']
    assert "active in 0%–60% of the steps" in drawn and "Schedule field" not in drawn


def test_chart_draws_a_widget_name_in_schedule_text_as_the_widget(editor_state: dict) -> None:
    """{"ratio": 0.5} is the ratio widget at 0.5 (it was refused as an unknown Schedule field): balanced's 75 % bars
    become 50 %, as schedule_from_widgets builds it."""
    drawn = editor_state["scheduleText"]['{"ratio": 0.5}']
    bars = re.findall(r"(?<= )\d+(?= )", drawn.split("active in")[0])  # the numbers on the bars: % removed
    assert "50" in bars and "75" not in bars, drawn
    assert "unknown" not in drawn and "must be" not in drawn, drawn


def test_live_stats_belong_to_the_workflow_tab_that_queued_the_run(editor_state: dict) -> None:
    """Tab A's run reports while tab B is open: B's node with the same id shows nothing of it (it showed A's
    numbers), A shows them when the user comes back and after undo (they were lost with the node objects)."""
    res = editor_state["tabsStats"]
    assert res.get("sameId"), res
    assert res["tabB"] == [], res
    assert res["tabA"] and res["tabA"][0].startswith("step 7/20"), res
    assert res["tabAAfterUndo"] == res["tabA"], res


def test_node_reports_belong_to_the_workflow_tab_that_queued_the_run(editor_state: dict) -> None:
    """Tab A's ScheduledFusion report arrives while tab B is open: B keeps its own report (it was replaced by A's)."""
    res = editor_state["tabsReport"]
    assert res.get("sameId"), res
    assert res["tabBBefore"] == ["ScheduledFusion: tab B's run"], res
    assert res["tabBDuringA"] == res["tabBBefore"], res
    assert res["tabA"] == ["ScheduledFusion: tab A's run"], res


def test_chart_says_when_widgets_come_from_links(editor_state: dict) -> None:
    """schedule_text and ratio linked from other nodes: the chart said nothing and drew the stale widget values (and
    flagged the stale text as an error)."""
    drawn = editor_state["linkedInputs"]["drawn"]
    assert "from a link, not drawn: ratio, schedule_text" in drawn, drawn
    assert "protect_blocks" not in drawn, drawn


def test_report_inside_a_subgraph_survives_undo(editor_state: dict) -> None:
    """A node inside a subgraph reads its own outputs back after undo (it lost its report: it read the root-graph
    key)."""
    res = editor_state["subgraphReport"]
    assert res["before"] == ["ScheduledFusion: inside the subgraph"], res
    assert res["afterUndo"] == res["before"], res
    assert res["rootAfterUndo"] == ["ScheduledFusion: in the root graph"], res


def test_plan_preview_never_grows_the_node(editor_state: dict) -> None:
    """PatchTokenize is created with the room for its preview: its runs never grow it (it grew about 240 px when the
    first preview arrived, over the node below in a graph built by hand)."""
    res = editor_state["planPreviewRuns"]
    created, *runs = res["sizes"]
    assert created[1] >= 400 and res["imgs"] >= 1, res
    assert all(size == created for size in runs), res


def test_live_chart_shows_the_cpu_peak_and_its_whole_legend(editor_state: dict) -> None:
    """On CPU the live line names the process peak RSS (it said "peak —" for the whole run), and the legend fits
    one line at the node's default width (it was cut off)."""
    res = editor_state["cpuStatsDefaultWidth"]
    drawn = res["drawn"]
    assert any(t.startswith("step 3/20") and t.endswith("peak RSS 950 MiB") for t in drawn), drawn
    assert "= U-Net level, latent = image / N (/8 finest)" in drawn, (res["width"], drawn)
    assert not any(t.endswith("…") for t in drawn), drawn


def test_chart_family_follows_a_checkpoint_changed_after_the_run(editor_state: dict) -> None:
    """After an SDXL run the user loads an SD1.5 checkpoint: the chart stops drawing SDXL "from the last run" (it
    kept the run's family until the next run)."""
    res = editor_state["familyAfterCheckpointChange"]
    assert "SDXL (from the checkpoint name)" in res["beforeRun"], res
    assert "SDXL (from the last run)" in res["afterRun"], res
    assert "SD1.5" in res["afterChange"] and "from the last run" not in res["afterChange"], res


def test_editor_scenarios_log_no_errors_from_the_pack(editor_state: dict) -> None:
    ours = [e for e in editor_state["errors"] if _ours(e)]
    assert not ours, ours


def test_dit_chart_is_one_bar_of_dropped_kv(editor_state: dict) -> None:
    """After a DiT run (stats at level 0) the chart says DiT, draws its one bar and says it has no U-Net levels (it
    drew an SD1.5 pyramid of zeros "from the last run" and a "/0" live row)."""
    drawn = editor_state["ditChart"]["drawn"]
    assert any(
        t.startswith("% of K/V tokens dropped per attention call") and "DiT (from the last run)" in t for t in drawn
    )
    assert any("no U-Net levels" in t for t in drawn), drawn
    assert "DiT  4.1k → 2.0k K/V tokens, −50 % removed" in drawn, drawn
    assert not any("SD1.5" in t or "/0" in t for t in drawn), drawn


def test_summary_survives_a_run_without_the_controller(editor_state: dict) -> None:
    """The same tab runs again with the controller bypassed: the last summary stays, marked as the previous run."""
    drawn = editor_state["runWithoutController"]["drawn"]
    assert "TokenFuse: the run with the node" in drawn, drawn
    assert any(t.startswith("previous run: done 20 steps") for t in drawn), drawn


def test_workflow_store_tells_closed_tabs(editor_state: dict) -> None:
    """The frontend API the chart uses to forget a closed tab's numbers (web/lib/prompts.js isOpenWorkflowOf)."""
    res = editor_state["closedTab"]
    assert res == {"isOpenFn": "function", "openBefore": True, "openAfter": False, "activeOpen": True}, res


def test_template_browser_shows_titles_in_budget_order(
    browser_tools: tuple[str, dict[str, str]], comfy_server: SimpleNamespace
) -> None:
    """ComfyUI's template browser, the pack's category chosen: readable titles and descriptions (it showed the raw,
    cut-off file names), 4 -> 6 -> 8 GB, the video workflow last (web/lib/templates.js)."""
    script = REPO / "tests" / "integration" / "templates_check.mjs"
    res = json.loads(run_node_script(browser_tools, script, comfy_server.url, timeout=300))
    titles = [
        "4 GB · Face refine (SD1.5)",
        "6 GB · Face swap (SD1.5)",
        "6 GB · Group photo (SD1.5)",
        "8 GB · Face refine (SDXL)",
        "6 GB · Video face refine (SD1.5)",
    ]
    shown = [c for c in res["cards"] if c in titles]
    assert shown == titles, res["cards"]
    assert "Sharpens the main face of a photo" in res["text"], res["text"]
    assert "tokenfuse_" not in res["text"] and "tokenfuse " not in res["text"], res["text"]
    assert not [e for e in res["errors"] if _ours(e)], res["errors"]
