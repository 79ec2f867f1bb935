"""Face-fusion HTTP service on Ray Serve (`python <pack folder> serve`); optional (requirements-scale.txt).

Not imported by ComfyUI; nothing here imports Ray, ComfyUI or torch at module level.
"""
