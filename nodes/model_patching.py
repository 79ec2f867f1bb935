"""Model patching service: attach, remove and re-apply TokenFuse scheduling on ModelPatcher clones.

Used by TokenSchedulerController (schedule_model), ScheduledFusion's fallback chain (strip_tokenfuse,
repatch_with_preset) and the benches. Per-run telemetry is reset in an OUTER_SAMPLE wrapper, which logs one INFO
summary line per sampling run (at DEBUG inside sampling_series(), which logs one INFO line for all its runs:
VideoFaceFusion's key-frame batches); a PREDICT_NOISE wrapper sends live stats when a server listens; a SAMPLER_SAMPLE
wrapper (nodes/sampler_steps.py) keeps the run's step index on the host, so the patches never read a device sigma.

The step cache (Schedule.cache_*, scheduling/step_cache.py) rides on the same clone: a DIFFUSION_MODEL wrapper and an
output_block_patch under the same key, its per-run state reset by the same OUTER_SAMPLE wrapper, its counters in the
same summary line. Under torch.compile (ComfyUI's TorchCompileModel) a DIFFUSION_MODEL wrapper of the attention
patches, outside the cache's, hands them their frozen per-call table (scheduling/patches.py build_unet_hooks).

"Scheduling off" (the artifact fallback) = a clone with TokenFuse's attn1 patches, wrappers and attention override
removed (another pack's override that ours wrapped is put back) and `transformer_options["tokenfuse_disabled"]` set,
which every TokenFuse patch honours.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..scheduling.keys import DISABLED_KEY, OVERRIDE_KEY, PLAN_KEY, PRESET_KEY, STEP_KEY, WRAPPER_KEY
from ..scheduling.schedule import Schedule
from .glue import env, patcher, paths, ui
from .peak_memory import peak_memory_kind, peak_memory_start
from .run_stats import STATS_EVENT, LiveStats
from .sampler_steps import make_sampler_step_wrapper

if TYPE_CHECKING:
    from ..scheduling.telemetry import RunSeries, RunStatus

log = logging.getLogger(__name__)

_MODEL_METHODS = ("clone", "set_model_attn1_patch", "set_model_attn1_output_patch", "add_wrapper_with_key")


def _transformer_option(model: Any, key: str) -> Any:
    opts = getattr(model, "model_options", None)
    return opts.get("transformer_options", {}).get(key) if isinstance(opts, dict) else None


def strip_tokenfuse(model: Any) -> Any:
    """A clone of `model` with TokenFuse scheduling off: our patches, override and wrappers removed and the flag set
    for any patch that survives (e.g. one wrapped by another pack). Other packs' patches stay; the input is untouched.
    """
    m = model.clone()
    remove_scheduling(m)
    patcher.set_transformer_option(m, DISABLED_KEY, True)
    return m


def repatch_with_preset(model: Any, preset: str) -> tuple[Any, str]:
    """(model re-scheduled with `preset`, note). Uses the scheduler API (schedule_model on a
    stripped clone); when it is unavailable the model is returned as is and the note says the step was skipped."""
    try:
        from ..scheduling.schedule import preset_schedule
    except ImportError as exc:
        return model, f"stronger preset {preset} skipped (scheduler API unavailable: {exc})"
    family = patcher.detect_family(model)
    if family.route == "none":
        return model, f"stronger preset {preset} skipped (model family not schedulable)"
    base = strip_tokenfuse(model)
    patcher.set_transformer_option(base, DISABLED_KEY, False)
    patched, _ = schedule_model(base, preset_schedule(preset, family.family), family)
    return patched, ""


def attempt_models(model: Any) -> Callable[[Any], tuple[Any, str]]:
    """model_for(attempt) -> (MODEL, note) for the fusion fallbacks (fusion.backend.FusionBackend.model_for): the
    input as is, a clone with TokenFuse scheduling off (artifact fallback) or re-patched with a stronger preset (OOM
    fallback). Each variant is built once per run and reused by every batch that needs it."""
    cache: dict[tuple[bool, str], tuple[Any, str]] = {}

    def model_for(attempt: Any) -> tuple[Any, str]:
        key = (attempt.scheduling, attempt.preset)
        if key not in cache:
            if not attempt.scheduling:
                cache[key] = (strip_tokenfuse(model), "")
            elif attempt.preset:
                cache[key] = repatch_with_preset(model, attempt.preset)
            else:
                cache[key] = (model, "")
        return cache[key]

    return model_for


def chain_attention_override(ours: Callable[..., Any], previous: Callable[..., Any] | None) -> Callable[..., Any]:
    """Stack our optimized_attention_override on one another node set before (theirs runs inside ours).

    ComfyUI calls `override(func, *args, **kwargs)`; we hand ours a `func` that routes through theirs.
    """
    if previous is None:
        return ours

    def chained(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def inner(*a: Any, **kw: Any) -> Any:
            return previous(func, *a, **kw)

        return ours(inner, *args, **kwargs)

    chained.tokenfuse_previous = previous  # type: ignore[attr-defined]  # lets a later scheduler unwrap ours
    return chained


def _is_ours(fn: Any) -> bool:
    mod = getattr(fn, "__module__", "") or ""
    return mod.endswith(
        (".scheduling.patches", ".scheduling.step_cache", ".scheduling.dit_override", ".nodes.model_patching")
    )


def remove_scheduling(m: Any) -> bool:
    """Remove TokenFuse's patches, attention override and wrappers from `m` (a clone: it is changed in place).

    Used when an already scheduled model is scheduled again, and by ScheduledFusion's "scheduling off" rerun.

    Other packs' patches stay where they are. Returns True when something was removed.
    """
    to = dict(m.model_options.get("transformer_options", {}))
    patches = {k: list(v) for k, v in to.get("patches", {}).items()}
    found = False
    for name in ("attn1_patch", "attn1_output_patch", "output_block_patch"):
        if name in patches:
            kept = [p for p in patches[name] if not _is_ours(p)]
            found |= len(kept) != len(patches[name])
            patches[name] = kept
    for key in (PLAN_KEY, PRESET_KEY):  # the earlier node's TOKEN_PLAN and preset go with its schedule
        found |= to.pop(key, None) is not None
    override = to.get(OVERRIDE_KEY)
    if override is not None and _is_ours(override):
        found = True
        previous = getattr(override, "tokenfuse_previous", None)
        if previous is None:
            to.pop(OVERRIDE_KEY)
        else:
            to[OVERRIDE_KEY] = previous
    if not found and not patcher.has_wrapper(m, "OUTER_SAMPLE", WRAPPER_KEY):
        return False
    if "patches" in to:
        to["patches"] = patches
    m.model_options = {**m.model_options, "transformer_options": to}
    for kind in ("OUTER_SAMPLE", "PREDICT_NOISE", "DIFFUSION_MODEL", "SAMPLER_SAMPLE"):
        patcher.remove_wrapper(m, kind, WRAPPER_KEY)
    return True


def _start_cache_run(cache: Any, schedule: Schedule, executor: Any) -> None:
    """Reset the step cache for a run; its sigma window from the sampled model's model_sampling (the guider's)."""
    window = None
    model = getattr(getattr(executor, "class_obj", None), "model_patcher", None)
    try:
        window = patcher.sigma_window(model, schedule.cache_start_percent, schedule.cache_end_percent)
    except (AttributeError, TypeError, ValueError) as exc:
        log.warning("TokenFuse step cache: no sigma window (%s); every step counts as inside it", exc)
    cache.state.reset(window)


@dataclass(frozen=True)
class _RunSetup:
    """What every run of one patched clone shares: its schedule, the device its peak memory is read on, and the
    label of its summary line ("<model> (<family>)")."""

    schedule: Schedule
    device: Any
    label: str


@dataclass(frozen=True)
class ScheduleExtras:
    """What TokenSchedulerController adds to a schedule: the TOKEN_PLAN input (or None), the node id its live stats
    name, and the preset in effect (what ScheduledFusion's OOM fallback strengthens; "" = none)."""

    plan: Any = None
    node_id: str | None = None
    preset: str = ""


def _make_run_wrapper(setup: _RunSetup, telemetry: Any, live: LiveStats, cache: Any = None) -> Callable[..., Any]:
    """OUTER_SAMPLE wrapper: reset per-run state, run sampling, log one summary line (also on error/cancel).

    A run that raised is "cancelled" (ComfyUI's interrupt) or "failed" in its summary line, its live stats' final
    summary and its telemetry file's summary record; its telemetry goes to `<name>.partial`, never over the complete
    file of an earlier run (scheduling/telemetry.py TelemetryFile)."""

    schedule, device, label = setup.schedule, setup.device, setup.label

    def tokenfuse_outer_sample(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        telemetry.reset()
        live.reset()
        if cache is not None:
            _start_cache_run(cache, schedule, executor)
        peak, live.peak_mib = peak_memory_start(device)
        live.peak_kind = peak_memory_kind(device)
        status: RunStatus = "failed"
        try:
            out = executor(*args, **kwargs)
            status = "complete"
            return out
        except BaseException as exc:
            status = _ended_by(exc)
            raise
        finally:
            # summary_line: tokens saved, calls reduced, wall time since reset (= this run), patch time
            series = _SERIES.get()
            line = f"{telemetry.summary_line(status)}, {peak()} [{label}{', preset off' if schedule.is_off else ''}]"
            counts = None
            if cache is not None:
                line += f", {cache.state.summary()}"
                counts = (cache.state.full_calls, cache.state.cached_calls, cache.state.refreshed)
                cache.state.reset()  # the cached features never outlive the run
            log.log(logging.INFO if series is None else logging.DEBUG, "%s", line)
            no_calls = telemetry.calls == 0 and not schedule.is_off and status == "complete"
            if no_calls and series is None:
                _warn_no_calls(label, "this run")
            if live.step and ui.stats_listener_present():
                if series is None:
                    ui.send_stats(STATS_EVENT, live.payload(telemetry, None, final=True, summary=line, status=status))
                else:  # a key-frame batch of a video: the chart keeps running; the series sends the final event
                    ui.send_stats(STATS_EVENT, live.payload(telemetry, None))
                    _SERIES_LIVE[id(series)] = (live, telemetry)
            if series is not None:
                jsonl = None
                if schedule.telemetry_jsonl:
                    try:
                        jsonl = paths.output_file(schedule.telemetry_jsonl)
                    except paths.OutputPathError as exc:  # reported once, when the series ends
                        series.unwritable.setdefault(Path(schedule.telemetry_jsonl), str(exc))
                series.add(telemetry, status, label, counts, jsonl)
                series.no_calls += int(no_calls)
            elif schedule.telemetry_jsonl:
                _write_telemetry(telemetry, schedule.telemetry_jsonl, status)

    return tokenfuse_outer_sample


def _ended_by(exc: BaseException) -> RunStatus:
    """How a run that raised `exc` ended: "cancelled" for ComfyUI's interrupt, "failed" otherwise."""
    return "cancelled" if env.is_interrupt(exc) else "failed"


def _warn_no_calls(label: str, where: str) -> None:
    log.warning(
        "TokenFuse: no attention call reached the scheduler in %s (%s); check that no other node replaces "
        "self-attention of this model",
        where,
        label,
    )


_SERIES: ContextVar[RunSeries | None] = ContextVar("tokenfuse_run_series", default=None)


def in_sampling_series() -> bool:
    """True inside sampling_series(): a node's per-call summary lines go to DEBUG there."""
    return _SERIES.get() is not None


# series id -> (live stats, telemetry) of its last run that had a listener: the series' final chart event is sent from
# it when the series ends (popped there, so nothing outlives the series)
_SERIES_LIVE: dict[int, tuple[Any, Any]] = {}


@contextmanager
def sampling_series(label: str, device: Any = None) -> Iterator[RunSeries]:
    """Make the sampling runs inside the block one run (VideoFaceFusion: one diffusion run per key-frame batch).

    Inside it each run's summary line is logged at DEBUG and the run is added to a RunSeries (scheduling/telemetry.py);
    when the block ends, one INFO line sums them (if any run was scheduled) and each telemetry file the runs named
    holds every run with one summary at the end, renamed into place only when the block completed (`<name>.partial`
    when it raised: "cancelled" for ComfyUI's interrupt, else "failed"). A context variable, set and reset here: no
    state outlives the block, also when it raises, and a run outside it (another prompt's KSampler) is not affected.
    """
    from ..scheduling.telemetry import RunSeries

    series = RunSeries()
    peak, _ = peak_memory_start(device)
    token = _SERIES.set(series)
    status: RunStatus = "failed"
    try:
        yield series
        status = "complete"
    except BaseException as exc:
        status = _ended_by(exc)
        raise
    finally:
        _SERIES.reset(token)
        _end_series(series, status, label, peak)


def _end_series(series: RunSeries, status: RunStatus, label: str, peak: Callable[[], str]) -> None:
    last = _SERIES_LIVE.pop(id(series), None)
    if not series.runs:
        series.discard()
        return
    labels = ", ".join(series.labels)
    line = f"{series.summary_line(status)}, {peak()} [{label}: {labels}]"
    log.info("%s", line)
    if last is not None and ui.stats_listener_present():  # the chart's one "done" for the whole video
        live, telemetry = last
        ui.send_stats(STATS_EVENT, live.payload(telemetry, None, final=True, summary=line, status=status))
    if series.no_calls:
        _warn_no_calls(labels, f"{series.no_calls} of {series.runs} sampling runs of {label}")
    for path, written, error in series.close(status):
        if written is None:
            log.warning("TokenFuse: telemetry not written to %s: %s", path, error)
        elif status == "complete":
            log.info("TokenFuse: telemetry of %d sampling runs written to %s", series.runs, written)
        else:
            log.info(
                "TokenFuse: %s %s's partial telemetry written to %s (%s is left as it was)",
                status,
                label,
                written,
                path.name,
            )


def _write_telemetry(telemetry: Any, name: str, status: RunStatus) -> None:
    """The run's telemetry file in the output folder (a run that did not complete: `<name>.partial`)."""
    try:
        path = telemetry.write_jsonl(paths.output_file(name), status)
    except (OSError, paths.OutputPathError) as exc:
        log.warning("TokenFuse: telemetry not written: %s", exc)
        return
    if status == "complete":
        log.info("TokenFuse: telemetry written to %s", path)
    else:
        log.info("TokenFuse: %s run's partial telemetry written to %s (%s is left as it was)", status, path, name)


def _make_step_wrapper(telemetry: Any, live: LiveStats) -> Callable[..., Any]:
    """PREDICT_NOISE wrapper (once per model evaluation): live stats to the frontend, only when a server listens."""

    def tokenfuse_step_stats(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not ui.stats_listener_present():
            return executor(*args, **kwargs)
        t0 = time.perf_counter()
        out = executor(*args, **kwargs)
        live.position(args, kwargs)
        ui.send_stats(STATS_EVENT, live.payload(telemetry, time.perf_counter() - t0))
        return out

    return tokenfuse_step_stats


def _check_model(model: Any) -> None:
    missing = [m for m in _MODEL_METHODS if not callable(getattr(model, m, None))]
    if missing or not isinstance(getattr(model, "model_options", None), dict):
        raise TypeError(
            f"TokenSchedulerController expects a ComfyUI MODEL (ModelPatcher); got {type(model).__name__} without "
            f"{missing or ['model_options']}. Connect the MODEL output of a checkpoint loader."
        )


def _attach_step_cache(m: Any, schedule: Schedule) -> Any:
    """Attach the step cache's hooks to the clone `m` (U-Net only); returns the hooks (their state is per run)."""
    from ..scheduling.step_cache import StepCacheKeys, build_step_cache

    hooks = build_step_cache(
        schedule.cache_interval,
        schedule.cache_depth,
        schedule.cache_threshold,
        patcher.timestep_embedding(),
        StepCacheKeys(PLAN_KEY, DISABLED_KEY, STEP_KEY),
    )
    # ours first: it keeps the deep feature as the U-Net made it; a cached step re-applies every output_block_patch
    # (e.g. FreeU's in-place scaling) on a copy of it, as the full step did. Appended after FreeU, it kept the
    # already-scaled feature and FreeU scaled it again on every cached step.
    patches = m.model_options.get("transformer_options", {}).get("patches", {})
    ours_first = [hooks.output_block_patch, *patches.get("output_block_patch", [])]
    patcher.set_transformer_option(m, "patches", {**patches, "output_block_patch": ours_first})
    patcher.add_wrapper(m, "DIFFUSION_MODEL", WRAPPER_KEY, hooks.diffusion_model_wrapper)
    return hooks


def schedule_model(
    model: Any, schedule: Schedule, family: patcher.ModelFamily, extras: ScheduleExtras = ScheduleExtras()
) -> tuple[Any, Any]:
    """Return (patched clone, its RunTelemetry); the input model is never touched.

    Bench scripts call this directly to time a model with a given Schedule.
    """
    from ..scheduling.dit_override import build_dit_hooks, build_plan_wrapper
    from ..scheduling.patches import build_unet_hooks
    from ..scheduling.telemetry import RunTelemetry

    # Aggregated per step and level; per-call records only when the telemetry file asks for them (issue 11).
    telemetry = RunTelemetry(per_call=bool(schedule.telemetry_jsonl))
    m = model.clone()
    if remove_scheduling(m):
        log.info("TokenFuse: the model was already scheduled; the new schedule replaces the earlier one")
    if schedule.is_off:
        pass  # identity: attach nothing to the attention path, so the output stays bit-identical at zero cost
    elif family.route == "unet":
        hooks = build_unet_hooks(schedule, telemetry)
        m.set_model_attn1_patch(hooks.attn1_patch)
        m.set_model_attn1_output_patch(hooks.attn1_output_patch)
        # before the step cache's wrapper (outer): its cached steps' shallow blocks read the same table
        patcher.add_wrapper(m, "DIFFUSION_MODEL", WRAPPER_KEY, hooks.diffusion_model_wrapper)
    elif family.route == "override":
        previous = m.model_options.get("transformer_options", {}).get(OVERRIDE_KEY)
        dit = build_dit_hooks(schedule, telemetry)
        patcher.set_transformer_option(m, OVERRIDE_KEY, chain_attention_override(dit.override, previous))
        patcher.add_wrapper(m, "DIFFUSION_MODEL", WRAPPER_KEY, dit.diffusion_model_wrapper)  # for torch.compile
        patch = patcher.text_first_patch_size(m)
        if patch is not None:  # a TOKEN_PLAN (here or ScheduledFusion's crop plan) mapped onto the joint sequence
            patcher.add_wrapper(m, "DIFFUSION_MODEL", WRAPPER_KEY, build_plan_wrapper(patch))
        # other DiTs: the override warns once when a plan reaches it unmapped (the report says so for this node's)
    cache = _attach_step_cache(m, schedule) if schedule.cache_on and family.route == "unet" else None
    if schedule.cache_on and cache is None:
        log.warning(
            "TokenFuse step cache: %s is not a U-Net (the cache reuses U-Net output-block features); cache_interval is "
            "ignored and every step runs in full",
            family.name,
        )
    if extras.plan is not None:
        patcher.set_transformer_option(m, PLAN_KEY, extras.plan)
    if extras.preset:
        patcher.set_transformer_option(m, PRESET_KEY, extras.preset)  # lets ScheduledFusion's OOM fallback go stronger
    label = f"{family.name} ({family.family})"
    live = LiveStats(extras.node_id)
    setup = _RunSetup(schedule, getattr(m, "load_device", None), label)
    run_wrapper = _make_run_wrapper(setup, telemetry, live, cache)
    patcher.add_outer_sample_wrapper(m, WRAPPER_KEY, run_wrapper)
    patcher.add_wrapper(m, "PREDICT_NOISE", WRAPPER_KEY, _make_step_wrapper(telemetry, live))
    if not schedule.is_off or cache is not None:  # the patches' step index without a device sync per model call
        patcher.add_wrapper(m, "SAMPLER_SAMPLE", WRAPPER_KEY, make_sampler_step_wrapper())
    return m, telemetry
