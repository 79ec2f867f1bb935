"""`serve`: the command line of the HTTP service, added to the runner's command line (the service sits on top of the
runner, so the runner never imports it: `python <pack folder> serve ...` and the `tokenfuse` console script enter
here).

    python ComfyUI/custom_nodes/ComfyUI-TokenFuse serve --port 8000            # the demo graph on localhost
    TOKENFUSE_SERVE_TOKEN=... python ... serve --host 0.0.0.0 --workflow my_workflow.json
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..runner.cli import add_comfy_arguments
from ..runner.cli import main as runner_main
from ..runner.errors import WorkflowError


def add_serve_command(sub: Any) -> None:
    """The `serve` sub-command (sub: argparse's sub-parsers of the tokenfuse parser)."""
    s = sub.add_parser("serve", help="face-fusion HTTP service on Ray Serve (needs requirements-scale.txt)")
    s.add_argument("--workflow", help="workflow .json with one LoadImage (default: the demo graph)")
    s.add_argument(
        "--demo",
        action="store_true",
        help="the demo graph and models (what serve runs without --workflow; not with it)",
    )
    s.add_argument("--video-workflow", help="workflow .json with one LoadVideo and a SaveVideo, for POST /video")
    s.add_argument("--set", action="append", default=[], metavar="NODE.INPUT=JSON", help="override a node input")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default localhost only; any other address needs a token)",
    )
    s.add_argument(
        "--token",
        help="bearer token every request must send (Authorization: Bearer TOKEN), at least 16 characters; required "
        "with a --host beyond loopback. Prefer the TOKENFUSE_SERVE_TOKEN environment variable: the process list "
        "shows command lines to every user of the machine",
    )
    s.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    s.add_argument("--ray", default="local", metavar="ADDRESS", help="`local` (default) or a cluster address")
    s.add_argument("--replicas", type=int, default=1, help="replicas (one warm ComfyUI each; one GPU each on GPUs)")
    s.add_argument("--max-batch", type=int, default=4, help="photos of concurrent requests run as one batch")
    s.add_argument("--batch-wait", type=float, default=0.05, help="seconds a batch waits to fill")
    s.add_argument("--max-queued", type=int, default=8, help="queued requests per replica before 503")
    s.add_argument("--retry-after", type=float, default=2.0, help="Retry-After seconds sent with a 503")
    s.add_argument("--max-image-mb", type=float, default=50.0, help="largest photo file accepted (413 above)")
    s.add_argument("--max-video-mb", type=float, default=2048.0, help="largest video file accepted (413 above)")
    s.add_argument("--max-megapixels", type=float, default=50.0, help="largest photo accepted, decoded (413 above)")
    s.add_argument("--max-video-frames", type=int, default=18_000, help="most frames of a video accepted (413 above)")
    s.add_argument(
        "--max-video-megapixels", type=float, default=8.3, help="largest video frame accepted (413 above; 4K = 8.3)"
    )
    add_comfy_arguments(s, "ComfyUI checkout each replica embeds")
    s.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    s.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.demo and args.workflow:  # the service would serve the workflow and ignore --demo
        raise WorkflowError("serve: --demo serves the demo graph, --workflow a workflow of yours: give one of them")
    from .access import TOKEN_ENV, access_error, token_digest
    from .app import ServiceConfig
    from .deploy import ServeOptions, serve_forever

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    refused = access_error(args.host, token)
    if refused is not None:  # before Ray or ComfyUI start
        raise WorkflowError(refused)
    config = ServiceConfig(
        workflow=args.workflow,
        demo=args.workflow is None,
        sets=tuple(args.set),
        comfyui=args.comfyui,
        cpu=args.cpu,
        sdpa=args.sdpa,
        max_batch=args.max_batch,
        batch_wait_s=args.batch_wait,
        max_image_mb=args.max_image_mb,
        max_video_mb=args.max_video_mb,
        max_megapixels=args.max_megapixels,
        max_video_frames=args.max_video_frames,
        max_video_megapixels=args.max_video_megapixels,
        token_sha256=None if token is None else token_digest(token),
    )
    if args.workflow:
        config = ServiceConfig(**{**config.__dict__, "workflow": str(Path(args.workflow).resolve())})
    if args.video_workflow:
        config = ServiceConfig(**{**config.__dict__, "video_workflow": str(Path(args.video_workflow).resolve())})
    opts = ServeOptions(args.ray, args.host, args.port, args.replicas, args.max_queued, args.retry_after)
    serve_forever(config, opts)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`run` and `serve` (exit codes: runner/cli.py)."""
    return runner_main(argv, commands=(add_serve_command,))


def build_parser() -> argparse.ArgumentParser:
    """The whole command line's parser (docs and tests read it)."""
    from ..runner.cli import build_parser as runner_parser

    return runner_parser(commands=(add_serve_command,))
