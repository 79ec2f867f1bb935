"""video/clock.py: per-stage timing adds up where it is asked for and costs nothing where it is not."""

from __future__ import annotations

import time

from tokenfuse.video.clock import NULL_CLOCK, STAGES, StageClock


def test_stage_adds_the_time_spent_inside_it() -> None:
    clock = StageClock()
    with clock.stage("flow"):
        time.sleep(0.02)
    with clock.stage("flow"):
        time.sleep(0.01)
    assert 0.028 <= clock.seconds["flow"] < 0.5
    assert all(clock.seconds[k] == 0.0 for k in STAGES if k != "flow")
    assert abs(clock.ms_per_frame(3)["flow"] - clock.seconds["flow"] * 1000 / 3) < 1e-9


def test_timed_iteration_counts_each_next_and_the_end() -> None:
    def slow():
        for i in range(3):
            time.sleep(0.01)
            yield i

    clock = StageClock()
    assert list(clock.timed(slow(), "decode")) == [0, 1, 2]
    assert clock.seconds["decode"] >= 0.028


def test_null_clock_measures_nothing_and_passes_items_through() -> None:
    with NULL_CLOCK.stage("flow"):
        time.sleep(0.005)
    NULL_CLOCK.add("paste", 1.0)
    assert list(NULL_CLOCK.timed(iter([1, 2]), "decode")) == [1, 2]
    assert sum(NULL_CLOCK.seconds.values()) == 0.0


def test_a_thread_time_clock_counts_cpu_and_not_waiting() -> None:
    """StageClock(timer=time.thread_time) (bench/video_budget.py): a stage that sleeps costs ~nothing, one that
    computes costs its CPU time, in stages and in timed iteration alike."""

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def waiting():
        for i in range(2):
            time.sleep(0.02)
            yield i

    clock = StageClock(timer=time.thread_time)
    with clock.stage("flow"):
        time.sleep(0.05)
    with clock.stage("paste"):
        spin(0.03)
    assert list(clock.timed(waiting(), "decode")) == [0, 1]
    assert clock.seconds["flow"] < 0.01
    assert clock.seconds["decode"] < 0.01
    assert 0.029 <= clock.seconds["paste"] < 0.5
