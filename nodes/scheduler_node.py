"""TokenSchedulerController: attach TokenFuse's attention token scheduling to a MODEL clone.

U-Net family (SD1.x/2.x, SDXL): attn1_patch + attn1_output_patch closures. DiT families that call ComfyUI's
`optimized_attention_override` (Flux, Wan, Qwen-Image, HunyuanVideo, LTXV): K/V strategies there. Anything else:
the model passes through unchanged with one warning. Per-run telemetry is reset in an OUTER_SAMPLE wrapper, which
logs one INFO summary line per sampling run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, get_args

from ..scheduling.schedule import Preset, Schedule, parse_schedule_text, preset_schedule
from . import comfy_glue

log = logging.getLogger(__name__)

StrategyChoice = Literal["preset", "tome", "todo", "topk"]  # "preset" + scheduling.schedule.Strategy (tested)
WRAPPER_KEY = "tokenfuse"
PRESET_KEY = "tokenfuse_preset"  # transformer_options: the preset in force (read by ScheduledFusion's fallback)
STATS_EVENT = "tokenfuse.stats"
_MODEL_METHODS = ("clone", "set_model_attn1_patch", "set_model_attn1_output_patch", "add_wrapper_with_key")


def schedule_from_widgets(preset: str, strategy: str, ratio: float, family: str, schedule_text: str = "") -> Schedule:
    """Widgets → Schedule: the preset for the family, then the strategy/ratio widgets, then the text override.

    ratio 0 keeps the preset's per-level ratios; ratio > 0 replaces them at every level the preset reduces (DiT: the
    K/V drop fraction). Preset "off" stays identity whatever the widgets say (only the text can switch levels on).
    """
    schedule = preset_schedule(preset, family)
    if strategy != "preset" and family != "dit":
        schedule = replace(schedule, strategy=strategy)
    if ratio > 0.0 and preset != "off":
        if family == "dit":
            schedule = replace(schedule, dit_ratio=float(ratio))
        else:
            schedule = replace(schedule, ratios={lv: float(ratio) for lv in schedule.ratios})
    return parse_schedule_text(schedule_text or "", schedule)


def describe_schedule(schedule: Schedule) -> str:
    """One line: strategy, per-level ratios, window."""
    if schedule.is_off:
        return "off (identity)"
    levels = " ".join(f"/{lv}:{r:.2f}" for lv, r in schedule.ratios.items() if r > 0) or "-"
    parts = [f"strategy {schedule.strategy}", f"ratios {levels}"]
    if schedule.dit_ratio > 0:
        parts.append(f"dit K/V drop {schedule.dit_ratio:.2f}")
    parts.append(f"steps {schedule.start_percent:.0%}-{schedule.end_percent:.0%}")
    if schedule.protect_blocks:
        parts.append(f"first {schedule.protect_blocks} blocks kept")
    if schedule.ramp_step > 0:
        parts.append(f"ramp +{schedule.ramp_step:.2f}/{schedule.ramp_every} blocks to {schedule.ramp_cap:.2f}")
    if schedule.adaptive > 0:
        parts.append(f"adaptive {schedule.adaptive:.2f}")
    return ", ".join(parts)


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

    chained.tokenfuse_previous = previous  # type: ignore[attr-defined]  (lets a later scheduler unwrap ours)
    return chained


def _is_ours(fn: Any) -> bool:
    mod = getattr(fn, "__module__", "") or ""
    return mod.endswith(".scheduling.patches") or mod.endswith(".nodes.scheduler_node")


def remove_scheduling(m: Any) -> bool:
    """Remove TokenFuse's patches, attention override and wrappers from `m` (a clone: it is changed in place).

    Used when an already scheduled model is scheduled again, and by ScheduledFusion's "scheduling off" rerun.

    Other packs' patches stay where they are. Returns True when something was removed.
    """
    to = dict(m.model_options.get("transformer_options", {}))
    patches = {k: list(v) for k, v in to.get("patches", {}).items()}
    found = False
    for name in ("attn1_patch", "attn1_output_patch"):
        if name in patches:
            kept = [p for p in patches[name] if not _is_ours(p)]
            found |= len(kept) != len(patches[name])
            patches[name] = kept
    override = to.get("optimized_attention_override")
    if override is not None and _is_ours(override):
        found = True
        previous = getattr(override, "tokenfuse_previous", None)
        if previous is None:
            to.pop("optimized_attention_override")
        else:
            to["optimized_attention_override"] = previous
    if not found and not comfy_glue.has_wrapper(m, "OUTER_SAMPLE", WRAPPER_KEY):
        return False
    if "patches" in to:
        to["patches"] = patches
    m.model_options = {**m.model_options, "transformer_options": to}
    for kind in ("OUTER_SAMPLE", "PREDICT_NOISE"):
        comfy_glue.remove_wrapper(m, kind, WRAPPER_KEY)
    return True


def _peak_memory_start(device: Any) -> tuple[Callable[[], str], Callable[[], float | None]]:
    """Start measuring peak memory on `device`: (format the peak since now, peak device MiB or None on CPU)."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        # Never reset the allocator's peak: callers (ScheduledFusion, benches) measure their own spans with it.
        # A peak above the one held before the run was set by this run, so it is this run's peak exactly.
        before = torch.cuda.max_memory_allocated(dev) / 2**20

        def cuda_mib() -> float:
            return torch.cuda.max_memory_allocated(dev) / 2**20

        def cuda_text() -> str:
            now = cuda_mib()
            return f"peak VRAM {now:.0f} MiB" if now > before else f"peak VRAM <= {before:.0f} MiB (earlier peak)"

        return cuda_text, cuda_mib
    try:
        import resource

        def rss() -> str:
            return f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (process)"

        return rss, lambda: None
    except ImportError:  # Windows
        return (lambda: "peak memory n/a on CPU"), lambda: None


class _LiveStats:
    """Per-run state of the `tokenfuse.stats` events (web/README.md has the payload); reset by the run wrapper."""

    def __init__(self, node_id: str | None) -> None:
        self.node_id = node_id
        self.reset()

    def reset(self) -> None:
        self.seen = 0  # telemetry records already reported
        self.step = 0
        self.steps = 0
        self.peak_mib: Callable[[], float | None] = lambda: None

    def position(self, args: tuple, kwargs: dict) -> None:
        """Step (1-based) and step count from predict_noise(x, timestep, model_options) and its sample_sigmas."""
        self.step += 1
        options = kwargs.get("model_options", args[2] if len(args) > 2 else None) or {}
        sample_sigmas = options.get("transformer_options", {}).get("sample_sigmas")
        timestep = args[1] if len(args) > 1 else kwargs.get("timestep")
        try:
            values = [float(v) for v in sample_sigmas.reshape(-1).tolist()]
            sigma = float(timestep.reshape(-1)[0])
            self.steps = len(values) - 1
            self.step = min(range(len(values)), key=lambda i: abs(values[i] - sigma)) + 1
        except (AttributeError, TypeError, ValueError, IndexError):
            self.steps = max(self.steps, self.step)
        self.step = max(1, min(self.step, max(self.steps, 1)))

    def payload(
        self, telemetry: Any, step_time: float | None, final: bool = False, summary: str | None = None
    ) -> dict[str, Any]:
        """Per-level K/V tokens per image (means over the attention calls since the last event)."""
        per_level: dict[int, list[int]] = {}
        for rec in telemetry.records[self.seen :]:
            acc = per_level.setdefault(rec.level, [0, 0, 0])
            acc[0] += rec.kv_in
            acc[1] += rec.kv_out
            acc[2] += 1
        self.seen = len(telemetry.records)
        levels = [
            {"level": lv, "tokens_in": a[0] // a[2], "tokens_out": a[1] // a[2]} for lv, a in sorted(per_level.items())
        ]
        return {
            "node": self.node_id,
            "step": self.step,
            "steps": max(self.steps, self.step, 1),
            "step_time_s": step_time,
            "peak_mem_mb": self.peak_mib(),
            "levels": levels,
            "final": final,
            "summary": summary,
        }


def _make_run_wrapper(
    telemetry: Any, schedule: Schedule, device: Any, label: str, live: _LiveStats
) -> Callable[..., Any]:
    """OUTER_SAMPLE wrapper: reset per-run state, run sampling, log one summary line (also on error/cancel)."""

    def tokenfuse_outer_sample(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        telemetry.reset()
        live.reset()
        peak, live.peak_mib = _peak_memory_start(device)
        try:
            return executor(*args, **kwargs)
        finally:
            # summary_line: tokens saved, calls reduced, wall time since reset (= this run), patch time
            line = f"{telemetry.summary_line()}, {peak()} [{label}{', preset off' if schedule.is_off else ''}]"
            log.info("%s", line)
            if telemetry.calls == 0 and not schedule.is_off:
                log.warning(
                    "TokenFuse: no attention call reached the scheduler in this run (%s); check that no "
                    "other node replaces self-attention of this model",
                    label,
                )
            if live.step and comfy_glue.stats_listener_present():
                comfy_glue.send_stats(STATS_EVENT, live.payload(telemetry, None, final=True, summary=line))
            if schedule.telemetry_jsonl:
                try:
                    telemetry.write_jsonl(schedule.telemetry_jsonl)
                except OSError as exc:
                    log.warning("TokenFuse: could not write telemetry to %s: %s", schedule.telemetry_jsonl, exc)

    return tokenfuse_outer_sample


def _make_step_wrapper(telemetry: Any, live: _LiveStats) -> Callable[..., Any]:
    """PREDICT_NOISE wrapper (once per model evaluation): live stats to the frontend, only when a server listens."""

    def tokenfuse_step_stats(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not comfy_glue.stats_listener_present():
            return executor(*args, **kwargs)
        t0 = time.perf_counter()
        out = executor(*args, **kwargs)
        live.position(args, kwargs)
        comfy_glue.send_stats(STATS_EVENT, live.payload(telemetry, time.perf_counter() - t0))
        return out

    return tokenfuse_step_stats


def _check_model(model: Any) -> None:
    missing = [m for m in _MODEL_METHODS if not callable(getattr(model, m, None))]
    if missing or not isinstance(getattr(model, "model_options", None), dict):
        raise TypeError(
            f"TokenSchedulerController expects a ComfyUI MODEL (ModelPatcher); got {type(model).__name__} without "
            f"{missing or ['model_options']}. Connect the MODEL output of a checkpoint loader."
        )


def schedule_model(
    model: Any,
    schedule: Schedule,
    family: comfy_glue.ModelFamily,
    plan: Any = None,
    node_id: str | None = None,
    preset: str = "",
) -> tuple[Any, Any]:
    """Return (patched clone, its RunTelemetry); the input model is never touched.

    Bench scripts call this directly to time a model with a given Schedule.
    """
    from ..scheduling.patches import build_attention_override, build_unet_patches
    from ..scheduling.telemetry import RunTelemetry

    telemetry = RunTelemetry()
    m = model.clone()
    if remove_scheduling(m):
        log.info("TokenFuse: the model was already scheduled; the new schedule replaces the earlier one")
    if schedule.is_off:
        pass  # identity: attach nothing to the attention path, so the output stays bit-identical at zero cost
    elif family.route == "unet":
        attn1, attn1_out = build_unet_patches(schedule, telemetry)
        m.set_model_attn1_patch(attn1)
        m.set_model_attn1_output_patch(attn1_out)
    elif family.route == "override":
        previous = m.model_options.get("transformer_options", {}).get("optimized_attention_override")
        ours = build_attention_override(schedule, telemetry)
        comfy_glue.set_transformer_option(m, "optimized_attention_override", chain_attention_override(ours, previous))
    if plan is not None:
        comfy_glue.set_transformer_option(m, "tokenfuse_plan", plan)
    if preset:
        comfy_glue.set_transformer_option(m, PRESET_KEY, preset)  # lets ScheduledFusion's OOM fallback go stronger
    label = f"{family.name} ({family.family})"
    live = _LiveStats(node_id)
    device = getattr(m, "load_device", None)
    comfy_glue.add_outer_sample_wrapper(m, WRAPPER_KEY, _make_run_wrapper(telemetry, schedule, device, label, live))
    comfy_glue.add_wrapper(m, "PREDICT_NOISE", WRAPPER_KEY, _make_step_wrapper(telemetry, live))
    return m, telemetry


class TokenSchedulerController:
    """Attach token scheduling (K/V pooling, token merging, top-K keys) to a clone of the model."""

    DESCRIPTION = (
        "Makes the diffusion model faster and lighter by letting attention skip tokens that matter least. Pick a "
        "preset for your GPU (balanced, or lowvram 8/6/4 GB); the chart shows what it removes per block."
    )
    CATEGORY = "TokenFuse"
    FUNCTION = "apply"
    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "report")
    OUTPUT_TOOLTIPS = (
        "A clone of the input model with the scheduling patches attached (the input model is not changed).",
        "What was applied: model family, route, strategy and per-level ratios.",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, dict[str, tuple]]:
        return {
            "required": {
                "model": ("MODEL", {"tooltip": "The diffusion model to schedule (SD1.x/2.x, SDXL, Flux, Wan, ...)."}),
                "preset": (
                    list(get_args(Preset)),
                    {
                        "default": "balanced",
                        "tooltip": "off: identity (bit-identical output). balanced: the mildest reduction, 2x2 K/V "
                        "pooling at the finest attention levels (the range ToDo validated). "
                        "lowvram_8gb/6gb/4gb: stronger "
                        "reduction (ramp + adaptive) that trades fine detail for speed and memory; check faces.",
                    },
                ),
                "strategy": (
                    list(get_args(StrategyChoice)),
                    {
                        "default": "preset",
                        "tooltip": "preset: keep the preset's strategy. todo: pool K/V (cheapest, best under SDPA). "
                        "tome: merge similar tokens (also shrinks queries; costs a matching step). topk: keep "
                        "the most important keys only. DiT models always use K/V top-K.",
                    },
                ),
                "ratio": (
                    "FLOAT",
                    {
                        "default": 0.0,
                        "min": 0.0,
                        "max": 0.9,
                        "step": 0.05,
                        "tooltip": "0 = the preset's per-level ratios. Otherwise the fraction of tokens taken out of "
                        "attention at each level the preset reduces (DiT: K/V dropped). Useful 0.3-0.75; "
                        "above 0.75 detail and faces degrade. todo snaps to 1x2 (0.5), 2x2 (0.75), 3x3 (0.89).",
                    },
                ),
            },
            "optional": {
                "token_plan": (
                    "TOKEN_PLAN",
                    {
                        "tooltip": "Face-importance plan from PatchTokenize: face tokens are protected, background is "
                        "reduced first. Without it every token is treated alike.",
                    },
                ),
                "schedule_text": (
                    "STRING",
                    {
                        "multiline": True,
                        "default": "",
                        "tooltip": "Optional JSON or YAML overriding any schedule field after the widgets, e.g. "
                        '{"ratios": {"8": 0.5}, "end_percent": 0.6}. Empty = widgets only.',
                    },
                ),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},  # tags live stats with this node (web/tokenfuse_scheduler.js)
        }

    def apply(
        self,
        model: Any,
        preset: str,
        strategy: str,
        ratio: float,
        token_plan: Any = None,
        schedule_text: str = "",
        unique_id: str | None = None,
    ) -> tuple[Any, str]:
        _check_model(model)
        family = comfy_glue.detect_family(model)
        if family.route == "none":
            msg = (
                f"TokenFuse: model {family.name} has no attention entry point TokenFuse can patch (supported: "
                "SD1.x/2.x, SDXL, Flux, Wan, Qwen-Image, HunyuanVideo, LTXV); the model passes through unchanged."
            )
            log.warning(msg)
            return model, msg
        schedule = schedule_from_widgets(preset, strategy, ratio, family.family, schedule_text)
        patched, _ = schedule_model(
            model, schedule, family, token_plan, unique_id, preset if not schedule_text.strip() else ""
        )
        route = "attn1 patches" if family.route == "unet" else "attention override"
        plan_txt = "none"
        if token_plan is not None:
            saved = getattr(token_plan, "expected_reduction", lambda: 0.0)()
            plan_txt = f"{getattr(token_plan, 'batch_size', '?')} image(s), expected {saved:.0%} tokens saved"
        report = (
            f"TokenFuse scheduler: {family.name} ({family.family}, {route}); preset {preset}; "
            f"{describe_schedule(schedule)}; token plan: {plan_txt}. A summary line is logged after each run."
        )
        return patched, report


NODE_CLASS_MAPPINGS = {"TokenFuseTokenSchedulerController": TokenSchedulerController}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseTokenSchedulerController": "TokenSchedulerController"}
