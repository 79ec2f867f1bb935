"""The runner's ComfyUI-free core engine (`run --engine core`): videos through the pack's cores with the small
trained face model or a stand-in (refine.py), in this process or over the Ray side's pool (video.py); its options
(cli.py)."""
