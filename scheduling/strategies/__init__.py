"""The token-reduction strategies, one module each, found through one registry (`STRATEGIES`).

A strategy is the set of small functions the attention patches call (`StrategyParts`); the patches never branch on
a strategy's name. Adding one: a module here with those functions, one entry in `STRATEGIES`, and its name and label
in scheduling/vocabulary.py (`Strategy`, `STRATEGY_LABELS`; then regenerate web/lib/vocabulary.js, which the web
chart reads, with tools/gen_vocabulary_js.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..reducers import Reducer, ReduceState
from ..schedule import Schedule
from ..unet_table import Call, TraceAction
from ..vocabulary import Strategy
from . import todo, tome, topk

Settle = Callable[[ReduceState, Call, torch.Tensor, Any, float, int], Call]
Action = Callable[[Call, Schedule], TraceAction]
Traced = Callable[[Any, torch.Tensor, Any, Any, dict[str, Any]], tuple[torch.Tensor, Any, Any]]


@dataclass(frozen=True)
class StrategyParts:
    """What a strategy gives the U-Net attention patches (scheduling/unet_eager.py, unet_trace.py, patches.py).

    reduce(state, n, ctx, val, options, level, h, w, ratio, step) -> (n, ctx, val): the eager reduction of one call;
        n [B, N, C] = norm1(x), ctx / val the K/V sources (the same object as n for plain self-attention). Returns its
        inputs unchanged when it cannot reduce.
    settle(state, call, n, plan, ratio, step) -> call: the call at `ratio` with what its table row holds (`fn`, the
        eager fast path of a shared K/V, and `parts`, what a traced call needs).
    action(call, schedule) -> what a compiled call traces (None: identity, unet_table.EAGER: the eager patch).
    traced(action, n, ctx, val, options) -> (n, ctx, val): the action as plain tensor ops (traceable).
    per_step: settled anew every step (tome re-draws its partition): eager calls reduce through `reduce`, compiled
        ones hold the learning call's settlement for the step window (`held` names it in the warning).
    keeps_grid: reduced K/V are still a token grid, so a later attn1 patch that tiles them (HyperTile) still works.
    """

    reduce: Reducer
    settle: Settle
    action: Action
    traced: Traced
    per_step: bool = False
    keeps_grid: bool = True
    held: str = ""


STRATEGIES: dict[Strategy, StrategyParts] = {
    "tome": StrategyParts(
        tome.reduce, tome.settle, tome.action, tome.traced, per_step=True, held="tome's src/dst partition"
    ),
    "todo": StrategyParts(todo.reduce, todo.settle, todo.action, todo.traced),
    "topk": StrategyParts(topk.reduce, topk.settle, topk.action, topk.traced, keeps_grid=False),
}
