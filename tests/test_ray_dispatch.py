"""runner/ray/dispatch.py on a stand-in pool (no cluster): which Ray errors lose a worker (replace it, send the job
again) and which fail one job alone. Ray's memory monitor kills a worker with OutOfMemoryError, which is not a
RayActorError: it once escaped dispatch and ended the whole run in a traceback."""

from __future__ import annotations

from typing import Any

import pytest

exceptions = pytest.importorskip("ray.exceptions", reason="Ray not installed (pip install -r requirements-scale.txt)")
from tokenfuse.runner.ray.dispatch import dispatch  # noqa: E402


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


def test_a_local_cluster_is_started_on_loopback_only(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Issue 34 item 7: `serve` / `run --ray local` started Ray on every interface (13 ports). ray.init gets the
    loopback node address with the dashboard off, while Ray's single-machine mode is on (without it Ray 2.60 turns
    127.0.0.1 into the routable address); the mode is restored after start. The workers read the driver's calibration
    store. tests/test_ray_core.py checks the listening sockets of a real local cluster."""
    import os

    from ray._private import ray_constants
    from tokenfuse.runner.ray import cluster

    seen: list[tuple[dict[str, Any], str | None, bool]] = []

    def init(**kw: Any) -> None:
        seen.append((kw, os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray_constants.ENABLE_RAY_CLUSTER))

    monkeypatch.setattr("ray.init", init)
    monkeypatch.setattr("ray.is_initialized", lambda: bool(seen))
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.chdir(tmp_path)  # a relative folder: the workers (another working folder) get it absolute
    monkeypatch.setenv("TOKENFUSE_CALIBRATION_DIR", "cal")
    before = ray_constants.ENABLE_RAY_CLUSTER
    cluster.connect("local", num_cpus=2)
    ((kw, env, flag),) = seen
    assert kw["_node_ip_address"] == "127.0.0.1" and kw["include_dashboard"] is False and kw["address"] == "local"
    assert env == "0" and flag is False
    assert kw["runtime_env"]["env_vars"]["TOKENFUSE_CALIBRATION_DIR"] == str(tmp_path / "cal")
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ and ray_constants.ENABLE_RAY_CLUSTER is before
