"""One registry of strategies (scheduling/strategies/): it covers the vocabulary and each entry is what the patches
run."""

from __future__ import annotations

from typing import get_args

import torch
from tokenfuse.scheduling.keys import UNMERGE_KEY
from tokenfuse.scheduling.reducers import ReduceState
from tokenfuse.scheduling.schedule import Schedule, Strategy
from tokenfuse.scheduling.strategies import STRATEGIES


def test_every_strategy_has_exactly_one_registry_entry() -> None:
    assert set(STRATEGIES) == set(get_args(Strategy))


def test_reducers_shrink_what_their_strategy_names_and_share_pool_closures() -> None:
    h = w = 8
    n = torch.randn(2, h * w, 16, generator=torch.Generator().manual_seed(0))
    shapes = {}
    for strategy in get_args(Strategy):
        state = ReduceState(Schedule(strategy=strategy, ratios={8: 0.75}, protect_blocks=0))
        options: dict = {}
        q, k, v = STRATEGIES[strategy].reduce(state, n, n, n, options, 8, h, w, 0.75, 0)
        shapes[strategy] = (q.shape[1], k.shape[1], v.shape[1], UNMERGE_KEY in options)
        if strategy == "todo":  # the plan-free pooling closure is built once per (grid, kernel)
            assert state.pool_fn(h, w, 0.75) is state.pool_fn(h, w, 0.75)
    assert shapes["tome"][0] < h * w and shapes["tome"][3]  # q merged, unmerge handed to the output patch
    assert shapes["todo"] == (h * w, 16, 16, False)  # 2x2 pooling of K/V only
    assert shapes["topk"] == (h * w, 16, 16, False)  # a quarter of K/V kept
