"""Jobs over a RayPool's workers (dispatch: one job per idle worker, a lost worker replaced and its job sent again)
and the runner's photo items that way (run_items_ray). Ray is optional; importing this module needs no Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..items import Item
from ..run import RunTarget, Summary, Workflow
from .pool import RayPool

log = logging.getLogger("tokenfuse.runner")


_END = object()


@dataclass
class Outcome:
    """One job's end in `dispatch`: its value (None when failed), the attempts it took, the worker that ran it,
    and one line per lost attempt."""

    job: Any
    attempt: int
    actor: Any
    value: Any = None
    lost: list[str] = field(default_factory=list)
    error: str = ""


def dispatch(
    pool: RayPool,
    jobs: Iterable[Any],
    submit: Callable[[Any, Any], Any],
    retries: int = 2,
    on_dispatch: Callable[[Any, Any, int], None] | None = None,
) -> Iterator[Outcome]:
    """Run jobs on the pool's workers, one job per idle worker, yielding each job's Outcome as it ends (in
    completion order). `jobs` is consumed lazily, one job whenever a worker is idle (a generator may prepare the
    next item's jobs while the workers run the current ones). submit(actor, job) -> ObjectRef. A worker that dies
    (killed, OOM-killed by Ray's memory monitor, node lost) is replaced and its job sent again, first in line, up to
    `retries` more times; another Ray error (an exception inside the worker) fails that job alone; every job ends
    exactly once.
    submit raising (e.g. an unreadable input) fails that job alone. on_dispatch(job, actor, attempt): test hook
    called after each submission."""
    from ray.exceptions import (
        NodeDiedError,
        ObjectLostError,
        OutOfMemoryError,
        RayActorError,
        RayError,
        WorkerCrashedError,
    )

    worker_lost = (RayActorError, WorkerCrashedError, OutOfMemoryError, NodeDiedError, ObjectLostError)

    idle = list(pool.actors)
    source = iter(jobs)
    queue: list[tuple[Any, int]] = []
    running: dict[Any, tuple[Any, int, Any]] = {}
    lost: dict[int, list[str]] = {}
    more = True
    while queue or running or more:
        while idle and (queue or more):
            if not queue:
                job = next(source, _END)
                if job is _END:
                    more = False
                    break
                queue.append((job, 1))
            job, attempt = queue.pop(0)
            actor = idle.pop(0)
            try:
                ref = submit(actor, job)
            except Exception as e:  # noqa: BLE001 - this job fails alone
                idle.append(actor)
                yield Outcome(job, attempt, actor, lost=lost.pop(id(job), []), error=f"{type(e).__name__}: {e}")
                continue
            running[ref] = (job, attempt, actor)
            if on_dispatch is not None:
                on_dispatch(job, actor, attempt)
        if not running:
            continue
        done, _ = pool.ray.wait(list(running), num_returns=1)
        job, attempt, actor = running.pop(done[0])
        try:
            value = pool.ray.get(done[0])
        except worker_lost as e:  # the memory monitor's kill is an OutOfMemoryError, not a RayActorError
            lost.setdefault(id(job), []).append(f"attempt {attempt}: worker lost ({type(e).__name__})")
            log.warning("Ray worker lost on attempt %d; %s", attempt, "retrying" if attempt <= retries else "giving up")
            idle.append(pool.replace(actor))
            if attempt <= retries:
                queue.insert(0, (job, attempt + 1))
                continue
            yield Outcome(job, attempt, actor, lost=lost.pop(id(job)), error=f"worker lost {attempt} time(s)")
            continue
        except RayError as e:  # an exception inside the worker's method (e.g. disk full while staging): this job only
            if actor in pool.actors:
                idle.append(actor)
            cause = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
            yield Outcome(job, attempt, actor, lost=lost.pop(id(job), []), error=f"{type(e).__name__}: {cause}")
            continue
        if actor in pool.actors:
            idle.append(actor)
        yield Outcome(job, attempt, actor, value, lost.pop(id(job), []))


def run_items_ray(pool: RayPool, workflow: Workflow, target: RunTarget, on_dispatch: Any = None) -> Summary:
    """Like run.run_items, on the pool's RunnerWorker actors (one item per idle worker; see `dispatch` for lost
    workers; a job is sent again at most twice). on_dispatch(item, actor, attempt): test hook (tests kill a worker
    there)."""
    ray = pool.ray
    prompt, slot, constants, items = workflow.prompt, workflow.slot, workflow.constants, workflow.items
    run = target.log(len(items))
    const_ref = ray.put({nid: (p.name, p.read_bytes()) for nid, p in constants.items()})
    prompt_ref = ray.put(prompt)
    todo = [(index, item) for index, item in enumerate(items, 1) if not run.skip_done(index, item)]

    def submit(actor: Any, job: tuple[int, Item]) -> Any:
        item = job[1]
        try:
            data = item.path.read_bytes()
        except OSError as e:
            raise OSError(f"cannot read input: {e}") from e
        return actor.run.remote(prompt_ref, slot, const_ref, item, data)

    try:
        for out in dispatch(pool, todo, submit, 2, on_dispatch and (lambda j, a, n: on_dispatch(j[1], a, n))):
            index, item = out.job
            if out.value is not None:
                row, files = out.value
            else:
                row = {"item": item.key, "name": item.name, "kind": item.kind, "status": "failed", "error": out.error}
                row["error"] = out.error.removeprefix("OSError: ")
                files = []
            row["attempts"] = out.attempt
            if out.lost:
                row["retried"] = out.lost
            if run.finish(index, item, row, files):
                break
    finally:
        run.end(f" (ray, {len(pool.actors)} workers)")
    return run.summary
