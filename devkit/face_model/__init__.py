"""The project's small face latent-diffusion model: data prep, training recipe, loader (see MODEL_CARD.md).

Built from ComfyUI's own classes (`UNetModel` with `SpatialTransformer`, `AutoencoderKL`), so the pack's attn1
patches apply to it exactly as to SD1.5. Nothing here runs at import; ComfyUI is imported lazily by the loader.
"""
