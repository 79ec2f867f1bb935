"""Headless runner: run a ComfyUI workflow of this pack on images, folders, videos or list files without the editor.

`python <pack folder> run WORKFLOW ITEMS...` (see __main__.py / runner/cli.py). Four rooms:

- runner/ itself: the command line (cli.py), the item loop (run.py), items, the report, the output folder, the demo;
- runner/on_comfyui/: the ComfyUI side: ComfyUI embedded in-process (embedded.py) or reached over its HTTP API and
  websocket (client.py, server_ws.py, `--server URL`), UI -> API workflow conversion, the `Comfy` protocol;
- runner/ray/: the Ray side (`--ray`): the cluster, the worker pool, dispatch, chunked video workflows;
- runner/core/: the ComfyUI-free core engine (`--engine core`): videos through the pack's cores.

Nothing here is imported by ComfyUI when it loads the pack, and nothing here imports `comfy`/`execution`/`server`
or Ray at module level.
"""
