"""The demo's contact sheet: input | token plan | output of each photo, with the per-face report and the model that
ran, written beside the photo's output (`<output>/<item name>/tokenfuse_demo_sheet.jpg`).

A newcomer who sees only the output PNG of the small test model (a blurred face) cannot tell a bug from that model's
limits; the sheet puts the three stages side by side and says which model ran ("test model: blurry by design" when it
was the test model, the checkpoint's name otherwise).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("tokenfuse.runner")

SHEET_NAME = "tokenfuse_demo_sheet.jpg"  # .jpg: the item folder's PNGs stay the graph's own outputs
TEST_MODEL_NOTE = "test model: blurry by design"
PANEL_HEIGHT = 384
_FONT_SCALE, _LINE_PX, _MARGIN = 0.5, 20, 10


def sheet_lines(row: dict[str, Any], model: str, test_model: bool) -> list[str]:
    """The text under the pictures: the model that ran, the test-model note, the run's numbers and the nodes'
    per-face reports (row: the item's report.jsonl row)."""
    lines = [f"model: {model}"]
    if test_model:
        lines.append(f"{TEST_MODEL_NOTE}: it shows the chain runs; run --demo --checkpoint NAME for a real checkpoint")
    peak = row.get("peak_memory_mib")
    lines.append(
        f"faces {row.get('faces', 0)}, with fallbacks {row.get('faces_with_fallbacks', 0)}, passed through "
        f"{row.get('faces_passed_through', 0)}; {row.get('time_s', 0):.1f} s"
        + ("" if peak is None else f", peak memory {peak:.0f} MiB")
    )
    for text in (row.get("reports") or {}).values():
        lines += [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines


def _panel(path: Path | None, title: str) -> np.ndarray:
    """[PANEL_HEIGHT + title, W, 3] uint8 BGR: the picture scaled to the panel height under its title (grey when
    missing)."""
    import cv2

    img = None if path is None else cv2.imdecode(np.fromfile(str(path), np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        img = np.full((PANEL_HEIGHT, PANEL_HEIGHT, 3), 96, np.uint8)
        title += " (missing)"
    width = max(1, round(img.shape[1] * PANEL_HEIGHT / img.shape[0]))
    img = cv2.resize(img, (width, PANEL_HEIGHT), interpolation=cv2.INTER_AREA)
    head = np.full((28, width, 3), 255, np.uint8)
    cv2.putText(head, title, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
    return np.vstack([head, img])


def _wrap(lines: list[str], width_px: int) -> list[str]:
    """Lines cut to what fits width_px at the sheet's font (about 8.5 px a character)."""
    chars = max(20, (width_px - 2 * _MARGIN) * 10 // 85)
    out: list[str] = []
    for line in lines:
        while len(line) > chars:
            cut = line.rfind(" ", 0, chars)
            cut = cut if cut > chars // 2 else chars
            out.append(line[:cut])
            line = "  " + line[cut:].lstrip()
        out.append(line)
    return out


def draw_sheet(photo: Path, plan: Path | None, output: Path | None, lines: list[str]) -> np.ndarray:
    """[H, W, 3] uint8 BGR: input | token plan | output in a row, the text lines under them."""
    import cv2

    panels = [_panel(photo, "input"), _panel(plan, "token plan"), _panel(output, "output")]
    gap = np.full((panels[0].shape[0], 8, 3), 255, np.uint8)
    row = np.hstack([panels[0], gap, panels[1], gap, panels[2]])
    text = _wrap(lines, row.shape[1])
    box = np.full((len(text) * _LINE_PX + 2 * _MARGIN, row.shape[1], 3), 255, np.uint8)
    for i, line in enumerate(text):
        colour = (0, 0, 200) if line.startswith(TEST_MODEL_NOTE) else (0, 0, 0)
        y = _MARGIN + (i + 1) * _LINE_PX - 6
        cv2.putText(box, line, (_MARGIN, y), cv2.FONT_HERSHEY_SIMPLEX, _FONT_SCALE, colour, 1, cv2.LINE_AA)
    return np.vstack([row, box])


def _pick(outputs: list[str], plan_prefix: str) -> tuple[Path | None, Path | None]:
    """(token plan picture, fused output picture) among an item's output files."""
    pngs = [Path(p) for p in outputs if Path(p).suffix.lower() == ".png"]
    plan = next((p for p in pngs if p.name.startswith(plan_prefix)), None)
    fused = next((p for p in pngs if p.name.startswith("tokenfuse_demo") and p != plan), None)
    return plan, fused


def write_sheets(report: Path, keys: set[str], model: str, test_model: bool, plan_prefix: str) -> list[Path]:
    """A sheet beside the outputs of every ok row of `report` whose item is in `keys` (this run's items); its
    path is logged. A sheet that cannot be written is logged and skipped: the run's own outputs are unaffected."""
    import cv2

    rows: dict[str, dict[str, Any]] = {}
    for line in report.read_text(encoding="utf-8").splitlines() if report.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("item") in keys:
            rows[row["item"]] = row  # the last row of an item is its latest attempt
    written = []
    for row in rows.values():
        if row.get("status") != "ok" or not row.get("outputs"):
            continue
        plan, fused = _pick(row["outputs"], plan_prefix)
        sheet = Path(fused or row["outputs"][0]).parent / SHEET_NAME
        try:
            ok, data = cv2.imencode(
                ".jpg", draw_sheet(Path(row["item"]), plan, fused, sheet_lines(row, model, test_model))
            )
            if not ok:
                raise OSError("JPEG encoding failed")
            sheet.write_bytes(data.tobytes())  # not cv2.imwrite: ANSI paths on Windows
        except (OSError, cv2.error) as exc:
            log.warning("contact sheet for %s not written: %s", row.get("name"), exc)
            continue
        log.info("contact sheet (input | token plan | output, report, model): %s", sheet)
        written.append(sheet)
    return written
