"""TokenSchedulerController: attach TokenFuse's attention token scheduling to a MODEL clone.

U-Net family (SD1.x/2.x, SDXL): attn1_patch + attn1_output_patch closures. DiT families that call ComfyUI's
`optimized_attention_override` (Flux, SD3, Wan, Qwen-Image, HunyuanVideo, LTXV): K/V strategies there. Anything else:
the model passes through unchanged with one warning. Per-run telemetry is reset in an OUTER_SAMPLE wrapper, which
logs one INFO summary line per sampling run.
"""

from __future__ import annotations

import logging
from typing import Any, get_args

from ..scheduling.schedule import Preset, Schedule, Strategy, parse_schedule_mapping
from ..scheduling.widgets import schedule_from_widgets, widgets_from_text
from .checks import checked_inputs
from .glue import patcher
from .model_patching import ScheduleExtras, _check_model, schedule_model

log = logging.getLogger(__name__)

# the strategy widget: "preset" (keep the preset's) + the vocabulary's strategies
STRATEGY_CHOICES: tuple[str, ...] = ("preset", *get_args(Strategy))


def describe_schedule(schedule: Schedule, route: str = "unet") -> str:
    """One line: strategy, per-level ratios, window (and the step cache when on). route: the model family's route;
    on the DiT attention override `protect_blocks` does nothing (ComfyUI's DiT models give attention no block index)
    and the step cache is not attached (it reuses U-Net output-block features), so the line says so."""
    cache = ""
    if schedule.cache_on and route != "unet":
        cache = "step cache ignored (U-Nets only: every step runs in full)"
    elif schedule.cache_on:
        cache = (
            f"step cache every {schedule.cache_interval} steps, depth {schedule.cache_depth}, "
            f"window {schedule.cache_start_percent:.0%}-{schedule.cache_end_percent:.0%}"
            + (f", threshold {schedule.cache_threshold:g}" if schedule.cache_threshold > 0 else "")
        )
    if schedule.is_off:
        return f"tokens off; {cache}" if cache else "off (identity)"
    levels = " ".join(f"/{lv}:{r:.2f}" for lv, r in schedule.ratios.items() if r > 0) or "-"
    parts = [f"strategy {schedule.strategy}", f"ratios {levels}"]
    if schedule.dit_ratio > 0:
        parts.append(f"dit K/V drop {schedule.dit_ratio:.2f}")
    parts.append(f"steps {schedule.start_percent:.0%}-{schedule.end_percent:.0%}")
    if schedule.protect_blocks and route == "unet":
        parts.append(f"first {schedule.protect_blocks} blocks kept")
    elif schedule.protect_blocks:
        parts.append("protect_blocks ignored (U-Nets only: every DiT self-attention call is reduced)")
    if schedule.ramp_step > 0:
        parts.append(f"ramp +{schedule.ramp_step:.2f}/{schedule.ramp_every} blocks to {schedule.ramp_cap:.2f}")
    if schedule.adaptive > 0:
        parts.append(f"adaptive {schedule.adaptive:.2f}")
    return ", ".join(parts) + (f"; {cache}" if cache else "")


class TokenSchedulerController:
    """Attach token scheduling (K/V pooling, token merging, top-K keys) to a clone of the model."""

    DESCRIPTION = (
        "Makes the diffusion model faster and lighter by letting attention skip tokens that matter least. Pick a "
        "preset for your GPU (balanced, or lowvram 8/6/4 GB); the chart shows what it removes per block."
    )
    CATEGORY = "TokenFuse/model"
    FUNCTION = "apply"
    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "report")
    OUTPUT_TOOLTIPS = (
        "A clone of the input model with the scheduling patches attached (the input model is not changed).",
        "What was applied: model family, route, strategy and per-level ratios.",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, dict[str, Any]]:
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
                        "reduction (ramp + adaptive) that trades fine detail for speed and memory; check faces. "
                        "Measured on TokenFuse's small trained face model (20 held-out faces, guide 512, vs "
                        "unscheduled): balanced 38.8 dB PSNR / SSIM 0.992, lowvram_* 38.2-38.3 dB / 0.990-0.991. "
                        "balanced is device-aware: a level is reduced only where it saves time on your GPU/CPU.",
                    },
                ),
                "strategy": (
                    list(STRATEGY_CHOICES),
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
                        "tooltip": "Optional JSON or YAML overriding the widgets by name (preset, strategy, ratio) "
                        'and any schedule field after them, e.g. {"ratio": 0.5} or '
                        '{"ratios": {"8": 0.5}, "end_percent": 0.6}. Step cache (U-Net): {"cache_interval": 3} '
                        "reuses the deep features for 2 of every 3 steps (cache_depth, cache_start_percent / "
                        "cache_end_percent, cache_threshold tune it). Empty = widgets only.",
                    },
                ),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},  # tags live stats with this node (web/tokenfuse_scheduler.js)
        }

    @checked_inputs()
    def apply(  # noqa: PLR0913 - ComfyUI passes each INPUT_TYPES input as a keyword
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
        family = patcher.detect_family(model)
        if family.route == "none":
            msg = (
                f"TokenFuse: model {family.name} has no attention entry point TokenFuse can patch (supported: "
                "SD1.x/2.x, SDXL, Flux, SD3, Wan, Qwen-Image, HunyuanVideo, LTXV); the model passes through unchanged."
            )
            log.warning(msg)
            return model, msg
        schedule = schedule_from_widgets(preset, strategy, ratio, family.family, schedule_text)
        if schedule_text.strip():  # the report names the preset in effect ({"preset": ...} in the text sets it)
            preset = widgets_from_text(parse_schedule_mapping(schedule_text), preset, strategy, ratio)[0]
        extras = ScheduleExtras(token_plan, unique_id, preset if not schedule_text.strip() else "")
        patched, _ = schedule_model(model, schedule, family, extras)
        route = "attn1 patches" if family.route == "unet" else "attention override"
        plan_txt = "none"
        if token_plan is not None and family.route == "override" and patcher.text_first_patch_size(model) is None:
            plan_txt = f"not used on {family.name} (Flux-family DiTs only)"
        elif token_plan is not None:
            saved = getattr(token_plan, "expected_reduction", lambda: 0.0)()
            plan_txt = f"{getattr(token_plan, 'batch_size', '?')} image(s), expected {saved:.0%} tokens saved"
        report = (
            f"TokenFuse scheduler: {family.name} ({family.family}, {route}); preset {preset}; "
            f"{describe_schedule(schedule, family.route)}; token plan: {plan_txt}. A summary line is logged after "
            "each run."
        )
        return patched, report


NODE_CLASS_MAPPINGS = {"TokenFuseTokenSchedulerController": TokenSchedulerController}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseTokenSchedulerController": "Schedule Tokens (TokenSchedulerController)"}
