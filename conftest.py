"""pytest only (ComfyUI never imports this file): collect the repository root as a plain folder, not a package.

The checkout's folder name is arbitrary and often not a Python identifier (`ComfyUI-TokenFuse`, `tokenfuse-2`), so
pytest cannot import the root `__init__.py` as a package (it fails with "attempted relative import with no known
parent package"); tests/conftest.py loads the pack as `tokenfuse` instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent


class _RootIsAFolder:
    """A global plugin (a conftest hook would not apply to the conftest's own folder)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        if path == REPO:
            return pytest.Dir.from_parent(parent, path=path)
        return None


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_RootIsAFolder(), "tokenfuse-root-is-a-folder")
