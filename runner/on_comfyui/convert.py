"""UI-format workflow (nodes / links / widgets_values, what the editor saves) -> API-format prompt (what /prompt and
ComfyUI's executor take), from the node definitions (the `input` / `input_order` of /object_info).

The frontend's rules, reproduced: widget values are stored in the order of the definition's inputs (required, then
optional) that are widgets (INT, FLOAT, STRING, BOOLEAN, combos; not `forceInput`); an INT named `seed` /
`noise_seed` or flagged `control_after_generate` stores one extra value (the "control after generate" choice); an
input flagged `image_upload` / `video_upload` / `audio_upload` stores one extra value (the upload button). A linked
input takes the link even when a widget value is stored for it. Frontend-only nodes (Note, MarkdownNote) are dropped,
Reroutes and PrimitiveNodes are resolved, muted nodes (mode 2) are dropped and bypassed nodes (mode 4) pass their
first input of the matching type through, as the frontend's graphToPrompt does.
"""

from __future__ import annotations

from typing import Any

from ..errors import WorkflowError

WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})
UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload", "animated_image_upload")
FRONTEND_ONLY = frozenset({"Note", "MarkdownNote"})
MODE_MUTED, MODE_BYPASS = 2, 4

NodeDefs = dict[str, dict[str, Any]]
"""class_type -> node info as /object_info gives it (at least `input`; `input_order` when present)."""


def is_api_prompt(data: dict[str, Any]) -> bool:
    """True for an API-format prompt ({node_id: {class_type, inputs}}), False for a UI workflow."""
    return "nodes" not in data and all(isinstance(v, dict) and "class_type" in v for v in data.values())


def _options(spec: Any) -> dict[str, Any]:
    return spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict) else {}


def _is_widget(spec: Any) -> bool:
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    if isinstance(kind, (list, tuple)):  # a combo given as its list of choices
        return True
    return isinstance(kind, str) and kind in WIDGET_TYPES and not _options(spec).get("forceInput", False)


def widget_layout(info: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The widget slots in widgets_values order: (input name or None for a frontend-only extra value, spec)."""
    inputs = info.get("input", {})
    order = info.get("input_order") or {k: list(v) for k, v in inputs.items() if isinstance(v, dict)}
    slots: list[tuple[str | None, Any]] = []
    for section in ("required", "optional"):
        specs = inputs.get(section) or {}
        for name in order.get(section, list(specs)):
            spec = specs.get(name)
            if spec is None or not _is_widget(spec):
                continue
            slots.append((name, spec))
            opts = _options(spec)
            kind = spec[0] if isinstance(spec, (list, tuple)) else spec
            if opts.get("control_after_generate") or (kind == "INT" and name in ("seed", "noise_seed")):
                slots.append((None, "control_after_generate"))
            if any(opts.get(flag) for flag in UPLOAD_FLAGS):
                slots.append((None, "upload"))
    return slots


def _widget_values(node: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    values = node.get("widgets_values")
    if isinstance(values, dict):  # some nodes save widgets by name
        return {k: v for k, v in values.items() if k in dict(widget_layout(info))}
    values = list(values or [])
    out: dict[str, Any] = {}
    for (name, _), value in zip(widget_layout(info), values, strict=False):
        if name is not None:
            out[name] = value
    return out


def ui_to_api(workflow: dict[str, Any], defs: NodeDefs) -> dict[str, dict[str, Any]]:
    """Convert a UI workflow to an API prompt. Raises WorkflowError naming any node type missing from `defs`."""
    if is_api_prompt(workflow):
        return {str(k): v for k, v in workflow.items()}
    if (workflow.get("definitions") or {}).get("subgraphs"):
        raise WorkflowError("workflows with subgraphs are not supported yet: unpack the subgraph in the editor")
    graph = _Graph(workflow)
    _refuse_missing(graph.nodes, defs)
    prompt: dict[str, dict[str, Any]] = {}
    for node_id, node in sorted(graph.nodes.items()):
        kind = node["type"]
        if (
            kind in FRONTEND_ONLY
            or kind in ("Reroute", "PrimitiveNode")
            or node.get("mode") in (MODE_MUTED, MODE_BYPASS)
        ):
            continue
        prompt[str(node_id)] = {
            "inputs": _node_inputs(graph, node, defs[kind]),
            "class_type": kind,
            "_meta": {"title": node.get("title") or defs[kind].get("display_name") or kind},
        }
    return prompt


def _refuse_missing(nodes: dict[int, dict[str, Any]], defs: NodeDefs) -> None:
    """WorkflowError naming the node types `defs` lacks (frontend-only nodes, Reroutes and PrimitiveNodes aside)."""
    missing = sorted({n["type"] for n in nodes.values() if n["type"] not in defs} - FRONTEND_ONLY - {"Reroute"})
    missing = [m for m in missing if m != "PrimitiveNode"]
    if missing:
        raise WorkflowError(
            f"node type(s) not installed in this ComfyUI: {', '.join(missing)} (the custom node pack(s) that provide "
            "them are missing or failed to load: see ComfyUI's start-up log)"
        )


def _node_inputs(graph: _Graph, node: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """A node's API inputs: its widget values, then each linked input's source (a link or a PrimitiveNode's value)."""
    inputs: dict[str, Any] = _widget_values(node, info)
    for inp in node.get("inputs") or []:
        if inp.get("link") is None:
            continue
        src = graph.source(inp["link"], inp.get("type"))
        if isinstance(src, dict):
            inputs[inp["name"]] = src["value"]
        elif src is not None:
            inputs[inp["name"]] = src
        elif not _is_widget_name(info, inp["name"]):
            inputs.pop(inp["name"], None)  # linked to a muted node: the input is absent, as in the frontend
    return inputs


class _Graph:
    """A UI workflow's nodes (by id) and links (by id), and where a link's value comes from."""

    def __init__(self, workflow: dict[str, Any]) -> None:
        self.nodes = {int(n["id"]): n for n in workflow.get("nodes", [])}
        self.links = {int(link[0]): link for link in workflow.get("links", [])}

    def source(self, link_id: int, want: str | None = None, seen: frozenset[int] = frozenset()) -> Any:
        """[node_id, slot] feeding a link, following Reroutes and bypassed nodes; {"value": v} for a PrimitiveNode;
        None for a missing origin or a muted node. seen: the links followed so far (a Reroute or bypass loop in a
        hand-edited file is an error, not a crash)."""
        if int(link_id) in seen:
            raise WorkflowError(f"link {int(link_id)} loops through Reroute or bypassed nodes back to itself")
        seen = seen | {int(link_id)}
        link = self.links.get(int(link_id))
        if link is None:
            return None
        origin, slot, kind = int(link[1]), int(link[2]), link[5] if len(link) > 5 else want
        node = self.nodes.get(origin)
        if node is None:
            return None
        if node["type"] == "Reroute":
            ins = node.get("inputs") or []
            return self.source(ins[0]["link"], kind, seen) if ins and ins[0].get("link") is not None else None
        if node["type"] == "PrimitiveNode":
            values = node.get("widgets_values") or []
            return {"value": values[0]} if values else None
        if node.get("mode") == MODE_MUTED:
            return None
        if node.get("mode") == MODE_BYPASS:
            for inp in node.get("inputs") or []:
                if inp.get("link") is not None and inp.get("type") == kind:
                    return self.source(inp["link"], kind, seen)
            return None
        return [str(origin), slot]


def _is_widget_name(info: dict[str, Any], name: str) -> bool:
    return any(slot == name for slot, _ in widget_layout(info))


def node_info(cls: type, name: str) -> dict[str, Any]:
    """The /object_info entry's `input` / `input_order` for a node class (classic or ComfyUI's v3 node API)."""
    v1 = getattr(cls, "GET_NODE_INFO_V1", None)
    if callable(v1):
        try:
            return dict(v1())
        except Exception:  # noqa: BLE001 - a v3 node that cannot describe itself: fall back to INPUT_TYPES
            pass
    inputs = getattr(cls, "INPUT_TYPES")()  # noqa: B009 - any node class; not in `type`'s attributes
    return {
        "name": name,
        "input": inputs,
        "input_order": {k: list(v) for k, v in inputs.items() if isinstance(v, dict)},
        "output": list(getattr(cls, "RETURN_TYPES", ())),
        "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
    }
