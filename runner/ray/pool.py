"""`run --ray [ADDRESS] --workers N`: the runner's items spread over Ray actors, each holding a warm embedded
ComfyUI (one per GPU with `num_gpus=1` when the cluster has GPUs, else CPU actors).

The same command works on one machine (`--ray local` starts a private local cluster), a `ray start` cluster
(`--ray auto` or `--ray ray://host:10001`) or KubeRay. Inputs travel to the workers as bytes and outputs come back
as bytes, so workers need no shared file system. A worker that dies mid-item (killed, OOM-killed, node lost) fails
only that attempt: the item is sent again to a live worker (a replacement actor is started), up to `retries`
times, and its report row says how many attempts it took; nothing is written twice because only the driver
writes outputs and report rows. Ray is optional (requirements-scale.txt); importing this module needs no Ray.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from .cluster import _wait_exit, connect
from .worker import RunnerWorker

log = logging.getLogger("tokenfuse.runner")


class PoolSpec(Protocol):
    """What RayPool reads of a worker spec (ray.worker.WorkerSpec, core.video.CoreSpec): each worker's resources. The
    spec itself goes to the worker class's constructor."""

    @property
    def num_gpus(self) -> float: ...

    @property
    def num_cpus(self) -> float: ...


class RayPool:
    """`workers` actors of `worker_cls` (RunnerWorker: a warm embedded ComfyUI; core.video.VideoWorker: the
    ComfyUI-free video engine), each built from `spec`, on the cluster at `address` (module docstring).

    close() kills them and waits until their processes are gone (and shuts down a local cluster this pool
    started): a run that returns leaves no worker behind.
    """

    def __init__(self, address: str, workers: int, spec: PoolSpec, worker_cls: type = RunnerWorker) -> None:
        self.local = address == "local"
        self.actors: list[Any] = []
        self._idents: list[Any] = []
        self.pids: set[int] = set()
        try:
            import ray as _ray

            was_running = _ray.is_initialized()
        except ImportError:
            was_running = False
        self.ray = connect(address, num_cpus=max(workers, 1) if self.local else None)
        self.owns_cluster = self.local and not was_running
        gpus = self.ray.cluster_resources().get("GPU", 0)
        num_gpus = spec.num_gpus or (1.0 if gpus >= 1 else 0.0)
        self.spec = spec
        # every worker's temp files under one folder of the driver's (local cluster: the same machine), removed at
        # close even for workers that were killed and could not clean up
        self.scratch = Path(tempfile.mkdtemp(prefix="tokenfuse_ray_")) if self.local else None
        self.actor_cls = self.ray.remote(num_gpus=num_gpus, num_cpus=spec.num_cpus, max_restarts=0)(worker_cls)
        try:
            for _ in range(max(workers, 1)):
                self._start()
        except Exception:
            self.close()
            raise

    def _start(self) -> Any:
        actor = self.actor_cls.remote(self.spec, str(self.scratch) if self.scratch else None)
        self.actors.append(actor)
        self._idents.append(actor.ident.remote())  # its pid, collected lazily (close waits for it to exit)
        return actor

    def node_defs(self) -> dict[str, dict[str, Any]]:
        return dict(self.ray.get(self.actors[0].node_defs.remote()))

    def replace(self, actor: Any) -> Any:
        """A new worker in place of a lost one."""
        self.actors = [a for a in self.actors if a is not actor]
        return self._start()

    def _collect_pids(self) -> None:
        for ref in self._idents:
            try:
                self.pids.add(int(self.ray.get(ref, timeout=30)))
            except Exception:  # noqa: BLE001 - an actor killed before it answered: nothing to wait for
                continue
        self._idents = []

    def close(self, timeout_s: float = 60.0) -> None:
        """Kill the workers and wait until their processes have exited (local cluster: by pid; any cluster: until
        Ray reports each actor dead); then shut down a local cluster this pool started. Idempotent."""
        from ray.exceptions import GetTimeoutError

        self._collect_pids()
        actors, self.actors = self.actors, []
        try:  # scratch files first, while the workers still answer (a killed worker keeps its temp folder)
            self.ray.get([a.cleanup.remote() for a in actors], timeout=30)
        except Exception as e:  # noqa: BLE001 - a dead or stuck worker: killed below all the same
            log.debug("worker cleanup before close: %s", e)
        for a in actors:
            self.ray.kill(a, no_restart=True)
        deadline = time.monotonic() + timeout_s
        for a in actors:  # a call on a killed actor fails once Ray has seen it die
            try:
                self.ray.get(a.ident.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                log.warning("Ray worker still answering after kill")
            except GetTimeoutError:
                log.warning("Ray worker did not report dead within %.0f s", timeout_s)
            except Exception:  # noqa: BLE001 - RayActorError: dead, as wanted
                pass
        if self.owns_cluster and self.ray.is_initialized():
            self.ray.shutdown()
        if self.local:
            _wait_exit(self.pids, deadline)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
