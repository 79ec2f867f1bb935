"""Ray worker bootstrap: load this pack as package `tokenfuse` in each worker process, as __main__.py does in the
driver, so the actor class (pickled by reference to `tokenfuse.runner.ray.pool`) can be imported there.

Self-contained on purpose (no relative imports): the driver registers this module to be pickled by value and hands
`setup` to Ray as the job's `worker_process_setup_hook`, with the pack folder in the job's env var
TOKENFUSE_PACK_DIR. The pack folder must exist at the same path on every node (one machine, a shared checkout, or
the same container image on KubeRay).
"""

from __future__ import annotations

import importlib.util
import os
import sys


def load_pack(pack_dir: str) -> None:
    if "tokenfuse" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "tokenfuse", f"{pack_dir}/__init__.py", submodule_search_locations=[pack_dir]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"TokenFuse pack not found at {pack_dir} on this Ray node")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tokenfuse"] = module
    spec.loader.exec_module(module)


def setup() -> None:
    """worker_process_setup_hook: load the pack from $TOKENFUSE_PACK_DIR."""
    load_pack(os.environ["TOKENFUSE_PACK_DIR"])
