"""TokenSchedulerController's widgets -> Schedule: the node, the small face model's plain-torch runs and the benches
build a schedule from the same widget values through this one function (pure: no ComfyUI)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, cast, get_args

from .schedule import (
    MAX_RATIO,
    Preset,
    Schedule,
    ScheduleError,
    Strategy,
    check_known_fields,
    echo,
    parse_schedule_mapping,
    preset_schedule,
)

# The widgets a schedule_text may also set by name ({"ratio": 0.5} is the ratio widget at 0.5); "strategy" is also a
# Schedule field: its widget-only value "preset" (keep the preset's strategy) is read as the widget.
WIDGET_KEYS = ("preset", "strategy", "ratio")


def schedule_from_widgets(preset: str, strategy: str, ratio: float, family: str, schedule_text: str = "") -> Schedule:
    """Widgets → Schedule: the preset for the family, then the strategy/ratio widgets, then the text override.

    ratio 0 keeps the preset's per-level ratios; ratio > 0 replaces them at every level the preset reduces (DiT: the
    K/V drop fraction). Preset "off" stays identity whatever the widgets say (only the text can switch levels on).
    The text takes the widgets' names (WIDGET_KEYS) as well as every Schedule field: a widget named there replaces
    the widget's value before the schedule is built, then the fields are applied on top.
    """
    data = parse_schedule_mapping(schedule_text or "")
    preset, strategy, ratio, fields = widgets_from_text(data, preset, strategy, ratio)
    schedule = preset_schedule(preset, family)
    if strategy != "preset" and family != "dit":
        schedule = replace(schedule, strategy=cast(Strategy, strategy))
    if ratio > 0.0 and preset != "off":
        if family == "dit":
            schedule = replace(schedule, dit_ratio=float(ratio))
        else:
            schedule = replace(schedule, ratios={lv: float(ratio) for lv in schedule.ratios})
    if not fields:
        return schedule
    check_known_fields(fields, WIDGET_KEYS)
    return Schedule.from_dict(fields, base=schedule)


def widgets_from_text(
    data: dict[str, Any], preset: str, strategy: str, ratio: float
) -> tuple[str, str, float, dict[str, Any]]:
    """Split a schedule_text mapping into the widget values it sets (checked as the widgets are) and the Schedule
    fields left; returns (preset, strategy, ratio, fields). Checked in the order preset, ratio (web/lib mirrors it)."""
    fields = dict(data)
    if "preset" in fields:
        value = fields.pop("preset")
        if not isinstance(value, str) or value not in get_args(Preset):
            raise ScheduleError(f"schedule_text 'preset' must be one of {get_args(Preset)}, got {echo(value)}")
        preset = value
    if "ratio" in fields:
        value = fields.pop("ratio")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= MAX_RATIO:
            raise ScheduleError(f"schedule_text 'ratio' must be a number in [0.0, {MAX_RATIO}], got {echo(value)}")
        ratio = float(value)
    if fields.get("strategy") == "preset":
        strategy = fields.pop("strategy")
    return preset, strategy, ratio, fields
