"""Joining or starting the Ray cluster for `--ray ADDRESS` (connect), and ending the processes a failed start or a
closed pool leaves behind. A local cluster listens on 127.0.0.1 only. Ray is optional; importing this module needs
no Ray.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger("tokenfuse.runner")


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

    by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value  # no type hints in Ray
    by_value(boot)
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
