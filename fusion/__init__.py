"""The face fusion pipeline: per-face crops, sampling loop, fallback policy, artifact check, swap, restore (pure:
torch/numpy/opencv/onnxruntime; never imports ComfyUI)."""
