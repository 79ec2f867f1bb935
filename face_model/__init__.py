"""The project's small trained face model at run time: weights, loaders and plain-torch sampling (see
devkit/face_model/MODEL_CARD.md; training, data preparation and quality tools stay in devkit/face_model).

Used by `run --demo` (runner/demo.py: ComfyUI objects through `loader.load_face_model`) and the ComfyUI-free core
engine (runner/core/refine.py: `torch_sampling`, plain torch). Built from ComfyUI's own classes' layouts, so the
pack's attn1 patches apply to it exactly as to SD1.5. Nothing here runs at import; ComfyUI is imported lazily by the
ComfyUI loader only. Never imports devkit/.
"""
