"""The per-model state the U-Net attention hooks share: one small typed object handed to every part of the hook.

tomesd's patch.py is the model: the hook's parts are plain functions of this object (scheduling/unet_eager.py,
unet_trace.py) and the closures patches.py registers only bind it. `ModelCall` is the state that changes once per
model call (the row of the call table in force and the step), everything else lives as long as the patched model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .adaptive import LaggedComplexity
from .reducers import LRU, ReduceState
from .schedule import Schedule
from .step_tracker import StepInfo, StepTracker
from .strategies import STRATEGIES, StrategyParts
from .telemetry import RunTelemetry
from .unet_table import Row

log = logging.getLogger(__name__)

ROWS_KEPT = 16  # call-table rows per patched model: (latent shape, step window, plan) combinations


@dataclass(slots=True)
class ModelCall:
    """The objects of the model call the current row was picked for. ComfyUI makes a new `sigmas` tensor and
    `original_shape` list per model call, so comparing them by identity re-picks once per model call, not once per
    attention call."""

    shape: Any = None
    sigmas: Any = None
    sample_sigmas: Any = None
    plan: Any = None
    row: Row = field(default_factory=Row)
    info: StepInfo = StepInfo(-1, 0, 0.0, float("nan"))


class UnetState:
    """Everything one patched U-Net's attention hooks share (built once per `build_unet_hooks` call).

    schedule, telemetry: what the hooks apply and where they record it; strategy: the schedule's parts from the
    strategies registry; steps: the step of a model call; reduce_state: the reducers' caches (partitions, plan ROI
    tensors, pooling closures); complexity: the adaptive ratio's statistic (a step adapts to its previous step's:
    no device sync); rows: the call table per (latent shape, step window, plan); call: the model call in force;
    pending: the row of the compiled model call in flight (unet_trace.py); static_off: the hooks pass everything.
    """

    def __init__(self, schedule: Schedule, telemetry: RunTelemetry) -> None:
        self.schedule = schedule
        self.telemetry = telemetry
        self.strategy: StrategyParts = STRATEGIES[schedule.strategy]
        self.steps = StepTracker()
        self.reduce_state = ReduceState(schedule)
        self.complexity = LaggedComplexity()
        self.warned: set[str] = set()
        self.timing = schedule.time_calls
        self.rows = LRU(ROWS_KEPT)
        self.call = ModelCall()
        self.pending: Row | None = None
        self.static_off = schedule.is_off or not schedule.ratios

    def warn_once(self, key: str, msg: str, *args: Any) -> None:
        """Log a warning once per patched model and key."""
        if key not in self.warned:
            self.warned.add(key)
            log.warning(msg, *args)
