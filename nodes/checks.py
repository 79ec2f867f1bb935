"""One input check for every node: a value from a prompt is bounded before any work starts.

ComfyUI validates combo choices and int/float ranges of a prompt, but not NaN, string length, or the type of a value
arriving on a link from another pack's node; the headless runner and tests call node functions directly. So each
node's FUNCTION is wrapped with `checked_inputs`, which checks every argument against the node's own INPUT_TYPES and
raises `NodeInputError` (a ValueError) naming the node, the input and the fix, echoing at most a few dozen characters.
An argument the node does not declare is refused too: ComfyUI validates only declared inputs but passes every linked
one to the function, so an undeclared keyword (an internal option of a node function) would be reachable from a
prompt.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, TypeVar

from ..scheduling.schedule import echo

F = TypeVar("F", bound=Callable[..., Any])

STRING_MAX_CHARS = 4_096  # one-line text widgets (indices, model names, ...)
MULTILINE_MAX_CHARS = 16_384  # multiline widgets (schedule_text)

# Custom types: what the value must be and which node makes it (for the message).
_SOURCES = {
    "FACES": "a FACES output (FaceDetect, ScheduledFusion or GFPGANEnhance)",
    "TOKEN_PLAN": "a TOKEN_PLAN output (PatchTokenize)",
    "IMAGE": "an IMAGE [batch, height, width, channels] (LoadImage, VAE Decode, ...)",
    "MASK": "a MASK [batch, height, width] (FaceDetect, LoadImage, ...)",
    "VIDEO": "a VIDEO (core Load Video)",
    "FACE_TRACKS": "FACE_TRACKS (FaceTrack)",
}


class NodeInputError(ValueError):
    """An input value is out of bounds or of the wrong type; the message names the node, the input and the fix."""


class NodeInputTypeError(NodeInputError, TypeError):
    """A linked input carries another type than the node expects (e.g. a STRING into FACES)."""


def _is_custom(kind: str, value: Any) -> bool:
    if kind == "FACES":
        from ..faces.types import FaceSet

        return isinstance(value, FaceSet)
    if kind == "TOKEN_PLAN":
        from ..scheduling.plan import TokenPlan

        return isinstance(value, TokenPlan)
    if kind == "VIDEO":  # comfy_api VideoInput, or glue.video.VideoPath (the runner, tests): never a typed-in path
        return hasattr(value, "get_stream_source")
    if kind == "FACE_TRACKS":
        from ..video.track_pass import FaceTracks

        return isinstance(value, FaceTracks)
    import torch

    if kind == "IMAGE":
        return isinstance(value, torch.Tensor) and value.ndim in (3, 4)
    return isinstance(value, torch.Tensor) and value.ndim in (2, 3)  # MASK


def _check(where: str, kind: Any, opts: dict[str, Any], value: Any, free_choice: bool) -> None:
    """NodeInputError/NodeInputTypeError when `value` does not fit the input's `kind` and `opts` (its INPUT_TYPES
    entry); where: "<node>: input '<name>'", the start of the message."""
    if isinstance(kind, list):
        if not isinstance(value, str) or len(value) > STRING_MAX_CHARS:
            raise NodeInputError(f"{where} must be one of its listed choices, got {echo(value)}")
        if value not in kind and not free_choice:
            shown = ", ".join(map(str, kind[:6])) + (", ..." if len(kind) > 6 else "")
            raise NodeInputError(f"{where} must be one of [{shown}], got {echo(value)}")
    elif kind == "STRING":
        cap = MULTILINE_MAX_CHARS if opts.get("multiline") else STRING_MAX_CHARS
        if not isinstance(value, str):
            raise NodeInputTypeError(f"{where} must be text, got {type(value).__name__}")
        if len(value) > cap:
            raise NodeInputError(f"{where} is {len(value)} characters long; at most {cap} are accepted")
    elif kind in ("INT", "FLOAT"):
        integer = kind == "INT"
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(value):
            raise NodeInputError(f"{where} must be a finite {'integer' if integer else 'number'}, got {echo(value)}")
        lo, hi = opts.get("min", -math.inf), opts.get("max", math.inf)
        if not lo <= value <= hi:
            raise NodeInputError(f"{where} must be in [{lo}, {hi}], got {echo(value)}")
    elif kind == "BOOLEAN":
        if not isinstance(value, bool):
            raise NodeInputError(f"{where} must be true or false, got {echo(value)}")
    elif kind in _SOURCES and not _is_custom(kind, value):
        raise NodeInputTypeError(f"{where} expects {_SOURCES[kind]}, got {type(value).__name__}: connect that output")


def refuse_undeclared(cls: type, names: Any, spec: dict[str, dict[str, Any]] | None = None) -> None:
    """NodeInputError if a name is not one of the node's declared inputs (required, optional, hidden): ComfyUI passes
    a prompt's linked inputs whether the node declares them or not."""
    spec = getattr(cls, "INPUT_TYPES")() if spec is None else spec  # noqa: B009 - every node class has it
    declared = {name for section in ("required", "optional", "hidden") for name in spec.get(section, {})}
    unknown = sorted(str(name) for name in names if name != "self" and name not in declared)
    if unknown:
        raise NodeInputError(
            f"{cls.__name__}: {echo(unknown[0])} is not an input of this node (only its own sockets and widgets are); "
            "remove that link from the workflow"
        )


def check_inputs(
    cls: type,
    values: dict[str, Any],
    free_choices: tuple[str, ...] = (),
    spec: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Check `values` (argument name -> value) against `cls.INPUT_TYPES()` (or `spec`, already read). Optional
    inputs may be None. Names the node does not declare are refused by `checked_inputs` before this runs.

    free_choices: combo inputs whose list is a folder listing (model files): checked for type and length here, for
    existence by the model-file resolver, so a file added after the list was built still loads.
    """
    spec = getattr(cls, "INPUT_TYPES")() if spec is None else spec  # noqa: B009 - every node class has it
    node = cls.__name__
    for section in ("required", "optional"):
        for name, entry in spec.get(section, {}).items():
            if name not in values or (section == "optional" and values[name] is None):
                continue
            opts = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
            _check(f"{node}: input '{name}'", entry[0], opts, values[name], name in free_choices)


def checked_inputs(*free_choices: str) -> Callable[[F], F]:
    """Decorator for a node's FUNCTION method: check_inputs on every call before the body runs."""

    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            spec = type(self).INPUT_TYPES()  # once per call: model choices list folders
            refuse_undeclared(type(self), kwargs, spec)  # before bind: its TypeError would not name the fix
            bound = signature.bind(self, *args, **kwargs)
            check_inputs(type(self), dict(bound.arguments), free_choices, spec)
            return fn(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap


def model_names_valid(**names: Any) -> bool | str:
    """A node's VALIDATE_INPUTS body for its model-file combos (ComfyUI's name for the hook).

    ComfyUI checks a combo value against its list before a run; a workflow naming a model file that is not installed
    then only gets a red outline on the node while the rest of the prompt runs and the queue says "success". A
    VALIDATE_INPUTS that takes an input makes ComfyUI skip that check for it (execution.validate_inputs), so the node
    runs and stops the run with the pack's message (file, folder, download address: nodes/glue/paths.model_path).
    Here only the type is checked: True, or the message for a value that is not text.
    """
    for name, value in names.items():
        if not isinstance(value, str) or len(value) > STRING_MAX_CHARS:
            return f"{name} must be a model file name from its list, got {echo(value)}"
    return True
