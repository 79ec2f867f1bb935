"""Command line: `python <pack folder> run ...` / `serve ...` (also the `tokenfuse` console script).

    python ComfyUI/custom_nodes/ComfyUI-TokenFuse run --demo
    python ComfyUI/custom_nodes/ComfyUI-TokenFuse run workflows/tokenfuse_face_refine_sd15_4gb.json photos/ -o out/
    python ... run workflow.json clip.mp4 --input source_face=me.jpg --server http://127.0.0.1:8188 --resume
    python ... run workflows/tokenfuse_video_face_refine_sd15_6gb.json clip.mp4 --ray local --workers 2
    python ... run --engine core long.mp4 --ray local --workers 2   # videos on the pack's core, no ComfyUI

Exit codes: 0 every item ok, 1 some item failed (a summary lists them), 2 bad command line / workflow,
130 interrupted by Ctrl-C or SIGTERM (finished items stay in the report; --resume continues).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .core.cli import add_core_arguments, cmd_run_core, refuse_core_options
from .errors import WorkflowError
from .items import Item, expand, item_slot, resolve
from .on_comfyui.convert import is_api_prompt, ui_to_api
from .output_folder import refuse_non_folder
from .report import item_names
from .run import EXIT_USAGE, RunTarget, Summary, Workflow, run_items

if TYPE_CHECKING:
    from .on_comfyui.protocol import Comfy
    from .ray.pool import RayPool

log = logging.getLogger("tokenfuse.runner")

AddCommand = Callable[[Any], None]
"""adds one sub-command to the parser's sub-parsers and sets its `handler` default (service/cli.py: `serve`)."""


def build_parser(commands: Sequence[AddCommand] = ()) -> argparse.ArgumentParser:
    """`run`, plus the sub-commands `commands` add (service/cli.py adds `serve`: the runner never imports the
    service, which sits on top of it)."""
    p = argparse.ArgumentParser(prog="tokenfuse", description="TokenFuse without the editor: runner and service.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a workflow on images, folders, videos or list files")
    r.add_argument("workflow", nargs="?", help="workflow .json (UI format as saved by the editor, or API format)")
    r.add_argument("items", nargs="*", help="images, videos, folders of them, or .txt lists (one path per line)")
    r.add_argument("-o", "--output", default="tokenfuse_out", help="output folder (one subfolder per item)")
    r.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="bind a loader (node id, title, file stem "
        "or kind) to a file for every item, or to a folder/list whose files become the items",
    )
    r.add_argument("--item-input", metavar="NAME", help="the loader the items go to (default: the one left unbound)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NODE.INPUT=JSON",
        help="override a node input; "
        "NODE is a node id, title or class (all nodes of that class); the value is JSON or a plain string",
    )
    r.add_argument("--resume", action="store_true", help="skip items the report already lists as ok")
    r.add_argument("--server", metavar="URL", help="run on a ComfyUI server (HTTP API) instead of in-process")
    add_comfy_arguments(r, "ComfyUI checkout to embed")
    r.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="spread items over Ray workers: "
        "`local` (default) starts a local cluster, `auto` or ray://host:10001 joins one (needs "
        "requirements-scale.txt)",
    )
    r.add_argument("--workers", type=int, default=2, help="Ray workers (one warm ComfyUI each; one GPU each on GPUs)")
    r.add_argument(
        "--demo",
        action="store_true",
        help="built-in demo graph and photo (runner/demo.py); tune it with --set (fuse.steps=8, fuse.seed=1, "
        "schedule.preset=off, detect.backend=mtcnn), not with the core engine's options",
    )
    r.add_argument(
        "--checkpoint",
        metavar="NAME",
        help="with --demo: one of your SD1.5 checkpoints in ComfyUI's models/checkpoints instead of the small test "
        "model (the file name, as the checkpoint loader lists it)",
    )
    r.add_argument("--quiet", action="store_true", help="no progress line")
    r.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_core_arguments(r)
    for add in commands:
        add(sub)
    return p


def add_comfy_arguments(parser: argparse.ArgumentParser, checkout: str) -> None:
    """--comfyui, --cpu, --sdpa: how `run` and `serve` start their embedded ComfyUI."""
    parser.add_argument(
        "--comfyui",
        metavar="PATH",
        help=f"{checkout} (default: COMFYUI_PATH, or the ComfyUI this pack is installed in)",
    )
    parser.add_argument("--cpu", action="store_true", help="embedded ComfyUI on CPU (ComfyUI's --cpu)")
    parser.add_argument(
        "--sdpa", action="store_true", help="PyTorch SDPA attention (ComfyUI's --use-pytorch-cross-attention)"
    )


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_sets(
    prompt: dict[str, dict[str, Any]], sets: list[str], defs: dict[str, dict[str, Any]] | None = None
) -> None:
    """--set NODE.INPUT=VALUE: NODE is a node id, a title or a class_type (every node of it).

    defs: the engine's node definitions (/object_info). With them INPUT must be one of the node's inputs and a
    value must fit the input's type, range and choices, so a typo stops the run before any item (WorkflowError,
    exit 2) instead of being ignored (exit 0) or failing every item (exit 1). Nodes of a class the definitions do
    not know are left to ComfyUI's validation."""
    apply_sets_to([prompt], sets, defs)


def apply_sets_to(
    prompts: list[dict[str, dict[str, Any]]], sets: list[str], defs: dict[str, dict[str, Any]] | None = None
) -> None:
    """Each --set on every prompt that has a node it names (checked against defs as in apply_sets); WorkflowError
    when none has one. `serve` has one --set list for its photo and video workflows, which rarely share every node
    (a --set naming a node of one of them must not stop the service from starting)."""
    for s in sets:
        target, sep, value = s.partition("=")
        node, dot, name = target.rpartition(".")
        if not sep or not dot or not node or not name:
            raise WorkflowError(f"--set {s!r}: expected NODE.INPUT=VALUE")
        hits = [(prompt, nid) for prompt in prompts for nid in _set_targets(prompt, node)]
        if not hits:
            where = " in any of the workflows" if len(prompts) > 1 else ""
            raise WorkflowError(f"--set {s!r}: no node with id, title or class {node!r}{where}")
        for prompt, nid in hits:
            kind = prompt[nid]["class_type"]
            parsed = _parse_value(value)
            if defs is not None and kind in defs:
                parsed = _checked_value(defs[kind], name, value, parsed, f"--set {s!r}: node {nid} ({kind})")
            prompt[nid]["inputs"][name] = parsed


def _set_targets(prompt: dict[str, dict[str, Any]], node: str) -> list[str]:
    """The ids of the nodes a --set's NODE names in `prompt`: its id, its class_type, or its title (any case)."""
    return [
        nid
        for nid, n in prompt.items()
        if node in (nid, n["class_type"]) or node.lower() == str((n.get("_meta") or {}).get("title", "")).lower()
    ]


PRIMITIVES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})


def _checked_value(definition: dict[str, Any], name: str, text: str, value: Any, where: str) -> Any:
    """`value` for input `name` of a node with this /object_info `definition`, or WorkflowError naming the problem
    and the valid inputs or choices. A link (["node id", output]) is taken for any input; a STRING input keeps the
    text as typed (`--set save.filename_prefix=2024` is the string "2024", not the number)."""
    inputs = definition.get("input") or {}
    specs = {**(inputs.get("required") or {}), **(inputs.get("optional") or {})}
    if name not in specs:
        raise WorkflowError(f"{where} has no input {name!r}; its inputs: {', '.join(specs) or 'none'}")
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int):
        return value
    spec = specs[name] if isinstance(specs[name], (list, tuple)) and specs[name] else [None]
    kind, opts = spec[0], spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if isinstance(kind, (list, tuple)) or kind == "COMBO":
        choices = list(kind) if isinstance(kind, (list, tuple)) else list(opts.get("options") or [])
        for candidate in (value, text):
            if not choices or candidate in choices:
                return candidate
        shown = ", ".join(map(str, choices[:20])) + (f", ... ({len(choices)} in all)" if len(choices) > 20 else "")
        raise WorkflowError(f"{where}: {name} {value!r} is not one of its choices: {shown}")
    if kind == "STRING":
        return value if isinstance(value, str) else text
    if kind == "BOOLEAN":
        if not isinstance(value, bool):
            raise WorkflowError(f"{where}: {name} takes true or false, not {text!r}")
        return value
    if kind in ("INT", "FLOAT"):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (kind == "INT" and not float(value).is_integer()):
            raise WorkflowError(f"{where}: {name} takes {'an integer' if kind == 'INT' else 'a number'}, not {text!r}")
        low, high = opts.get("min"), opts.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            raise WorkflowError(f"{where}: {name} {value} is outside {low} .. {high}")
        return int(value) if kind == "INT" else value
    if isinstance(kind, str) and kind not in PRIMITIVES and kind != "*" and "," not in kind and "default" not in opts:
        raise WorkflowError(f'{where}: {name} takes a link ({kind}) from another node, e.g. ["4", 0], not {text!r}')
    return value


MAX_WORKFLOW_DEPTH = 100  # a saved workflow nests about 8 levels; later steps copy a prompt recursively


def read_workflow(path: Path) -> dict[str, Any]:
    """A workflow file's JSON object, read before any engine starts. WorkflowError when it cannot be read, is not
    UTF-8 JSON, is not an object, or nests deeper than MAX_WORKFLOW_DEPTH (`[` * 100000 ended in json's
    RecursionError traceback)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkflowError(f"cannot read workflow {path}: {e}") from e
    except RecursionError:
        raise WorkflowError(f"{path} is not a ComfyUI workflow: its JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise WorkflowError(f"{path} is not a ComfyUI workflow (a JSON object of nodes)")
    if _nested_deeper(data, MAX_WORKFLOW_DEPTH):
        raise WorkflowError(
            f"{path} is not a ComfyUI workflow: its JSON is nested too deeply ({MAX_WORKFLOW_DEPTH} levels at most)"
        )
    return data


def _nested_deeper(value: Any, limit: int) -> bool:
    """True when the lists and dicts in `value` nest more than `limit` levels (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def to_prompt(data: dict[str, Any], defs: dict[str, dict[str, Any]], path: Path) -> dict[str, dict[str, Any]]:
    """An API prompt from a workflow read by read_workflow (UI format converted with the engine's node definitions)."""
    if not is_api_prompt(data):
        return ui_to_api(data, defs)
    if not data:
        raise WorkflowError(f"{path} is not a ComfyUI workflow: it has no nodes")
    return {str(k): v for k, v in data.items()}


def refuse_unknown_classes(prompt: dict[str, dict[str, Any]], defs: dict[str, dict[str, Any]], path: Path) -> None:
    """WorkflowError naming the node classes of `prompt` the engine does not know (ui_to_api does the same for UI
    workflows): a workflow of only unknown classes has no loader, and read "every loader is bound by --input"."""
    unknown = sorted({str(node["class_type"]) for node in prompt.values()} - set(defs))
    if unknown:
        shown = ", ".join(name[:80] for name in unknown[:20])
        more = f", ... ({len(unknown)} in all)" if len(unknown) > 20 else ""
        raise WorkflowError(
            f"{path}: node class(es) unknown to this ComfyUI: {shown}{more}. The custom node pack(s) that provide "
            "them are not installed or failed to load (see ComfyUI's start-up log)"
        )


def load_prompt(path: Path, defs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """read_workflow then to_prompt."""
    return to_prompt(read_workflow(path), defs, path)


class _Host(Protocol):
    """What `run` needs before it knows its items: a ComfyUI (the `Comfy` protocol) or a RayPool of them."""

    def node_defs(self) -> dict[str, dict[str, Any]]: ...

    def close(self) -> None: ...


@dataclass
class _Job:
    """A workflow bound for a run: the API prompt, its item loader (`slot`), the loaders bound to one file each
    (`constants`), the items and their kind ("image" or "video")."""

    prompt: dict[str, dict[str, Any]]
    slot: str
    constants: dict[str, Path]
    items: list[Item]
    kind: str

    def workflow(self) -> Workflow:
        return Workflow(self.prompt, self.slot, self.constants, self.items)


def _open_comfy(args: argparse.Namespace, extra_nodes: dict[str, type] | None) -> Comfy:
    """The ComfyUI of a run without --ray: a server (--server URL) or embedded in this process."""
    if args.server:
        from .on_comfyui.client import ServerComfy

        return ServerComfy(args.server)
    from .on_comfyui.embedded import EmbeddedComfy

    return EmbeddedComfy(args.comfyui, cpu=args.cpu, sdpa=args.sdpa, extra_nodes=extra_nodes)


def _open_pool(args: argparse.Namespace) -> RayPool:
    """The Ray workers of a run with --ray, each with a warm embedded ComfyUI."""
    from .ray.pool import RayPool
    from .ray.worker import WorkerSpec

    spec = WorkerSpec(comfyui=args.comfyui, cpu=args.cpu, sdpa=args.sdpa, demo=args.demo)
    return RayPool(args.ray, args.workers, spec)


def _refuse_conflicts(args: argparse.Namespace) -> None:
    """WorkflowError for option combinations `run` cannot honour, before anything starts."""
    refuse_core_options(args)
    if args.ray and args.server:
        raise WorkflowError("--ray runs embedded ComfyUIs on the workers: drop --server")
    if args.demo and args.server:
        raise WorkflowError("--demo runs embedded (its model loader exists only in the runner): drop --server")
    if not args.demo and not args.workflow:
        raise WorkflowError("give a workflow .json (or --demo)")
    if args.checkpoint and not args.demo:
        raise WorkflowError("--checkpoint picks the demo's model: use it with --demo (a workflow names its own)")


def cmd_run(args: argparse.Namespace) -> int:
    """`run`: the core engine (--engine core), or a workflow on a pool of Ray workers (--ray) or on one ComfyUI."""
    from . import demo

    if args.engine == "core":
        return cmd_run_core(args)
    _refuse_conflicts(args)
    refuse_non_folder(args.output)
    workflow = None if args.demo else read_workflow(Path(args.workflow))  # a broken file costs no ComfyUI start
    output, progress = Path(args.output), not args.quiet
    if args.ray:
        pool = _open_pool(args)
        return _run_on(args, workflow, pool, lambda job: _run_on_pool(args, pool, job))
    comfy = _open_comfy(args, {demo.DEMO_LOADER: demo.DemoModels} if args.demo else None)
    return _run_on(
        args,
        workflow,
        comfy,
        lambda job: run_items(comfy, job.workflow(), RunTarget(output, args.resume, progress)),
    )


def _run_on(
    args: argparse.Namespace, workflow: dict[str, Any] | None, host: _Host, run: Callable[[_Job], Summary]
) -> int:
    """Bind the workflow (or the demo) with `host`'s node definitions, `run` it, close `host`; the exit code."""
    from . import demo

    scratch = tempfile.TemporaryDirectory(prefix="tokenfuse_demo_")
    try:
        defs = host.node_defs()
        job = _bind_job(args, workflow, defs, Path(scratch.name))
        summary = run(job)
        if args.demo:  # before the scratch folder (the sample photo, the sheet's first panel) goes
            demo.write_demo_sheets(Path(args.output), {i.key for i in job.items}, args.checkpoint)
    finally:
        host.close()
        scratch.cleanup()
    # run_items logs the summary line; the failures are listed once more at the end, where a user looks
    for failure in summary.failures:
        log.error("failed: %s", failure)
    if args.demo:  # the last line: how to run the demo with one of the user's checkpoints
        demo.log_checkpoint_hint(args.checkpoint, defs)
    return summary.exit_code


def _run_on_pool(args: argparse.Namespace, pool: RayPool, job: _Job) -> Summary:
    """--ray: each video in time chunks over the workers (ray/workflow_video.py), photos one item per worker."""
    output, progress = Path(args.output), not args.quiet
    if job.kind == "video":
        from .ray.workflow_video import run_workflow_videos_ray

        return run_workflow_videos_ray(pool, job.workflow(), RunTarget(output, args.resume, progress), args.chunks)
    from .ray.dispatch import run_items_ray

    return run_items_ray(pool, job.workflow(), RunTarget(output, args.resume, progress))


def _bind_job(
    args: argparse.Namespace, workflow: dict[str, Any] | None, defs: dict[str, dict[str, Any]], scratch: Path
) -> _Job:
    """The run's prompt (the workflow, or the demo graph), --set applied, --input bound, items expanded and checked
    against the item loader's kind. WorkflowError names what to change."""
    from . import demo

    if args.demo:
        if args.checkpoint:
            demo.check_checkpoint(args.checkpoint, defs)
        log.info("TokenFuse demo: %s", demo.model_label(args.checkpoint))
        prompt = demo.fill_defaults(demo.demo_prompt(checkpoint=args.checkpoint, plan_image=True), defs)
        sources = ([args.workflow] if args.workflow else []) + list(args.items)
    else:
        prompt = to_prompt(workflow or {}, defs, Path(args.workflow))
        refuse_unknown_classes(prompt, defs, Path(args.workflow))
        sources = list(args.items)
    apply_sets(prompt, args.set, defs)
    constants, slot_key = _bind_inputs(args, prompt, sources)
    if args.demo and not sources:
        sources = [str(demo.demo_photo(scratch))]
    slot = item_slot(prompt, set(constants), slot_key)
    known = item_names(Path(args.output) / "report.jsonl") if args.resume else None
    items: list[Item] = expand(sources, known)
    if not items:
        raise WorkflowError("no items: give images, videos, folders or list files")
    kind = {"LoadVideo": "video"}.get(prompt[slot]["class_type"], "image")
    wrong = [i for i in items if i.kind != kind]
    if wrong:
        raise WorkflowError(
            f"{len(wrong)} item(s) are {wrong[0].kind}s but node {slot} ({prompt[slot]['class_type']}) takes "
            f"{kind}s: use a workflow with a {'LoadVideo' if wrong[0].kind == 'video' else 'LoadImage'} node"
        )
    return _Job(prompt, slot, constants, items, kind)


def _bind_inputs(
    args: argparse.Namespace, prompt: dict[str, dict[str, Any]], sources: list[str]
) -> tuple[dict[str, Path], str | None]:
    """--input NAME=PATH: a file binds loader NAME for every item (the returned constants, each checked to exist); a
    folder or list file adds its files to `sources` and makes NAME the item loader (the returned slot key, else
    --item-input)."""
    constants: dict[str, Path] = {}
    slot_key: str | None = args.item_input
    for spec in args.input:
        key, sep, value = spec.partition("=")
        if not sep:
            raise WorkflowError(f"--input {spec!r}: expected NAME=PATH")
        path = Path(value).expanduser()
        if path.is_dir() or path.suffix.lower() in (".txt", ".lst", ".list"):
            sources.append(value)
            slot_key = key
        else:
            constants[resolve(prompt, key)] = path
    for nid, path in constants.items():
        if not path.is_file():
            raise WorkflowError(f"--input file not found: {path} (for node {nid})")
    return constants, slot_key


def main(argv: list[str] | None = None, commands: Sequence[AddCommand] = ()) -> int:
    """The command line: `run`, and the sub-commands `commands` add (each sets its `handler` default); exit codes as
    runner/run.py documents them for every sub-command."""
    args = build_parser(commands).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    previous = _sigterm_as_interrupt()
    try:
        if args.command == "run":
            return cmd_run(args)
        handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
        if handler is not None:
            return handler(args)
    except (WorkflowError, FileNotFoundError, ConnectionError, ImportError) as e:
        log.error("tokenfuse: error: %s", e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        log.error("tokenfuse: aborted")
        return 130
    except Exception as e:
        ray_errors = sys.modules.get("ray.exceptions")  # only when --ray imported Ray
        if ray_errors is None or not isinstance(e, ray_errors.RayActorError):
            raise
        # a worker that could not start (no ComfyUI at --comfyui on a node, ...): the cause's last line, exit 2
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        log.error(
            "tokenfuse: error: a Ray worker could not start: %s", (lines[-1] if lines else type(e).__name__)[:500]
        )
        return EXIT_USAGE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_USAGE


def _sigterm_as_interrupt() -> Any:
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does, for the whole command (the previous handler, or None off
    the main thread): the item loops handle both alike (runner/run.py), and elsewhere (start-up, --ray loops) the
    `finally` blocks still close the engine, remove its work folder and stop a local Ray cluster."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)
