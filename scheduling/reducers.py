"""The small state object that holds the token reducers' caches, and what the reducers share.

The reducers are the strategies' `reduce` functions (scheduling/strategies/, one registry): the U-Net patches look a
call up in their table, then hand the tokens to `STRATEGIES[strategy].reduce`:

    reducer(state, n, ctx, val, options, level, h, w, ratio, step) -> (n, ctx, val)

- n [B, N, C]: norm1(x) before projection (N = h * w tokens of the level's grid); ctx / val: the K/V sources, the same
  object as n for plain self-attention.
- tome merges n (and ctx/val that still hold n's tokens) and leaves the unmerge for attn1_output_patch in
  `options[UNMERGE_KEY]`; todo and topk shrink only ctx/val (K/V may have fewer tokens than Q under SDPA).
- Every reducer returns its inputs unchanged when it cannot reduce (identity is always a valid outcome).

The caches are per patched model (one `ReduceState` per build_unet_hooks call): partitions per grid and step seed,
ROI tensors per plan/grid/batch/device, and the plan-free K/V pooling closures, which are pure functions of
(grid, kernel) and are shared with the hot path's table rows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .downsample import kernel_for_ratio, kv_downsample_functions, protected_cell_tokens
from .schedule import Schedule
from .transfer import to_device

# ToMe partitions kept per patched model: one per step and tome level of a run (src/dst indices, 8 bytes per token,
# on the host and the device: 64 KiB each at SD1.5 512 /8), so the next run of the same model (a video's next frame,
# the next queue item) draws and copies none
PARTITIONS_KEPT = 64


class LRU(OrderedDict[Any, Any]):
    """A small least-recently-used map: get_or(key, make) builds a value once and keeps at most `size`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get_or(self, key: Any, make: Callable[[], Any]) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)
        return value


class PlanCache:
    """Per-level ROI tensors from a TokenPlan, computed on the host once per (plan, grid, batch) and kept per device.

    Keeps only the current plan's entries: a new plan object clears the cache (ids are never reused while held).
    """

    def __init__(self) -> None:
        self._plan: Any = None
        self._cache = LRU(32)

    def get(self, plan: Any, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        if plan is not self._plan:
            self._plan = plan
            self._cache.clear()
        return self._cache.get_or(key, make)


class ReduceState:
    """The caches the reducers share for one patched model (see module docstring)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.partitions = LRU(PARTITIONS_KEPT)
        self.plans = PlanCache()
        self.kv_fns = LRU(32)

    def roi(self, plan: Any, h: int, w: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(importance [B, N] float32 CPU, protected [B, N] bool CPU)."""

        def make() -> tuple[torch.Tensor, torch.Tensor]:
            imp = plan.level_importance(h, w, batch).cpu()
            return imp, imp >= plan.protect_threshold

        got: tuple[torch.Tensor, torch.Tensor] = self.plans.get(plan, ("roi", h, w, batch), make)
        return got

    def on_device(self, plan: Any, key: tuple[Any, ...], tensor_fn: Callable[[], Any], device: torch.device) -> Any:
        def make() -> Any:
            value = tensor_fn()
            if isinstance(value, tuple):
                return tuple(to_device(t, device) for t in value)
            return to_device(value, device)

        return self.plans.get(plan, key + (device,), make)  # the device itself: no string per call

    def plan_keep(  # noqa: PLR0913 - hot path: called per attention call with a plan (todo); a per-call argument object would allocate
        self, plan: Any, h: int, w: int, batch: int, kernel: tuple[int, int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(free_cells, full_tokens) of a plan's protected cells on `device` (downsample.protected_cell_tokens)."""
        keep: tuple[torch.Tensor, torch.Tensor] = self.on_device(
            plan,
            ("cells", h, w, batch, kernel),
            lambda: protected_cell_tokens(self.roi(plan, h, w, batch)[1], h, w, kernel),
            device,
        )
        return keep

    def topk_bonus(self, plan: Any, h: int, w: int, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
        """(ROI bonus [B, N] on `device`, protected-token count to keep at least) of a plan for top-K K/V: importance
        plus 2 on protected tokens, so they always win the top-K while the count keeps room for them."""
        imp_cpu, prot_cpu = self.roi(plan, h, w, batch)
        bonus: torch.Tensor = self.on_device(
            plan, ("bonus", h, w, batch), lambda: imp_cpu + 2.0 * prot_cpu.float(), device
        )
        return bonus, int(prot_cpu.sum(1).max())

    def plan_pool_fn(  # noqa: PLR0913 - hot path: called per attention call with a plan (todo); a per-call argument object would allocate
        self, plan: Any, h: int, w: int, batch: int, ratio: float, device: torch.device
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The plan-aware K/V pooling closure (protected cells keep full resolution), built once per (plan, grid,
        batch, kernel, device), like the plan-free `pool_fn`: no closure per call."""
        kernel = kernel_for_ratio(ratio)

        def make() -> Callable[[torch.Tensor], torch.Tensor]:
            keep = self.plan_keep(plan, h, w, batch, kernel, device)
            return kv_downsample_functions(h, w, ratio, self.schedule.pool, keep)

        fn: Callable[[torch.Tensor], torch.Tensor] = self.plans.get(
            plan, ("kvfn", h, w, batch, kernel, str(device)), make
        )
        return fn

    def pool_fn(self, h: int, w: int, ratio: float) -> Callable[[torch.Tensor], torch.Tensor]:
        """The plan-free K/V pooling closure of a grid and ratio (built once per (grid, kernel))."""
        fn: Callable[[torch.Tensor], torch.Tensor] = self.kv_fns.get_or(
            (h, w, kernel_for_ratio(ratio)), lambda: kv_downsample_functions(h, w, ratio, self.schedule.pool)
        )
        return fn


def kv_targets(
    n: torch.Tensor, ctx: Any, val: Any, fn: Callable[[torch.Tensor], torch.Tensor], n_out: torch.Tensor | None = None
) -> tuple[Any, Any]:
    """Apply a token reduction to ctx/val that still hold n's tokens [B, N, C] (another pack's attn1 patch may have
    replaced them), once when they are one object; n itself becomes n_out when given. No id(): the traced attn1 patch
    (strategies/*.py `traced`, under torch.compile) uses it too."""

    def apply(t: Any) -> Any:
        if t is n and n_out is not None:
            return n_out
        if isinstance(t, torch.Tensor) and t.ndim == 3 and t.shape[:2] == n.shape[:2]:
            return fn(t)
        return t

    new_ctx = apply(ctx)
    return new_ctx, (new_ctx if val is ctx else apply(val))


class Reducer(Protocol):
    def __call__(  # noqa: PLR0913 - hot path: the strategies' reduce, called per attention call; a per-call argument object would allocate
        self,
        state: ReduceState,
        n: torch.Tensor,
        ctx: Any,
        val: Any,
        options: dict[str, Any],
        level: int,
        h: int,
        w: int,
        ratio: float,
        step: int,
    ) -> tuple[torch.Tensor, Any, Any]: ...
