"""The live `tokenfuse.stats` events a sampling run sends while it runs (web/README.md has the payload): the step, the
tokens per level and the peak memory the editor's chart draws (nodes/peak_memory.py measures it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..scheduling.keys import STEP_KEY
from ..scheduling.step_state import SamplingSteps
from .glue import ui
from .peak_memory import PeakKind

STATS_EVENT = "tokenfuse.stats"


class LiveStats:
    """Per-run state of the `tokenfuse.stats` events (web/README.md has the payload); reset by the run wrapper."""

    def __init__(self, node_id: str | None) -> None:
        self.node_id = node_id
        self.reset()

    def reset(self) -> None:
        self.step = 0
        self.steps = 0
        self.peak_mib: Callable[[], float | None] = lambda: None
        self.peak_kind: PeakKind | None = None

    def position(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Step (1-based) and step count from predict_noise(x, timestep, model_options) and its sample_sigmas."""
        self.step += 1
        options = kwargs.get("model_options", args[2] if len(args) > 2 else None) or {}
        steps = options.get("transformer_options", {}).get(STEP_KEY)
        if isinstance(steps, SamplingSteps) and steps.steps >= 1:  # the run's host-side step: no device sync
            self.steps = steps.steps
            self.step = max(1, min(steps.step + 1, self.steps))
            return
        sample_sigmas = options.get("transformer_options", {}).get("sample_sigmas")
        timestep = args[1] if len(args) > 1 else kwargs.get("timestep")
        try:
            values = [float(v) for v in sample_sigmas.reshape(-1).tolist()]
            sigma = float(timestep.reshape(-1)[0])  # type: ignore[union-attr]  # None: caught below
            self.steps = len(values) - 1
            self.step = min(range(len(values)), key=lambda i: abs(values[i] - sigma)) + 1
        except (AttributeError, TypeError, ValueError, IndexError):
            self.steps = max(self.steps, self.step)
        self.step = max(1, min(self.step, max(self.steps, 1)))

    def payload(
        self,
        telemetry: Any,
        step_time: float | None,
        final: bool = False,
        summary: str | None = None,
        status: str | None = None,
    ) -> dict[str, Any]:
        """Per-level K/V tokens per image (means over the attention calls since the last event); status on the final
        event: complete / cancelled / failed (a sampler without a per-step callback may end short of its steps)."""
        window = telemetry.drain_window()  # level -> [calls, kv_in, kv_out] since the last event (per-step aggregate)
        levels = [
            {"level": lv, "tokens_in": a[1] // a[0], "tokens_out": a[2] // a[0]}
            for lv, a in sorted(window.items())
            if a[0]
        ]
        return {
            "node": self.node_id,
            "prompt_id": ui.running_prompt_id(),
            "step": self.step,
            "steps": max(self.steps, self.step, 1),
            "step_time_s": step_time,
            "peak_mem_mb": self.peak_mib(),
            "peak_mem_kind": self.peak_kind,
            "levels": levels,
            "final": final,
            "summary": summary,
            "status": status,
        }
