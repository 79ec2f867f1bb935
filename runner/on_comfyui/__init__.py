"""The runner's ComfyUI side: the `Comfy` protocol (protocol.py) and its two implementations, ComfyUI embedded in
this process (embedded.py) and a ComfyUI server over HTTP + websocket (client.py, server_ws.py); UI -> API workflow
conversion (convert.py)."""
