"""Face detection, alignment, masks and paste-back (pure numpy/opencv/onnxruntime; never imports ComfyUI)."""
