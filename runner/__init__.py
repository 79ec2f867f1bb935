"""Headless runner: run a ComfyUI workflow of this pack on images, folders, videos or list files without the editor.

`python <pack folder> run WORKFLOW ITEMS...` (see __main__.py / runner/cli.py). ComfyUI is embedded in-process
(runner/embedded.py) or reached over its HTTP API (runner/client.py, `--server URL`). Nothing here is imported by
ComfyUI when it loads the pack, and nothing here imports `comfy`/`execution`/`server` at module level.
"""
