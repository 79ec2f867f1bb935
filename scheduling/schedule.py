"""Schedule: which tokens the attention patches reduce, where, and when. Pure Python (no torch import).

The node's INPUT_TYPES imports this module at ComfyUI start-up, so it must stay light: dataclasses, json, yaml only.

Ratios mean the same thing for every strategy: the fraction of a level's tokens taken out of attention.
- `tome`: fraction of block-input tokens merged away (q, k and v shrink; the output is unmerged). <= 0.5 recommended.
- `todo`: fraction of K/V tokens removed by spatial pooling; snapped down to a pooling kernel (0.5 -> 1x2, 0.75 -> 2x2,
  0.89 -> 3x3). <= 0.75 (2x2) recommended.
- `topk`: fraction of K/V tokens dropped (the least important ones).

The time axis is a second, independent strategy in the same Schedule: the step cache (`cache_*` fields; core in
step_cache.py) reuses a U-Net's deep features across steps and recomputes only the shallow high-resolution blocks.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from .vocabulary import LEVELS as LEVELS  # re-exported: the schedule speaks in these levels and presets
from .vocabulary import Preset as Preset
from .vocabulary import Strategy as Strategy

Family = Literal["sd15", "sdxl", "dit"]
PoolMode = Literal["avg", "nearest"]

MAX_RATIO = 0.9
# telemetry_jsonl is a bare file name; the glue writes it under ComfyUI's output folder (never a path from a prompt).
TELEMETRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}\.jsonl")
# schedule_text comes from a prompt: cap its size and nesting before parsing, and never echo it in full.
SCHEDULE_TEXT_MAX_CHARS = 16_384
SCHEDULE_TEXT_MAX_DEPTH = 8
ECHO_MAX_CHARS = 80
# Step cache: input blocks a cached step recomputes (1 = conv_in only); SD1.5/SDXL have 12/9 input blocks.
CACHE_MAX_DEPTH = 11
CACHE_MAX_INTERVAL = 10
CACHE_MAX_THRESHOLD = 10.0
# Which levels have self-attention in each U-Net family (SDXL has none at full latent resolution).
FAMILY_LEVELS: dict[str, tuple[int, ...]] = {"sd15": LEVELS, "sdxl": (16, 32), "dit": ()}


class ScheduleError(ValueError):
    """A schedule field is out of range; the message names the field and the allowed values."""


def echo(value: Any, limit: int = ECHO_MAX_CHARS) -> str:
    """A short repr of user input for an error message: prompts can carry megabytes or YAML alias bombs, so the repr
    is bounded in depth and length before it is built, then cut to `limit` characters."""
    bounded = reprlib.Repr()  # attributes, not keywords: Python 3.10/3.11 take none
    bounded.maxlevel, bounded.maxdict, bounded.maxlist, bounded.maxlong = 2, 4, 4, 40
    bounded.maxstring = bounded.maxother = limit
    short = bounded.repr(value)
    return short if len(short) <= limit else f"{short[: limit - 3]}..."


def _check_range(name: str, value: Any, lo: float, hi: float, integer: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    # an int is finite and compares exactly with a float bound: math.isfinite(int) would convert it and raise
    # OverflowError past ~1e308 (a 4 000-digit end_percent), so only floats are asked
    infinite = isinstance(value, float) and not math.isfinite(value)
    if isinstance(value, bool) or not ok_type or infinite or not lo <= value <= hi:
        raise ScheduleError(f"Schedule field '{name}' must be {kind} in [{lo}, {hi}], got {echo(value)}")


def _clean_ratios(ratios: Any) -> dict[int, float]:
    """Schedule.ratios checked ({level factor: ratio in [0, MAX_RATIO]}) with int keys and float values, by level."""
    if not isinstance(ratios, dict):
        raise ScheduleError(f"Schedule field 'ratios' must be a mapping {{level: ratio}}, got {echo(ratios)}")
    clean: dict[int, float] = {}
    for key, value in ratios.items():
        try:
            level = int(key)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float key
            level = -1
        if level not in LEVELS:
            raise ScheduleError(f"Schedule field 'ratios' keys must be level factors {LEVELS}, got {echo(key)}")
        _check_range(f"ratios[{level}]", value, 0.0, MAX_RATIO)
        clean[level] = float(value)
    return dict(sorted(clean.items()))


@dataclass(frozen=True)
class Schedule:
    """Frozen, validated token-scheduling settings (see module docstring for what a ratio means).

    strategy: tome | todo | topk.
    ratios: {level factor (8/16/32/64 relative to image): base ratio in [0, 0.9]}; missing levels are 0.
    protect_blocks: the first N transformer blocks of a sampling call (ComfyUI's transformer_index order, i.e. the
        shallow input blocks) keep all tokens. U-Nets only: ComfyUI's DiT models (Flux, Wan, ...) give the attention
        call no block index, so the DiT override reduces every self-attention call.
    ramp_start / ramp_step / ramp_every / ramp_cap: pyramid ramp. From transformer index `ramp_start` on, add
        `ramp_step` every `ramp_every` blocks to the base ratio, never above `ramp_cap` (0 step = no ramp).
    start_percent / end_percent: active window as a fraction of sampling steps (strongest early, off late).
    adaptive: content-adaptive strength in [0, 1]; flat token maps get up to (1 + adaptive) x ratio, busy ones down to
        (1 - adaptive) x ratio; 0 = off. A step adapts to the statistic the previous step measured at the same
        level (read a step late: no device sync; the first step keeps the ratio). Under torch.compile the ratio
        chosen on the first model call of a step window is held for it (scheduling/patches.py).
    pool: todo pooling mode (avg | nearest).
    sx, sy: tome destination stride (one destination token per sy x sx cell).
    dit_ratio: fraction of K/V dropped (top-K by saliency) in DiT attention via the attention override.
    seed: tome partition seed (own generator: never touches the sampler's RNG). The partition is re-drawn every
        step; under torch.compile it is drawn on the first model call of a step window and held for it.
    telemetry_jsonl: optional JSONL path for per-call telemetry ("" = off); time_calls: record patch wall time.
    device_aware: reduce a level only where a short calibration on the first sampling run measures a gain on this
        device at this shape (scheduling/calibrate.py); the run's summary line names the levels kept and dropped.
    cache_interval: step cache (U-Net only; DeepCache's idea). 0 or 1 = off; k >= 2 = inside the cache window one
        full U-Net step every k steps, the k - 1 steps between reuse the deep features of the last full step and
        recompute only the shallow blocks. The first and the last step are always full. 2-3 recommended.
    cache_depth: input blocks a cached step recomputes (with their matching output blocks): 1 = conv_in only
        (cheapest, roughest), 2 = conv_in + the first full-resolution block (default), up to 11.
    cache_start_percent / cache_end_percent: the cache window in ComfyUI's sampling percent (0 = pure noise,
        1 = clean; converted to sigmas once per run, like EasyCache's); steps outside it are full.
    cache_threshold: region-aware early refresh (0 = off, the fixed interval alone). A cached step becomes full when
        the relative L1 change of the model input since the last full step exceeds it, measured on the face tokens
        of the TOKEN_PLAN only (outside the noise mask the latent is reset every step). Costs one host sync per step.
    """

    strategy: Strategy = "todo"
    ratios: dict[int, float] = field(default_factory=dict)
    protect_blocks: int = 2
    ramp_start: int = 3
    ramp_step: float = 0.0
    ramp_every: int = 2
    ramp_cap: float = 0.5
    start_percent: float = 0.0
    end_percent: float = 1.0
    adaptive: float = 0.0
    pool: PoolMode = "avg"
    sx: int = 2
    sy: int = 2
    dit_ratio: float = 0.0
    seed: int = 0
    telemetry_jsonl: str = ""
    time_calls: bool = False
    device_aware: bool = False
    cache_interval: int = 0
    cache_depth: int = 2
    cache_start_percent: float = 0.0
    cache_end_percent: float = 1.0
    cache_threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.strategy not in get_args(Strategy):
            raise ScheduleError(
                f"Schedule field 'strategy' must be one of {get_args(Strategy)}, got {echo(self.strategy)}"
            )
        if self.pool not in get_args(PoolMode):
            raise ScheduleError(f"Schedule field 'pool' must be one of {get_args(PoolMode)}, got {echo(self.pool)}")
        object.__setattr__(self, "ratios", _clean_ratios(self.ratios))
        _check_range("protect_blocks", self.protect_blocks, 0, 64, integer=True)
        _check_range("ramp_start", self.ramp_start, 0, 64, integer=True)
        _check_range("ramp_step", self.ramp_step, 0.0, 0.5)
        _check_range("ramp_every", self.ramp_every, 1, 64, integer=True)
        _check_range("ramp_cap", self.ramp_cap, 0.0, MAX_RATIO)
        _check_range("start_percent", self.start_percent, 0.0, 1.0)
        _check_range("end_percent", self.end_percent, 0.0, 1.0)
        if self.end_percent < self.start_percent:
            raise ScheduleError(
                f"Schedule field 'end_percent' must be >= start_percent ({self.start_percent}), got {self.end_percent}"
            )
        _check_range("adaptive", self.adaptive, 0.0, 1.0)
        _check_range("sx", self.sx, 1, 8, integer=True)
        _check_range("sy", self.sy, 1, 8, integer=True)
        _check_range("dit_ratio", self.dit_ratio, 0.0, MAX_RATIO)
        _check_range("seed", self.seed, 0, 2**63 - 1, integer=True)
        if not isinstance(self.telemetry_jsonl, str) or (
            self.telemetry_jsonl
            and (".." in self.telemetry_jsonl or not TELEMETRY_NAME.fullmatch(self.telemetry_jsonl))
        ):
            raise ScheduleError(
                "Schedule field 'telemetry_jsonl' must be a bare file name ending in .jsonl (letters, digits, '_', '-',"
                f" '.'; at most 102 characters; no folders), written to ComfyUI's output/tokenfuse/ folder; got "
                f"{echo(self.telemetry_jsonl)}"
            )
        if not isinstance(self.time_calls, bool):
            raise ScheduleError(f"Schedule field 'time_calls' must be true or false, got {echo(self.time_calls)}")
        if not isinstance(self.device_aware, bool):
            raise ScheduleError(f"Schedule field 'device_aware' must be true or false, got {echo(self.device_aware)}")
        _check_range("cache_interval", self.cache_interval, 0, CACHE_MAX_INTERVAL, integer=True)
        _check_range("cache_depth", self.cache_depth, 1, CACHE_MAX_DEPTH, integer=True)
        _check_range("cache_start_percent", self.cache_start_percent, 0.0, 1.0)
        _check_range("cache_end_percent", self.cache_end_percent, 0.0, 1.0)
        if self.cache_end_percent < self.cache_start_percent:
            raise ScheduleError(
                "Schedule field 'cache_end_percent' must be >= cache_start_percent "
                f"({self.cache_start_percent}), got {self.cache_end_percent}"
            )
        _check_range("cache_threshold", self.cache_threshold, 0.0, CACHE_MAX_THRESHOLD)
        floats = ("ramp_step", "ramp_cap", "start_percent", "end_percent", "adaptive", "dit_ratio")
        for name in floats + ("cache_start_percent", "cache_end_percent", "cache_threshold"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def __hash__(self) -> int:  # ratios is a dict; hash its items so the frozen object stays hashable
        return hash(
            tuple(
                (f.name, tuple(self.ratios.items()) if f.name == "ratios" else getattr(self, f.name))
                for f in fields(self)
            )
        )

    @property
    def is_off(self) -> bool:
        """True when no call can ever be reduced (all ratios 0, or an empty window)."""
        empty_window = self.end_percent <= self.start_percent
        return empty_window or (not any(self.ratios.values()) and self.dit_ratio == 0.0)

    @property
    def cache_on(self) -> bool:
        """True when the step cache can skip deep blocks (interval >= 2 and a non-empty window). Independent of
        is_off, which is about attention tokens only."""
        return self.cache_interval >= 2 and self.cache_end_percent > self.cache_start_percent

    def active_at(self, progress: float) -> bool:
        """progress: fraction of sampling done, in [0, 1]."""
        return self.start_percent <= progress < self.end_percent or (progress >= 1.0 and self.end_percent >= 1.0)

    def ratio_for(self, level: int, transformer_index: int) -> float:
        """Base ratio at a level after block protection and the pyramid ramp (before content adaptation)."""
        base = self.ratios.get(level, 0.0)
        if base <= 0.0 or transformer_index < self.protect_blocks:
            return 0.0
        if self.ramp_step > 0.0 and transformer_index >= self.ramp_start:
            steps = (transformer_index - self.ramp_start) // self.ramp_every + 1
            base = max(base, min(self.ramp_cap, base + steps * self.ramp_step))
        return min(base, MAX_RATIO)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratios"] = {str(k): v for k, v in self.ratios.items()}
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Schedule | None = None) -> Schedule:
        """Build from a mapping; unknown keys are an error naming the allowed fields. Missing keys come from base."""
        if not isinstance(data, dict):
            raise ScheduleError(f"a schedule must be a mapping of fields, got {type(data).__name__}")
        check_known_fields(data)
        return replace(base or cls(), **data)


def check_known_fields(data: dict[str, Any], widgets: tuple[str, ...] = ()) -> None:
    """Raise ScheduleError naming the keys of `data` that are neither Schedule fields nor in `widgets` (the names a
    node's schedule_text also takes for its widgets, listed in the message when given)."""
    names = {f.name for f in fields(Schedule)}
    unknown = sorted(str(key) for key in set(data) - names - set(widgets))
    if unknown:
        shown = [echo(key, 40) for key in unknown[:5]] + ([f"... {len(unknown) - 5} more"] if len(unknown) > 5 else [])
        allowed = f"the widgets {sorted(widgets)} and the fields {sorted(names)}" if widgets else f"{sorted(names)}"
        raise ScheduleError(f"unknown Schedule field(s) [{', '.join(shown)}]; allowed: {allowed}")


def _balanced(family: str) -> Schedule:
    # Under SDPA only a cheap reduction at every attention level pays (DESIGN.md §2). 2x2 average K/V pooling
    # (ToDo) at the two finest attention levels is inside the validated range (<= 2x2) and costs one pool per call.
    # protect_blocks=0: K/V pooling keeps every query, so shallow blocks still output all tokens; protecting the first
    # two /8 blocks cost a third of the gain in the H200 U-Net bench (1.22x -> 1.13x at SD1.5 768 px).
    # device_aware: a level is pooled only where that measurably saves time on this device at this shape (issue 11:
    # on an H200 at batch 2 the host cost of the patches made SDXL 1024 slower).
    if family == "sdxl":
        return Schedule(strategy="todo", ratios={16: 0.75, 32: 0.5}, protect_blocks=0, device_aware=True)
    if family == "dit":  # protect_blocks 0: ComfyUI's DiT models give attention no block index (every call reduced)
        return Schedule(strategy="topk", dit_ratio=0.5, protect_blocks=0)
    return Schedule(strategy="todo", ratios={8: 0.75, 16: 0.75}, protect_blocks=0, device_aware=True)


# AGGRESSIVE presets: 3x3 K/V pooling (ratio 0.89) is beyond the validated 2x2. Deeper blocks ramp up (+0.05 every two
# transformer blocks from block 3, capped at 3x3); content adaptation (strength 0.05 / 0.1) lowers 0.8 / 0.89 at most to
# 0.76 / 0.80, i.e. never below the balanced 2x2, and raises flat content towards the cap.
_LOWVRAM: dict[str, dict[str, dict[int, float]]] = {
    "lowvram_8gb": {"sd15": {8: 0.8, 16: 0.8, 32: 0.5}, "sdxl": {16: 0.8, 32: 0.75}},
    "lowvram_6gb": {"sd15": {8: 0.89, 16: 0.84, 32: 0.5}, "sdxl": {16: 0.89, 32: 0.75}},
    "lowvram_4gb": {"sd15": {8: 0.89, 16: 0.89, 32: 0.75, 64: 0.5}, "sdxl": {16: 0.89, 32: 0.89}},
}
_LOWVRAM_DIT = {"lowvram_8gb": 0.6, "lowvram_6gb": 0.65, "lowvram_4gb": 0.75}


def preset_schedule(name: Preset | str, family: Family | str = "sd15") -> Schedule:
    """Named presets per model family.

    off: identity everywhere.
    balanced: validated settings: K/V 2x2 average pooling at the finest attention levels (SD1.5 /8 /16; SDXL /16, and
        1x2 at /32), every step and block; DiT: drop half of K/V by saliency.
    lowvram_8gb / lowvram_6gb / lowvram_4gb: AGGRESSIVE, beyond the literature-validated range: K/V pooling up to 3x3,
        a pyramid ramp in deeper blocks and content adaptation. They trade detail for memory and speed; check faces.
    """
    if name not in get_args(Preset):
        raise ScheduleError(f"unknown preset {echo(name)}; allowed: {get_args(Preset)}")
    if family not in get_args(Family):
        raise ScheduleError(f"unknown model family {echo(family)}; allowed: {get_args(Family)}")
    if name == "off":
        return Schedule(ratios={})
    if name == "balanced":
        return _balanced(family)
    if family == "dit":
        return Schedule(strategy="topk", dit_ratio=_LOWVRAM_DIT[name], protect_blocks=0)
    return Schedule(
        strategy="todo",
        ratios=_LOWVRAM[name][family],
        protect_blocks=0,
        ramp_start=3,
        ramp_step=0.05,
        ramp_every=2,
        ramp_cap=0.89,
        adaptive=0.05 if name == "lowvram_8gb" else 0.1,
    )


def _nesting_depth(text: str) -> int:
    """Upper bound of the bracket nesting of JSON/YAML flow text (quotes ignored: an over-estimate is safe)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def _yaml_depth(text: str) -> int:
    """The deepest nesting of YAML collections in text, from the scanner's tokens (the scanner is a loop, the
    parser recurses per level: block YAML "- - - ... x" thousands deep must never reach it, or the interpreter's
    recursion limit is hit and the half-built parser state is torn down with further RecursionErrors). Text the
    scanner refuses reports 0: the parser then says what is wrong."""
    import yaml

    opening = (
        yaml.BlockSequenceStartToken,
        yaml.BlockMappingStartToken,
        yaml.FlowSequenceStartToken,
        yaml.FlowMappingStartToken,
    )
    closing = (yaml.BlockEndToken, yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)
    depth = deepest = 0
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, opening):
                depth += 1
                deepest = max(deepest, depth)
            elif isinstance(token, closing):
                depth -= 1
    except yaml.YAMLError:
        return 0
    return deepest


def parse_schedule_mapping(text: str) -> dict[str, Any]:
    """The mapping a schedule text holds ({} for empty text or null): JSON first, else YAML (safe_load).

    Raises ScheduleError for text that is too long, nested too deep, not a mapping, or not valid JSON or YAML; a
    syntax error says what is wrong, where (line, column) and gives a one-line valid example. The parser's own
    exception is dropped (`from None`): a YAML list nested thousands deep would chain a ~200 KB RecursionError
    traceback into the server log for every such prompt.
    """
    if not isinstance(text, str):
        raise ScheduleError(f"schedule text must be a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        return {}
    if len(text) > SCHEDULE_TEXT_MAX_CHARS:
        raise ScheduleError(
            f"schedule text is {len(text)} characters; at most {SCHEDULE_TEXT_MAX_CHARS} are accepted (a schedule has "
            f"{len(fields(Schedule))} fields)"
        )
    if _nesting_depth(text) > SCHEDULE_TEXT_MAX_DEPTH:
        raise ScheduleError(
            f"schedule text is nested deeper than {SCHEDULE_TEXT_MAX_DEPTH} levels; a schedule is a flat mapping of "
            "fields (only 'ratios' holds a mapping)"
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as json_exc:  # JSONDecodeError, or an int past Python's 4 300-digit limit
        import yaml  # only when the text is not JSON

        try:
            if _yaml_depth(text) > SCHEDULE_TEXT_MAX_DEPTH:
                raise RecursionError("block YAML nested too deep")  # refused before the recursive parser runs
            data = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as yaml_exc:
            json_error = json_exc if isinstance(json_exc, json.JSONDecodeError) else None
            raise _syntax_error(text, json_error, yaml_exc) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ScheduleError(f"schedule text must be a mapping of fields, got {type(data).__name__}")
    return data


SCHEDULE_TEXT_EXAMPLE = '{"ratios": {"8": 0.5}, "end_percent": 0.6}'


def _one_line(text: str, limit: int) -> str:
    """A parser's problem text on one line, tabs shown as \\t, cut to `limit` characters."""
    flat = text.replace("\t", "\\t").replace("\r", " ").replace("\n", " ")
    return flat if len(flat) <= limit else f"{flat[: limit - 3]}..."


def _syntax_error(text: str, json_exc: json.JSONDecodeError | None, yaml_exc: BaseException) -> ScheduleError:
    """A short ScheduleError for text neither parser reads: what is wrong, line and column (1-based), an example.

    Text that starts like JSON gets the JSON parser's account ("Expecting ',' delimiter"), other text the YAML
    parser's problem without its context lines; an error at the very end is an unclosed bracket or quote.
    """
    if isinstance(yaml_exc, RecursionError):  # block YAML ("- - - ...") nested thousands deep; brackets were counted
        return ScheduleError(
            "schedule text is nested too deep to read; a schedule is a flat mapping of fields (only 'ratios' holds a "
            f"mapping). A valid example: {SCHEDULE_TEXT_EXAMPLE}"
        )
    where: tuple[int, int, int] | None = None
    if isinstance(yaml_exc, (ValueError, OverflowError)) and getattr(yaml_exc, "problem_mark", None) is None:
        what = "a number is too large (at most 4 300 digits)"  # int() past Python's digit limit, or an inf key
    elif json_exc is not None and text[:1] in "{[":
        what, where = json_exc.msg, (json_exc.lineno, json_exc.colno, json_exc.pos)
    else:  # yaml.MarkedYAMLError: its `problem` without the "while parsing ..." context and the quoted text
        mark = getattr(yaml_exc, "problem_mark", None)
        what = str(getattr(yaml_exc, "problem", None) or yaml_exc)
        if mark is not None:
            where = (mark.line + 1, mark.column + 1, mark.index)
    if where is not None and where[2] >= len(text):
        what = "the text ends early (a bracket or quote is not closed?)"
    at = f" at line {where[0]}, column {where[1]}" if where is not None else ""
    return ScheduleError(
        f"schedule text is not valid JSON or YAML: {_one_line(what, 120)}{at}. A valid example: {SCHEDULE_TEXT_EXAMPLE}"
    )


def parse_schedule_text(text: str, base: Schedule) -> Schedule:
    """Override fields of `base` from JSON or YAML text (empty text returns base itself)."""
    data = parse_schedule_mapping(text)
    return Schedule.from_dict(data, base=base) if data else base


def load_schedule(path: str | Path) -> Schedule:
    """Load a .json/.yaml/.yml file (JSON is tried first whatever the suffix); missing fields take defaults."""
    return Schedule.from_dict(parse_schedule_mapping(Path(path).read_text(encoding="utf-8")))


def save_schedule(schedule: Schedule, path: str | Path) -> Path:
    """Write JSON (or YAML when the suffix is .yaml/.yml); returns the path."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        path.write_text(yaml.safe_dump(schedule.to_dict(), sort_keys=False), encoding="utf-8")
    else:
        path.write_text(json.dumps(schedule.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path
