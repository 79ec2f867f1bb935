"""Schedule: validation messages, ratio ramp and window, presets, JSON/YAML round-trips, torch-free import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import get_args

import pytest
from tokenfuse.scheduling.schedule import (
    FAMILY_LEVELS,
    Preset,
    Schedule,
    ScheduleError,
    Strategy,
    load_schedule,
    parse_schedule_text,
    preset_schedule,
    save_schedule,
)

REPO = Path(__file__).resolve().parents[1]


def test_schedule_module_imports_without_torch() -> None:
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'numpy', 'cv2'): raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib, importlib.util\n"
        # the scheduling package alone (schedule.py imports its torch-free vocabulary relatively), not the pack root
        f"spec = importlib.util.spec_from_file_location('sched', {str(REPO / 'scheduling' / '__init__.py')!r},"
        f" submodule_search_locations=[{str(REPO / 'scheduling')!r}])\n"
        "pkg = importlib.util.module_from_spec(spec); sys.modules['sched'] = pkg; spec.loader.exec_module(pkg)\n"
        "m = importlib.import_module('sched.schedule')\n"
        "s = m.parse_schedule_text('strategy: tome', m.preset_schedule('balanced'))\n"
        "assert s.strategy == 'tome' and 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_vocabularies_are_literals() -> None:
    assert get_args(Strategy) == ("tome", "todo", "topk")
    assert get_args(Preset) == ("off", "balanced", "lowvram_4gb", "lowvram_6gb", "lowvram_8gb")


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"ratios": {8: 1.5}}, "ratios[8]"),
        ({"ratios": {12: 0.5}}, "ratios"),
        ({"ratios": {8: "a lot"}}, "ratios[8]"),
        ({"strategy": "magic"}, "strategy"),
        ({"protect_blocks": -1}, "protect_blocks"),
        ({"start_percent": 0.8, "end_percent": 0.2}, "end_percent"),
        ({"sx": 0}, "sx"),
        ({"adaptive": 2.0}, "adaptive"),
        ({"ramp_step": float("nan")}, "ramp_step"),
    ],
)
def test_validation_names_field_and_range(kwargs: dict, field: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(f"'{field}'")):
        Schedule(**kwargs)


def test_frozen_and_hashable() -> None:
    s = preset_schedule("balanced")
    with pytest.raises(FrozenInstanceError):
        s.strategy = "tome"  # type: ignore[misc]
    assert hash(s) == hash(preset_schedule("balanced"))


def test_protect_blocks_and_pyramid_ramp() -> None:
    s = Schedule(
        strategy="tome",
        ratios={8: 0.1, 16: 0.3},
        protect_blocks=2,
        ramp_start=3,
        ramp_step=0.05,
        ramp_every=2,
        ramp_cap=0.2,
    )
    got = [round(s.ratio_for(8, i), 4) for i in range(9)]
    assert got == [0.0, 0.0, 0.1, 0.15, 0.15, 0.2, 0.2, 0.2, 0.2]
    assert s.ratio_for(16, 8) == 0.3  # the ramp never lowers a level above the cap
    assert s.ratio_for(32, 8) == 0.0  # no ratio for this level


def test_sigma_window() -> None:
    s = Schedule(ratios={8: 0.5}, start_percent=0.0, end_percent=0.6)
    assert s.active_at(0.0) and s.active_at(0.59)
    assert not s.active_at(0.6) and not s.active_at(0.95)
    assert Schedule(ratios={8: 0.5}).active_at(1.0)


@pytest.mark.parametrize("family", ["sd15", "sdxl", "dit"])
def test_presets_are_valid_and_act_where_the_family_has_attention(family: str) -> None:
    off = preset_schedule("off", family)
    assert off.is_off
    for name in get_args(Preset)[1:]:
        s = preset_schedule(name, family)
        assert not s.is_off
        assert set(s.ratios) <= set(FAMILY_LEVELS[family])
    if family == "sdxl":
        assert 16 in preset_schedule("balanced", family).ratios  # SDXL's attention starts at /16


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_balanced_stays_in_validated_range(family: str) -> None:
    s = preset_schedule("balanced", family)
    limit = {"todo": 0.75, "tome": 0.5, "topk": 0.5}[s.strategy]  # 2x2 K/V pooling, merge ratio 0.5
    assert all(r <= limit for r in s.ratios.values())
    assert s.ramp_step == 0.0 or s.ramp_cap <= limit


def test_unknown_preset_and_family_name_the_choices() -> None:
    with pytest.raises(ScheduleError, match="balanced"):
        preset_schedule("fast")
    with pytest.raises(ScheduleError, match="sdxl"):
        preset_schedule("balanced", "sd3")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_file_round_trip(tmp_path: Path, suffix: str) -> None:
    s = Schedule(
        strategy="tome",
        ratios={8: 0.4, 16: 0.2},
        ramp_step=0.05,
        end_percent=0.7,
        seed=42,
        telemetry_jsonl="run-1.t.jsonl",
    )
    path = save_schedule(s, tmp_path / f"sched{suffix}")
    assert load_schedule(path) == s
    assert Schedule.from_dict(s.to_dict()) == s
    json.dumps(s.to_dict())  # plain JSON types only


def test_bad_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("strategy: todo\nratios:\n  8: 2.0\n", encoding="utf-8")
    with pytest.raises(ScheduleError, match=r"ratios\[8\].*\[0.0, 0.9\]"):
        load_schedule(path)
    path.write_text('{"colour": "blue"}', encoding="utf-8")
    with pytest.raises(ScheduleError, match="colour.*allowed"):
        load_schedule(path)
    path.write_text("- a list\n", encoding="utf-8")
    with pytest.raises(ScheduleError, match="mapping"):
        load_schedule(path)


def test_parse_text_overrides_base() -> None:
    base = preset_schedule("balanced")
    assert parse_schedule_text("", base) is base
    s = parse_schedule_text('{"end_percent": 0.5}', base)
    assert s.end_percent == 0.5 and s.ratios == base.ratios
    y = parse_schedule_text("strategy: tome\nratios: {8: 0.3}\n", base)
    assert y.strategy == "tome" and y.ratios == {8: 0.3}
    with pytest.raises(ScheduleError):
        parse_schedule_text("ratios: [1, 2", base)


@pytest.mark.parametrize(
    "text",
    [
        "ratios: {.inf: 0.5}",  # int(inf): OverflowError
        '{"ratios": {"8": 0.5}, "seed": ' + "9" * 5000 + "}",  # past Python's int digit limit, as JSON
        "seed: " + "9" * 5000,  # the same as YAML
        "ratios: {.nan: 0.5}",
    ],
    ids=["inf key", "json huge int", "yaml huge int", "nan key"],
)
def test_hostile_numbers_in_schedule_text_end_in_a_schedule_error(text: str) -> None:
    """A shared workflow's schedule_text must fail with the pack's own error (SECURITY.md), not a raw Python one."""
    with pytest.raises(ScheduleError) as info:
        parse_schedule_text(text, preset_schedule("balanced"))
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_lowvram_presets_never_reduce_less_than_balanced(family: str) -> None:
    from tokenfuse.scheduling.adaptive import adapt_ratio
    from tokenfuse.scheduling.downsample import kernel_for_ratio

    balanced = preset_schedule("balanced", family)
    for name in ("lowvram_8gb", "lowvram_6gb", "lowvram_4gb"):
        s = preset_schedule(name, family)
        for level, base in balanced.ratios.items():
            for block in range(16):
                busy = adapt_ratio(s.ratio_for(level, block), 1.0, s.adaptive, 0.9)  # worst case: busy content
                ky, kx = kernel_for_ratio(busy)
                bk = kernel_for_ratio(base)
                assert ky * kx >= bk[0] * bk[1], (name, level, block)


def test_too_long_schedule_text_says_why_in_a_whole_sentence() -> None:
    from tokenfuse.scheduling.schedule import SCHEDULE_TEXT_MAX_CHARS, parse_schedule_text

    with pytest.raises(ScheduleError, match=r"at most 16384 are accepted \(a schedule has 23 fields\)$"):
        parse_schedule_text(" " + "x" * SCHEDULE_TEXT_MAX_CHARS + "y", Schedule())


@pytest.mark.parametrize("text", ['{"end_percent": ' + "9" * 4000 + "}", "end_percent: " + "9" * 4000])
def test_a_4000_digit_number_is_a_schedule_error(text: str) -> None:
    """math.isfinite() of a 4 000-digit int raised a raw OverflowError ("int too large to convert to float")."""
    with pytest.raises(ScheduleError, match=r"^Schedule field 'end_percent' must be a number in \[0.0, 1.0\], got 9+"):
        parse_schedule_text(text, preset_schedule("balanced"))
    with pytest.raises(ScheduleError, match=r"'ratios\[8\]' must be a number"):
        parse_schedule_text('{"ratios": {"8": -' + "9" * 4000 + "}}", Schedule())


def test_yaml_nested_8000_deep_is_one_short_error_without_a_chained_traceback() -> None:
    """Block YAML ("- - - ... x") is not caught by the bracket count: the parser's RecursionError used to be chained
    to the ScheduleError, writing a ~196 KB traceback into the server log for every such prompt."""
    import traceback

    with pytest.raises(ScheduleError, match=r"nested too deep to read; .* A valid example: \{") as info:
        parse_schedule_text("- " * 8000 + "x", Schedule())
    assert len(str(info.value)) < 300
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert len("".join(traceback.format_exception(info.value))) < 4000


@pytest.mark.parametrize(
    ("text", "what", "line", "column"),
    [
        ('{"ratios": {"8": 0.5},\n "end_percent" 0.6}', "Expecting ':' delimiter", 2, 16),
        ('{"a": [1,', "the text ends early (a bracket or quote is not closed?)", 1, 10),
        ("end_percent: 0.6\nratios: [1, 2\nseed: 3", "expected ',' or ']', but got ':'", 3, 5),
        ("seed: 1\n\tpool: avg", "found character '\\t' that cannot start any token", 2, 1),
        ("a: !!python/object/apply:os.system ['true']", "could not determine a constructor for the tag", 1, 4),
    ],
    ids=["json", "json unclosed", "yaml", "yaml tab", "yaml python tag"],
)
def test_bad_schedule_text_says_what_where_and_gives_an_example(text: str, what: str, line: int, column: int) -> None:
    """Before: the parser's raw text ("while parsing a flow node expected the node content, but found
    '<stream end>' in "<unicode string>" ..."), with its context lines and no example."""
    with pytest.raises(ScheduleError) as info:
        parse_schedule_text(text, Schedule())
    msg = str(info.value)
    assert msg.startswith(f"schedule text is not valid JSON or YAML: {what}")
    assert f" at line {line}, column {column}. " in msg
    assert msg.endswith('A valid example: {"ratios": {"8": 0.5}, "end_percent": 0.6}')
    assert "\n" not in msg and "<unicode string>" not in msg and "while parsing" not in msg
    assert info.value.__cause__ is None and len(msg) < 300
    example = msg.split("A valid example: ")[1]
    assert parse_schedule_text(example, Schedule()).end_percent == 0.6  # the example is valid
