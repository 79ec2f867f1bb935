"""TokenSchedulerController: attach TokenFuse's attention token scheduling to a MODEL clone.

U-Net family (SD1.x/2.x, SDXL): attn1_patch + attn1_output_patch closures. DiT families that call ComfyUI's
`optimized_attention_override` (Flux, Wan, Qwen-Image, HunyuanVideo, LTXV): K/V strategies there. Anything else:
the model passes through unchanged with one warning. Per-run telemetry is reset in an OUTER_SAMPLE wrapper, which
logs one INFO summary line per sampling run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, get_args

from ..scheduling.schedule import Preset, Schedule, Strategy, parse_schedule_text, preset_schedule
from . import comfy_glue

log = logging.getLogger(__name__)

StrategyChoice = Literal["preset", "tome", "todo", "topk"]
WRAPPER_KEY = "tokenfuse"
STATS_EVENT = "tokenfuse.stats"
_MODEL_METHODS = ("clone", "set_model_attn1_patch", "set_model_attn1_output_patch", "add_wrapper_with_key")

assert set(get_args(StrategyChoice)) == {"preset", *get_args(Strategy)}, "StrategyChoice must follow Strategy"


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

    return chained


def _peak_memory_start(device: Any) -> Callable[[], str]:
    """Start measuring peak memory on `device`; the returned function formats the peak since then."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(dev)
        return lambda: f"peak VRAM {torch.cuda.max_memory_allocated(dev) / 2**20:.0f} MiB"
    try:
        import resource

        return lambda: f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (process)"
    except ImportError:  # Windows
        return lambda: "peak memory n/a on CPU"


def _make_run_wrapper(telemetry: Any, schedule: Schedule, device: Any, label: str) -> Callable[..., Any]:
    """OUTER_SAMPLE wrapper: reset per-run telemetry, run sampling, log one summary line (also on error/cancel)."""

    def tokenfuse_outer_sample(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        telemetry.reset()
        peak = _peak_memory_start(device)
        try:
            return executor(*args, **kwargs)
        finally:
            # summary_line: tokens saved, calls reduced, wall time since reset (= this run), patch time
            log.info("%s, %s [%s%s]", telemetry.summary_line(), peak(), label,
                     ", preset off" if schedule.is_off else "")
            if telemetry.calls == 0 and not schedule.is_off:
                log.warning("TokenFuse: no attention call reached the scheduler in this run (%s); check that no "
                            "other node replaces self-attention of this model", label)
            if schedule.telemetry_jsonl:
                try:
                    telemetry.write_jsonl(schedule.telemetry_jsonl)
                except OSError as exc:
                    log.warning("TokenFuse: could not write telemetry to %s: %s", schedule.telemetry_jsonl, exc)

    return tokenfuse_outer_sample


def _make_step_wrapper(telemetry: Any) -> Callable[..., Any]:
    """PREDICT_NOISE wrapper (once per step): send live stats to the frontend when a server listens."""

    def tokenfuse_step_stats(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = executor(*args, **kwargs)
        if comfy_glue.stats_listener_present():
            comfy_glue.send_stats(STATS_EVENT, telemetry.summary())
        return out

    return tokenfuse_step_stats


def _check_model(model: Any) -> None:
    missing = [m for m in _MODEL_METHODS if not callable(getattr(model, m, None))]
    if missing or not isinstance(getattr(model, "model_options", None), dict):
        raise TypeError(
            f"TokenSchedulerController expects a ComfyUI MODEL (ModelPatcher); got {type(model).__name__} without "
            f"{missing or ['model_options']}. Connect the MODEL output of a checkpoint loader."
        )


def schedule_model(model: Any, schedule: Schedule, family: comfy_glue.ModelFamily,
                   plan: Any = None) -> tuple[Any, Any]:
    """Return (patched clone, its RunTelemetry); the input model is never touched.

    Bench scripts call this directly to time a model with a given Schedule.
    """
    from ..scheduling.patches import build_attention_override, build_unet_patches
    from ..scheduling.telemetry import RunTelemetry

    telemetry = RunTelemetry()
    m = model.clone()
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
    label = f"{family.name} ({family.family})"
    comfy_glue.add_outer_sample_wrapper(m, WRAPPER_KEY, _make_run_wrapper(telemetry, schedule,
                                                                          getattr(m, "load_device", None), label))
    comfy_glue.add_wrapper(m, "PREDICT_NOISE", WRAPPER_KEY, _make_step_wrapper(telemetry))
    return m, telemetry


class TokenSchedulerController:
    """Attach token scheduling (K/V pooling, token merging, top-K keys) to a clone of the model."""

    DESCRIPTION = (
        "Schedules the diffusion model's attention tokens to cut time and memory: K/V pooling (todo), token merging "
        "(tome) or top-K keys (topk) per U-Net level, optionally guided by a TOKEN_PLAN that protects the face. "
        "Works on SD1.x/2.x and SDXL U-Nets and on Flux/Wan/Qwen/HunyuanVideo/LTXV via the attention override; "
        "other models pass through unchanged. Logs one summary line (tokens saved, time, peak memory) per run."
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
                "preset": (list(get_args(Preset)), {
                    "default": "balanced",
                    "tooltip": "off: identity (bit-identical output). balanced: 2x2 K/V pooling at the finest "
                               "attention levels, safe for quality. lowvram_8gb/6gb/4gb: progressively stronger "
                               "reduction (ramp + adaptive) that trades fine detail for speed and memory; check faces.",
                }),
                "strategy": (list(get_args(StrategyChoice)), {
                    "default": "preset",
                    "tooltip": "preset: keep the preset's strategy. todo: pool K/V (cheapest, best under SDPA). "
                               "tome: merge similar tokens (also shrinks queries; costs a matching step). topk: keep "
                               "the most important keys only. DiT models always use K/V top-K.",
                }),
                "ratio": ("FLOAT", {
                    "default": 0.0, "min": 0.0, "max": 0.9, "step": 0.05,
                    "tooltip": "0 = the preset's per-level ratios. Otherwise the fraction of tokens taken out of "
                               "attention at each level the preset reduces (DiT: K/V dropped). Useful 0.3-0.75; "
                               "above 0.75 detail and faces degrade. todo snaps to 1x2 (0.5), 2x2 (0.75), 3x3 (0.89).",
                }),
            },
            "optional": {
                "token_plan": ("TOKEN_PLAN", {
                    "tooltip": "Face-importance plan from PatchTokenize: face tokens are protected, background is "
                               "reduced first. Without it every token is treated alike.",
                }),
                "schedule_text": ("STRING", {
                    "multiline": True, "default": "",
                    "tooltip": "Optional JSON or YAML overriding any schedule field after the widgets, e.g. "
                               "{\"ratios\": {\"8\": 0.5}, \"end_percent\": 0.6}. Empty = widgets only.",
                }),
            },
        }

    def apply(self, model: Any, preset: str, strategy: str, ratio: float, token_plan: Any = None,
              schedule_text: str = "") -> tuple[Any, str]:
        _check_model(model)
        family = comfy_glue.detect_family(model)
        if family.route == "none":
            msg = (f"TokenFuse: model {family.name} has no attention entry point TokenFuse can patch (supported: "
                   "SD1.x/2.x, SDXL, Flux, Wan, Qwen-Image, HunyuanVideo, LTXV); the model passes through unchanged.")
            log.warning(msg)
            return model, msg
        schedule = schedule_from_widgets(preset, strategy, ratio, family.family, schedule_text)
        patched, _ = schedule_model(model, schedule, family, token_plan)
        route = "attn1 patches" if family.route == "unet" else "attention override"
        plan_txt = "none"
        if token_plan is not None:
            saved = getattr(token_plan, "expected_reduction", lambda: 0.0)()
            plan_txt = f"{getattr(token_plan, 'batch_size', '?')} image(s), expected {saved:.0%} tokens saved"
        report = (f"TokenFuse scheduler: {family.name} ({family.family}, {route}); preset {preset}; "
                  f"{describe_schedule(schedule)}; token plan: {plan_txt}. A summary line is logged after each run.")
        return patched, report


NODE_CLASS_MAPPINGS = {"TokenFuseTokenSchedulerController": TokenSchedulerController}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseTokenSchedulerController": "TokenSchedulerController"}
