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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .items import Item
from .report import ReportWriter, done_keys
from .run import ProgressLine, Summary, account, save_outputs

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


class RunnerWorker:
    """Ray actor body: a warm EmbeddedComfy; `run` processes one item given as bytes."""

    def __init__(self, spec: WorkerSpec) -> None:
        import os

        from .embedded import EmbeddedComfy

        extra = None
        if spec.demo:
            from .demo import DEMO_LOADER, DemoModels

            extra = {DEMO_LOADER: DemoModels}
        self.engine = EmbeddedComfy(spec.comfyui, cpu=spec.cpu, sdpa=spec.sdpa, extra_nodes=extra)
        self.pid = os.getpid()
        self._files = Path(tempfile.mkdtemp(prefix="tokenfuse_worker_"))

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
        from .run import process_item

        fixed = {nid: self.engine.stage(self._write(name, blob)) for nid, (name, blob) in constants.items()}
        local = Item(path=self._write(item.path.name, data), name=item.name, kind=item.kind)
        row, files = process_item(self.engine, prompt, slot, fixed, local)
        row["item"], row["worker"] = item.key, self.pid
        return row, files

    def _write(self, name: str, blob: bytes) -> Path:
        folder = Path(tempfile.mkdtemp(dir=self._files))
        path = folder / Path(name).name
        path.write_bytes(blob)
        return path


def connect(address: str, num_cpus: int | None = None) -> Any:
    """ray.init for `--ray ADDRESS`: "local" starts a private local cluster (never joins a stale one)."""
    try:
        import ray
    except ImportError as e:
        raise ImportError('--ray needs Ray: pip install -r requirements-scale.txt (or pip install "ray[serve]")') from e
    from ray import cloudpickle

    from . import ray_boot

    cloudpickle.register_pickle_by_value(ray_boot)
    env = {
        "worker_process_setup_hook": ray_boot.setup,
        "env_vars": {"TOKENFUSE_PACK_DIR": str(Path(__file__).absolute().parents[1])},
    }
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(
                    address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=env
                )
            else:
                ray.init(address=address, log_to_driver=False, runtime_env=env)
        except Exception:
            ray.shutdown()  # never leave a half-started local cluster behind
            raise
    return ray


class RayPool:
    """`workers` RunnerWorker actors on the cluster at `address` (module docstring); close() kills them and shuts
    down a local cluster this pool started."""

    def __init__(self, address: str, workers: int, spec: WorkerSpec) -> None:
        self.local = address == "local"
        self.actors: list[Any] = []
        self.ray = connect(address, num_cpus=max(workers, 1) if self.local else None)
        gpus = self.ray.cluster_resources().get("GPU", 0)
        num_gpus = spec.num_gpus or (1.0 if gpus >= 1 else 0.0)
        self.spec = spec
        self.actor_cls = self.ray.remote(num_gpus=num_gpus, num_cpus=spec.num_cpus, max_restarts=0)(RunnerWorker)
        try:
            self.actors = [self.actor_cls.remote(spec) for _ in range(max(workers, 1))]
        except Exception:
            self.close()
            raise

    def node_defs(self) -> dict[str, dict[str, Any]]:
        return dict(self.ray.get(self.actors[0].node_defs.remote()))

    def replace(self, actor: Any) -> Any:
        new = self.actor_cls.remote(self.spec)
        self.actors = [a for a in self.actors if a is not actor] + [new]
        return new

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.local:
            self.ray.shutdown()


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
    """Like run.run_items, on `workers` Ray actors. on_dispatch(item, actor, attempt): test hook, called after each
    submission (tests kill a worker there)."""
    ray = pool.ray
    from ray.exceptions import RayActorError, WorkerCrashedError

    started = time.perf_counter()
    report_path = output / "report.jsonl"
    finished = done_keys(report_path) if resume else set()
    writer = ReportWriter(report_path, append=resume)
    summary = Summary()
    bar = ProgressLine(len(items), enabled=progress)
    const = {nid: (p.name, p.read_bytes()) for nid, p in constants.items()}
    const_ref = ray.put(const)
    prompt_ref = ray.put(prompt)
    idle = list(pool.actors)
    queue: list[tuple[int, Item, int]] = []
    for index, item in enumerate(items, 1):
        if item.key in finished:
            summary.skipped += 1
            bar.item(index, item.name)
            bar.done("skipped (done in a previous run)")
        else:
            queue.append((index, item, 1))
    running: dict[Any, tuple[int, Item, int, Any]] = {}
    lost: dict[str, list[str]] = {}
    try:
        while queue or running:
            while queue and idle:
                index, item, attempt = queue.pop(0)
                actor = idle.pop(0)
                try:
                    data = item.path.read_bytes()
                except OSError as e:
                    row = {"item": item.key, "name": item.name, "kind": item.kind, "status": "failed"}
                    row["error"] = f"cannot read input: {e}"
                    writer.write(row)
                    bar.item(index, item.name)
                    account(summary, bar, row)
                    idle.append(actor)
                    continue
                ref = actor.run.remote(prompt_ref, slot, const_ref, item, data)
                running[ref] = (index, item, attempt, actor)
                if on_dispatch is not None:
                    on_dispatch(item, actor, attempt)
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            index, item, attempt, actor = running.pop(ref)
            bar.item(index, item.name)
            try:
                row, files = ray.get(ref)
            except (RayActorError, WorkerCrashedError) as e:
                lost.setdefault(item.key, []).append(f"attempt {attempt}: worker lost ({type(e).__name__})")
                idle.append(pool.replace(actor))
                if attempt <= retries:
                    bar.done(f"worker lost, retrying (attempt {attempt + 1})")
                    queue.insert(0, (index, item, attempt + 1))
                    continue
                row = {"item": item.key, "name": item.name, "kind": item.kind, "status": "failed"}
                row["error"], files = f"worker lost {attempt} time(s)", []
            if actor in pool.actors:
                idle.append(actor)
            row["attempts"] = attempt
            if item.key in lost:
                row["retried"] = lost[item.key]
            if row["status"] == "ok":
                row["outputs"] = save_outputs(files, output / item.name)
            writer.write(row)
            if account(summary, bar, row):
                break
    finally:
        writer.close()
    summary.seconds = time.perf_counter() - started
    log.info("TokenFuse runner (ray, %d workers): %s; report %s", len(pool.actors), summary.line(), report_path)
    return summary
