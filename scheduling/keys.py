"""The keys TokenFuse reads and writes in `model_options["transformer_options"]` (torch-free: UI code may import it).

ComfyUI passes every transformer_options entry to the attention patches as `extra_options`, so these strings are
the contract between the node layer (which sets them on a ModelPatcher clone) and scheduling/patches.py (which
reads them at every attention call). Declared once here.
"""

from __future__ import annotations

PLAN_KEY = "tokenfuse_plan"  # the TokenPlan in force (TokenSchedulerController, ScheduledFusion's crop plan)
DISABLED_KEY = "tokenfuse_disabled"  # True: every TokenFuse patch passes through (the "scheduling off" rerun)
PRESET_KEY = "tokenfuse_preset"  # the preset in force (ScheduledFusion's OOM fallback steps up from it)
UNMERGE_KEY = "tokenfuse_unmerge"  # per-call state from attn1_patch to attn1_output_patch
TRACED_UNMERGE_KEY = "tokenfuse_traced_unmerge"  # the same, between the two patches traced into a compiled graph
OVERRIDE_KEY = "optimized_attention_override"  # ComfyUI's own key: the DiT attention override
WRAPPER_KEY = "tokenfuse"  # the key of TokenFuse's ModelPatcher wrappers
TRACE_KEY = "tokenfuse_trace"  # per compiled model call: the frozen table the traced attn1 patches read
SHALLOW_KEY = "tokenfuse_shallow"  # per model call the step cache serves from its cache: (depth, output blocks)
STEP_KEY = "tokenfuse_steps"  # the run's SamplingSteps (scheduling/step_state.py), set by the SAMPLER_SAMPLE wrapper
NEIGHBOURS_KEY = (
    "tokenfuse_neighbours"  # per model call: other packs' attn1 replaces / later attn1 patches (patches.py)
)
DIT_PLAN_KEY = "tokenfuse_dit_plan"  # per DiT model call: the plan mapped onto its token sequence (dit_override.py)
