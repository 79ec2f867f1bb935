"""The table the U-Net attention patches look calls up in: what each (token count, transformer index) does.

The hot path (issue 11): the host work of an attention call is a lookup in a `Row`, built once per (latent shape,
step window, plan) by the eager patch (unet_eager.py) and, for compiled U-Nets, frozen into the table the traced patch
reads (unet_trace.py). A strategy (strategies/) fills a `Call`'s `fn` / `parts` and turns it into a traced action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

# A traced call's action: None = identity, EAGER = the eager patch, else what the schedule's strategy traces
# (strategies/*.py: `action` builds it from a settled Call, `traced` runs it)
TraceAction = Any
EAGER = "eager"


def infer_grid(n_tokens: int, original_shape: Any) -> tuple[int, int, int] | None:
    """(level factor 8/16/32/64, grid_h, grid_w) for a token count, from the latent (…, H, W); None if no match.

    ComfyUI's stride-2 convs round up, so level k has ceil(H / 2^k) x ceil(W / 2^k) tokens.
    """
    if original_shape is None or len(original_shape) < 2:
        return None
    h, w = int(original_shape[-2]), int(original_shape[-1])
    for k in range(4):
        if h * w == n_tokens:
            return 8 << k, h, w
        h, w = (h + 1) // 2, (w + 1) // 2
    return None


def block_label(options: dict[str, Any]) -> str:
    """The telemetry label of an attention call's block, e.g. "input.1.0"."""
    block = options.get("block")
    if isinstance(block, (tuple, list)) and len(block) >= 2:
        return f"{block[0]}.{block[1]}.{options.get('block_index', 0)}"
    return str(options.get("block_index", "?"))


def runs_shallow(block: Any, shallow: tuple[int, int]) -> bool:
    """Whether a block runs in a step cache's cached step: (depth d, n output blocks) -> input < d, output >= n - d."""
    depth, n_blocks = shallow
    if not (isinstance(block, (tuple, list)) and len(block) >= 2):
        return True
    kind, index = block[0], int(block[1])
    return (kind == "input" and index < depth) or (kind == "output" and index >= n_blocks - depth)


class Call(NamedTuple):
    """What attention calls at one (token count, transformer index) do in one table row (built once, then looked up)."""

    label: str  # telemetry block label, e.g. "input.1.0"
    level: int  # 8 / 16 / 32 / 64
    h: int
    w: int
    ratio: float  # base ratio after block protection, ramp and step window (0 = identity)
    fn: Callable[[torch.Tensor], torch.Tensor] | None  # a prebuilt K/V reduction (todo): the eager fast path
    parts: Any = None  # what the strategy settled for this row (strategies/*.py `settle`), None while unsettled


@dataclass
class Row:
    """What the attention calls of one (latent shape, step window, plan) do: entries built by the eager patch, then,
    for compiled U-Nets, frozen into the table the traced patch reads."""

    calls: dict[int, dict[Any, Call | None]] = field(default_factory=dict)  # token count -> transformer index -> call
    learning: bool = False  # the eager patches are filling this row for the trace table (one model call)
    learnt: bool = False  # ... and a whole U-Net call did (not a step cache's cached step: it skips the deep blocks)
    # the learning call's telemetry records, replayed per traced call: (call key, block, (label, level, tokens...))
    replay: list[tuple[tuple[int, Any], Any, tuple[str, int, int, int, int, int]]] = field(default_factory=list)
    # under compile, adaptive ratios and per-step strategies: the learning call's reduction per call key, held for
    # the row's window
    held: dict[tuple[int, Any], Call] = field(default_factory=dict)
    frozen: dict[tuple[int, Any], TraceAction] | None = None
