"""The U-Net hooks' side of torch.compile: per compiled model call, eagerly, the frozen table the traced patches read.

`trace_table` is the `decide` and `after_call` the `after` of compile_wrapper.traced_call_wrapper (patches.py builds
it). The first model call of a (shape, step window, plan) runs eagerly, whole, while the eager patches fill that row
(unet_eager.py); the next call freezes it into {(token count, transformer index): action} with the strategy's
`action` (strategies/), and the traced calls' telemetry is replayed from the learning call's records.
"""

from __future__ import annotations

from typing import Any

from .compile_wrapper import LEARN
from .keys import DISABLED_KEY, SHALLOW_KEY
from .unet_eager import repick
from .unet_state import UnetState
from .unet_table import EAGER, Call, Row, TraceAction, runs_shallow
from .vocabulary import do_nothing


def traced_action(st: UnetState, call: Call | None) -> TraceAction:
    """What a compiled call of this table entry does: None (identity), EAGER, or the strategy's traced action."""
    if call is None or call.ratio <= 0.0 or call.fn is do_nothing:
        return None
    return st.strategy.action(call, st.schedule)


def frozen_table(st: UnetState, row: Row) -> dict[tuple[int, Any], TraceAction]:
    """A learnt row as the table the traced patches read (a held reduction wins over the row's entry); the replay
    keeps only the records of calls that will trace (eager calls record themselves)."""
    table = {
        (n_tok, t): traced_action(st, row.held.get((n_tok, t), c))
        for n_tok, by in row.calls.items()
        for t, c in by.items()
    }
    row.replay = [r for r in row.replay if table[r[0]] != EAGER]
    eager = sum(1 for a in table.values() if a == EAGER)
    if eager:
        st.warn_once(
            "compile",
            "TokenFuse: under torch.compile this schedule (strategy %s) runs %d kinds of attention call eagerly (calls "
            "its learning model call did not settle), one graph break each, which can make the compiled model slower "
            "than unpatched",
            st.schedule.strategy,
            eager,
        )
    if row.held:
        held = [f"the adaptive ratio (adaptive {st.schedule.adaptive})"] if st.schedule.adaptive > 0.0 else []
        held += [st.strategy.held] if st.strategy.held else []
        st.warn_once(
            "held",
            "TokenFuse: under torch.compile %s is chosen on the first model call of each step window and held for the "
            "window (eager chooses it every step), so compiled samples can differ slightly from eager ones",
            " and ".join(held),
        )
    return table


def trace_table(
    st: UnetState, shape: tuple[int, ...], options: dict[str, Any]
) -> dict[tuple[int, Any], Any] | str | None:
    """Once per compiled model call, eagerly, before it: the frozen table of the current row, LEARN while the eager
    patches learn it, None when the patches pass everything through."""
    st.pending = None
    if st.static_off or options.get(DISABLED_KEY):
        return None
    row = repick(st, options, list(shape)).row
    st.pending = row
    if row.frozen is None and row.learning and row.learnt:
        row.frozen, row.learning = frozen_table(st, row), False
    if row.frozen is None:
        row.learning, row.learnt, row.replay, row.held = True, False, [], {}
        return LEARN
    return row.frozen


def after_call(st: UnetState, options: dict[str, Any]) -> None:
    """After a compiled model call, eagerly: the telemetry of its traced calls (a cached step of the step cache,
    SHALLOW_KEY, ran only the shallow blocks), or whether a learning call was a whole U-Net call."""
    row = st.pending
    if row is None:
        return
    shallow = options.get(SHALLOW_KEY)
    if row.learning:
        row.learnt = shallow is None and bool(row.calls)
        return
    info, strategy = st.call.info, st.schedule.strategy
    for _, block, (label, level, q_in, q_out, kv_in, kv_out) in row.replay:
        if shallow is None or runs_shallow(block, shallow):
            st.telemetry.record(label, level, info.step, info.sigma, q_in, q_out, kv_in, kv_out, strategy)
