"""The only modules that touch ComfyUI (`comfy.*`, `server`, `folder_paths`), always lazily inside functions.

Node modules call these helpers instead of importing ComfyUI, so the pack imports (and its node classes run) in CI
where ComfyUI is absent. Each helper either has a harmless fallback (progress bar, stats, interrupt check) or
raises `ComfyUnavailableError` naming what needs ComfyUI.

- env:      is ComfyUI there, progress bar / cancel point, OOM and interrupt classification, device memory
- patcher:  ModelPatcher wrappers and transformer_options, model family detection, memory-managed modules
- paths:    model folders and model files by name
- sampling: ComfyUI's sampler and VAE for face crops
- ui:       live stats events, node previews
"""
