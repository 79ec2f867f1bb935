"""Training-free token scheduling for diffusion attention (pure torch; never imports ComfyUI).

Public API (import the submodule you need; `schedule` is torch-free so UI code can import it at start-up):
- schedule:  Schedule (frozen settings), Strategy / Preset / Family (Literal vocabularies), ScheduleError,
             preset_schedule(name, family="sd15"|"sdxl"|"dit"), parse_schedule_text(text, base), load_schedule(path),
             save_schedule(schedule, path), Schedule.to_dict() / Schedule.from_dict(data, base=None).
- patches:   build_unet_patches(schedule, telemetry) -> (attn1_patch, attn1_output_patch); build_unet_hooks adds the
             DIFFUSION_MODEL wrapper that keeps them traceable under torch.compile. Its parts: unet_state (the state
             object), unet_table (the call table; infer_grid(n, shape)), unet_eager, unet_trace, compile_wrapper.
- strategies: STRATEGIES, the one registry of token-reduction strategies (tome, todo, topk: one module each).
- dit_override: build_attention_override(schedule, telemetry) -> override for DiT families; build_dit_hooks adds its
             torch.compile wrapper.
- telemetry: RunTelemetry (reset / record / summary / summary_line / write_jsonl / finish); RunSeries (several runs
             as one: summed summary, one JSONL file); TelemetryFile (JSONL renamed into place when complete).
- merge:     tome_functions, bipartite_soft_matching_2d, random_partition (ToMe merge/unmerge closures).
- downsample: kv_downsample_functions, pool_tokens, kernel_for_ratio (ToDo K/V pooling).
- topk:      topk_kv_functions, topk_indices (top-K keys/values).
- plan:      TokenPlan (the TOKEN_PLAN type: ROI importance per level).
- keys:      the transformer_options keys shared by the node layer and the patches (PLAN_KEY, DISABLED_KEY, ...).
- vocabulary: the words every layer shares, torch-free (LEVELS, Preset + PRESET_ORDER, Strategy, Device,
             MODEL_EXTENSIONS, do_nothing); UI choices come from its Literal types with get_args.
"""
