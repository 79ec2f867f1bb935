"""`python <pack folder> run ...` / `serve ...`: the command line (service/cli.py: the runner's `run` plus `serve`),
whatever the folder is called.

ComfyUI never imports this file (it imports the package's __init__.py). Run as a script, the folder is not a
package, so the pack is loaded here under the fixed name `tokenfuse` (as devkit/pack_loader.py does) and its
relative imports work.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def _pack():  # type: ignore[no-untyped-def]
    if "tokenfuse" in sys.modules:
        return sys.modules["tokenfuse"]
    root = Path(__file__).absolute().parent
    spec = importlib.util.spec_from_file_location(
        "tokenfuse", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tokenfuse"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    _pack()
    return int(importlib.import_module("tokenfuse.service.cli").main())


if __name__ == "__main__":
    sys.exit(main())
