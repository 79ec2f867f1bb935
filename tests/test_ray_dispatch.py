"""runner.ray_pool.dispatch on a stand-in pool (no cluster): which Ray errors lose a worker (replace it, send the job
again) and which fail one job alone. Ray's memory monitor kills a worker with OutOfMemoryError, which is not a
RayActorError: it once escaped dispatch and ended the whole run in a traceback."""

from __future__ import annotations

from typing import Any

import pytest

exceptions = pytest.importorskip("ray.exceptions", reason="Ray not installed (pip install -r requirements-scale.txt)")
from tokenfuse.runner.ray_pool import dispatch  # noqa: E402


class FakeRay:
    """ray.wait / ray.get over refs that are (job, attempt) tuples; `fail` maps (job, attempt) to an exception."""

    def __init__(self, fail: dict[tuple[str, int], BaseException]) -> None:
        self.fail = fail

    def wait(self, refs: list[Any], num_returns: int = 1) -> tuple[list[Any], list[Any]]:
        return refs[:1], refs[1:]

    def get(self, ref: Any) -> Any:
        if ref[1:] in self.fail:
            raise self.fail[ref[1:]]
        return f"{ref[1]} done"


class FakePool:
    def __init__(self, fail: dict[tuple[str, int], BaseException]) -> None:
        self.ray = FakeRay(fail)
        self.actors = ["w0", "w1"]
        self.replaced: list[str] = []

    def replace(self, actor: str) -> str:
        self.replaced.append(actor)
        self.actors = [a for a in self.actors if a != actor] + [f"{actor}'"]
        return self.actors[-1]


def _run(fail: dict[tuple[str, int], BaseException]) -> tuple[dict[str, Any], FakePool]:
    pool = FakePool(fail)
    attempts: dict[str, int] = {}

    def submit(actor: str, job: str) -> Any:
        attempts[job] = attempts.get(job, 0) + 1
        return (actor, job, attempts[job])

    outcomes = {o.job: o for o in dispatch(pool, ["a", "b", "c"], submit)}  # type: ignore[arg-type]
    assert sorted(outcomes) == ["a", "b", "c"]  # every job ends exactly once
    return outcomes, pool


@pytest.mark.parametrize(
    "error",
    [
        exceptions.OutOfMemoryError("Task was killed due to the node running low on memory."),
        exceptions.NodeDiedError("node lost"),
        exceptions.ActorDiedError(),
    ],
    ids=["oom-killed", "node died", "actor died"],
)
def test_a_lost_worker_is_replaced_and_its_job_sent_again(error: BaseException) -> None:
    outcomes, pool = _run({("b", 1): error})
    assert outcomes["b"].value == "b done" and outcomes["b"].attempt == 2 and not outcomes["b"].error
    assert len(outcomes["b"].lost) == 1 and type(error).__name__ in outcomes["b"].lost[0]
    assert len(pool.replaced) == 1 and all(o.value for o in outcomes.values())


def test_an_error_inside_the_worker_fails_that_job_alone() -> None:
    error = exceptions.RayTaskError(
        "run_item", "Traceback ...\nOSError: [Errno 28] No space left on device", OSError(28)
    )
    outcomes, pool = _run({("b", 1): error})
    assert outcomes["b"].value is None and "RayTaskError" in outcomes["b"].error
    assert outcomes["a"].value == "a done" and outcomes["c"].value == "c done"
    assert pool.replaced == []  # the worker is alive: kept
