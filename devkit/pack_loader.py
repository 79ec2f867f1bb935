"""Load this repository as package `tokenfuse` from scripts in bench/ and tools/.

ComfyUI imports a custom node folder by path under a name derived from it, so the pack uses relative imports only;
scripts do the same here under the fixed name `tokenfuse`. (tests/conftest.py does this for pytest.)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_pack() -> ModuleType:
    """The pack as package `tokenfuse`; reuses one already loaded (e.g. under pytest)."""
    if "tokenfuse" in sys.modules:
        return sys.modules["tokenfuse"]
    spec = importlib.util.spec_from_file_location(
        "tokenfuse", REPO / "__init__.py", submodule_search_locations=[str(REPO)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tokenfuse"] = module
    spec.loader.exec_module(module)
    return module
