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
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..items import Item
from ..run import RunLog, Summary

log = logging.getLogger("tokenfuse.runner")


@dataclass(frozen=True)
class WorkerSpec:
    """How each worker builds its embedded ComfyUI."""

    comfyui: str | None = None
    cpu: bool = False
    sdpa: bool = False
    demo: bool = False
    num_gpus: float = 0.0
    num_cpus: float = 1.0


class WorkerFiles:
    """A worker's inputs, written from the bytes the driver sends and staged in its ComfyUI's input folder.

    Constants (the same bytes for every item: a reference face, a mask) are written once per content. An item's own
    file goes as soon as the item is done (`drop`). A video under chunking stays while more of its chunks may come
    here, at most `keep_videos` of them: the oldest goes first (a retried chunk brings its bytes again). So a worker's
    disk use is bounded by a few inputs, however many items a run or a service sends it.
    engine: anything with stage(path) -> name and unstage(name) (EmbeddedComfy).
    """

    def __init__(self, engine: Any, root: Path, keep_videos: int = 2) -> None:
        self.engine, self.root, self.keep_videos = engine, root, keep_videos
        self._staged: dict[str, tuple[str, Path]] = {}  # key -> (staged name, the written file)
        self._videos: list[str] = []

    def stage(self, key: str, filename: str, blob: bytes, video: bool = False) -> str:
        """The staged name for `key` (written and staged on first use). video: counts towards keep_videos."""
        if key in self._staged:
            if video:
                self._videos.remove(key)
                self._videos.append(key)
            return self._staged[key][0]
        folder = Path(tempfile.mkdtemp(dir=self.root))
        path = folder / Path(filename).name
        path.write_bytes(blob)
        self._staged[key] = (self.engine.stage(path), path)
        if video:
            self._videos.append(key)
            while len(self._videos) > self.keep_videos:
                self.drop(self._videos[0])
        return self._staged[key][0]

    def drop(self, key: str) -> None:
        """Unstage `key` and delete its file (nothing when it is not staged)."""
        entry = self._staged.pop(key, None)
        if key in self._videos:
            self._videos.remove(key)
        if entry is not None:
            self.engine.unstage(entry[0])
            shutil.rmtree(entry[1].parent, ignore_errors=True)

    def path(self, key: str) -> Path:
        """The written file of a staged key."""
        return self._staged[key][1]

    def keys(self) -> list[str]:
        return list(self._staged)


def constant_key(name: str, blob: bytes) -> str:
    """A constant's key: its file name and content (the same bytes are written once per worker)."""
    import hashlib

    return f"const:{name}:{hashlib.sha1(blob).hexdigest()}"


class RunnerWorker:
    """Ray actor body: a warm EmbeddedComfy; `run` processes one item given as bytes."""

    def __init__(self, spec: WorkerSpec, scratch: str | None = None) -> None:
        import os

        import torch

        from ..comfy.embedded import EmbeddedComfy
        from .chunk_node import CHUNK_NODE, RunnerVideoChunk

        # float results differ in the last bits between thread counts: pinned to this worker's CPU share, any number
        # of workers (and the driver's track pass, workflow_chunks.driver_tracks) compute alike
        torch.set_num_threads(max(1, int(spec.num_cpus)))
        extra: dict[str, type] = {CHUNK_NODE: RunnerVideoChunk}
        if spec.demo:
            from ..demo import DEMO_LOADER, DemoModels

            extra[DEMO_LOADER] = DemoModels
        self._root = worker_folder("tokenfuse_worker_", scratch)
        self.engine = EmbeddedComfy(
            spec.comfyui, cpu=spec.cpu, sdpa=spec.sdpa, work_dir=self._root / "comfy", extra_nodes=extra
        )
        self.pid = os.getpid()
        self._files = self._root / "files"
        self._files.mkdir()
        self._inputs = WorkerFiles(self.engine, self._files)
        self._jobs = 0

    def ident(self) -> int:
        return self.pid

    def node_defs(self) -> dict[str, dict[str, Any]]:
        """JSON-plain (as /object_info sends them): the driver may have no ComfyUI to unpickle its types."""
        import json

        return dict(json.loads(json.dumps(self.engine.node_defs(), default=str)))

    def run(
        self,
        prompt: dict[str, dict[str, Any]],
        slot: str,
        constants: dict[str, tuple[str, bytes]],
        item: Item,
        data: bytes,
    ) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        from ..run import process_item

        fixed = {nid: self._inputs.stage(constant_key(n, b), n, b) for nid, (n, b) in constants.items()}
        self._jobs += 1
        key = f"item:{self._jobs}"
        staged = self._inputs.stage(key, item.path.name, data)
        local = Item(path=self._inputs.path(key), name=item.name, kind=item.kind)
        try:
            row, files = process_item(self.engine, prompt, slot, fixed, local, staged=staged)
        finally:
            self._inputs.drop(key)
            self.engine.clear_outputs()  # read into `files` already
        row["item"], row["worker"] = item.key, self.pid
        return row, files

    def run_chunk(
        self,
        prompt: dict[str, dict[str, Any]],
        slot: str,
        constants: dict[str, tuple[str, bytes]],
        key: str,
        data: bytes,
        filename: str,
        tracks: Any,
        chunk: Any,
        pts: list[int | None],
    ) -> tuple[bytes | None, dict[str, Any], int]:
        """One time chunk of a video workflow (runner/ray/workflow_chunks.py): prompt is the chunk prompt, key names the
        video (its bytes are staged once per worker, whatever number of its chunks run here). Returns the chunk's
        MP4 (video only; None when the prompt failed), its stats (or {"error": ...}) and this worker's pid."""
        from ..run import bind, output_name
        from .chunk_node import JOBS, ChunkJob

        names = {
            nid: self._inputs.stage(constant_key(n, b), n, b) for nid, (n, b) in constants.items() if nid in prompt
        }
        names[slot] = self._inputs.stage(key, filename, data, video=True)
        self._jobs += 1
        job = f"{prompt[_chunk_node_id(prompt)]['inputs']['job']}#{self._jobs}"  # unique: never a cached result
        out = self._files / f"chunk_{self._jobs}.mp4"
        JOBS[job] = ChunkJob(tracks, chunk, pts, out)
        try:
            staged = bind(prompt, names)
            staged[_chunk_node_id(prompt)]["inputs"]["job"] = job
            result = self.engine.execute(staged)
            if not result.ok:
                return None, {"error": result.error}, self.pid
            # the telemetry JSONL the chunk's nodes wrote, read by core.video.chunk_files
            written = [(output_name(f), f.read()) for f in result.written]
            return out.read_bytes(), {**JOBS[job].stats.counts(), "written": written}, self.pid
        finally:
            JOBS.pop(job, None)
            out.unlink(missing_ok=True)
            self.engine.clear_outputs()  # what the chunk's nodes wrote is in `written` already

    def cleanup(self) -> None:
        """Delete this worker's scratch files and its ComfyUI work folder (inputs, outputs, temp previews: all in the
        worker's folder); RayPool.close calls it before killing the actor (a killed worker's folder goes with the
        pool's scratch folder)."""
        self.engine.close()
        shutil.rmtree(self._root, ignore_errors=True)


def worker_folder(prefix: str, scratch: str | None) -> Path:
    """A worker's own temp folder: under the pool's scratch folder when this machine has it (a local cluster: the
    driver deletes that folder at close, so a worker killed mid-item leaves nothing), else the system temp folder."""
    base = Path(scratch) if scratch and Path(scratch).is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _chunk_node_id(prompt: dict[str, dict[str, Any]]) -> str:
    from .chunk_node import CHUNK_NODE

    return next(nid for nid, node in prompt.items() if node["class_type"] == CHUNK_NODE)


LOOPBACK = "127.0.0.1"
# Ray's switch for single-machine clusters (what it uses on macOS and Windows): the node's address is the loopback one
_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def local_init_args(num_cpus: int | None, runtime_env: dict[str, Any]) -> dict[str, Any]:
    """ray.init's arguments for a private local cluster: no dashboard, and every process of it on 127.0.0.1
    (`_node_ip_address`; see loopback_only for why that alone is not enough)."""
    return {
        "address": "local",
        "num_cpus": num_cpus,
        "include_dashboard": False,
        "log_to_driver": False,
        "runtime_env": runtime_env,
        "_node_ip_address": LOOPBACK,
    }


@contextmanager
def loopback_only() -> Iterator[None]:
    """While a local cluster starts: its node address is 127.0.0.1, so GCS, raylet, agents and workers listen on
    loopback only. Ray (2.60 checked) turns a loopback `_node_ip_address` into the machine's routable address and binds
    its gRPC servers on every interface unless its single-machine mode is on: that mode is read from
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER by each process it starts (set here for them) and from a constant by this one
    (imported before this runs, so set as well). Both are restored once the cluster is up."""
    import os

    from ray._private import ray_constants

    saved_env, saved_flag = os.environ.get(_SINGLE_MACHINE), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_SINGLE_MACHINE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(_SINGLE_MACHINE, None)
        else:
            os.environ[_SINGLE_MACHINE] = saved_env


def connect(address: str, num_cpus: int | None = None) -> Any:
    """ray.init for `--ray ADDRESS`: "local" starts a private local cluster (never joins a stale one) that listens on
    127.0.0.1 only, dashboard off; its workers read the driver's calibration store (scheduling/calibration_store.py)."""
    try:
        import ray
    except ImportError as e:
        raise ImportError('--ray needs Ray: pip install -r requirements-scale.txt (or pip install "ray[serve]")') from e
    from ray import cloudpickle

    from . import boot

    cloudpickle.register_pickle_by_value(boot)
    env_vars = {"TOKENFUSE_PACK_DIR": str(Path(__file__).absolute().parents[2])}
    if address == "local":  # the same machine: the same stored balanced decisions as this process, whatever its env
        env_vars.update(calibration_env())
    env = {"worker_process_setup_hook": boot.setup, "env_vars": env_vars}
    # Ray waits a fixed 30 s for a new local node to register; a loaded machine can miss that: two retries.
    for attempt in (1, 2, 3) if address == "local" else (3,):
        if ray.is_initialized():
            break
        before = _children()
        try:
            if address == "local":
                with loopback_only():
                    ray.init(**local_init_args(num_cpus, env))
            else:
                ray.init(address=address, log_to_driver=False, runtime_env=env)
        except Exception as e:
            ray.shutdown()  # never leave a half-started local cluster behind: shutdown() misses a node that failed
            _end_processes(_children() - before)  # to register (its GCS, dashboard, monitors), so end those
            if attempt == 3:
                raise
            log.warning("starting a local Ray cluster failed (%s); trying again", str(e).splitlines()[0])
    return ray


def calibration_env() -> dict[str, str]:
    """TOKENFUSE_CALIBRATION_DIR as this process resolves it (empty when it has no store folder)."""
    from ...scheduling import calibration_store

    try:
        return {calibration_store.ENV: str(calibration_store.folder().absolute())}
    except OSError:
        return {}


def _children() -> set[int]:
    """Pids of this process's direct children (Linux /proc; empty elsewhere)."""
    import os

    me, out = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            out.add(int(stat.parent.name))
    return out


def _end_processes(pids: set[int], grace_s: float = 5.0) -> None:
    """SIGTERM these processes (this process started them), SIGKILL what is left after grace_s. Windows has no
    SIGKILL and os.kill(pid, 0) would terminate there: left to ray.shutdown() (pids_of reads /proc, empty there)."""
    import os
    import signal

    if sys.platform == "win32":
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while (pids := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids:
            return


class RayPool:
    """`workers` actors of `worker_cls` (RunnerWorker: a warm embedded ComfyUI; core.video.VideoWorker: the
    ComfyUI-free video engine), each built from `spec`, on the cluster at `address` (module docstring).

    close() kills them and waits until their processes are gone (and shuts down a local cluster this pool
    started): a run that returns leaves no worker behind.
    """

    def __init__(self, address: str, workers: int, spec: Any, worker_cls: type = RunnerWorker) -> None:
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
        num_gpus = getattr(spec, "num_gpus", 0.0) or (1.0 if gpus >= 1 else 0.0)
        self.spec = spec
        # every worker's temp files under one folder of the driver's (local cluster: the same machine), removed at
        # close even for workers that were killed and could not clean up
        self.scratch = Path(tempfile.mkdtemp(prefix="tokenfuse_ray_")) if self.local else None
        self.actor_cls = self.ray.remote(num_gpus=num_gpus, num_cpus=getattr(spec, "num_cpus", 1.0), max_restarts=0)(
            worker_cls
        )
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


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its raylet) counts as gone
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _wait_exit(pids: set[int], deadline: float) -> None:
    """Wait for the pool's worker processes (this machine) to exit; end any left at the deadline."""

    left = {p for p in pids if _alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if _alive(p)}
    if left:
        log.warning("Ray worker process(es) %s still alive after close(): ending them", sorted(left))
        _end_processes(left, grace_s=2.0)


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


def run_items_ray(
    pool: RayPool,
    prompt: dict[str, dict[str, Any]],
    slot: str,
    constants: dict[str, Path],
    items: list[Item],
    output: Path,
    resume: bool = False,
    progress: bool = True,
    retries: int = 2,
    on_dispatch: Any = None,
) -> Summary:
    """Like run.run_items, on the pool's RunnerWorker actors (one item per idle worker; see `dispatch` for lost
    workers). on_dispatch(item, actor, attempt): test hook (tests kill a worker there)."""
    ray = pool.ray
    run = RunLog(output, len(items), resume, progress)
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
        for out in dispatch(pool, todo, submit, retries, on_dispatch and (lambda j, a, n: on_dispatch(j[1], a, n))):
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
