"""Load the repository as the package `tokenfuse`, the way ComfyUI loads a custom node folder by path.

The checkout's folder name is arbitrary (ComfyUI derives a module name from it), so tests never rely on it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_ASSETS = REPO.parent / "shared" / "assets"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# device-aware calibrations a test run stores (scheduling/calibration_store.py; servers the tests start inherit it)
os.environ.setdefault("TOKENFUSE_CALIBRATION_DIR", tempfile.mkdtemp(prefix="tokenfuse_test_calibration_"))


def _load_pack() -> None:
    if "tokenfuse" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "tokenfuse", REPO / "__init__.py", submodule_search_locations=[str(REPO)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tokenfuse"] = module
    spec.loader.exec_module(module)


_load_pack()


@pytest.fixture(autouse=True)
def device_aware_levels_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device-aware schedules (balanced) keep every level in tests instead of timing them on this loaded machine, so
    token-count assertions stay deterministic; tests/test_calibration.py measures and decides for real."""
    calibrate = sys.modules.get("tokenfuse.scheduling.calibrate")
    if calibrate is None:
        import tokenfuse.scheduling.calibrate as calibrate
    monkeypatch.setattr(calibrate, "PINNED", True)


@pytest.fixture
def allow_absolute_model_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's opt-in (TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS=1) for tests that name model files by full path."""
    monkeypatch.setenv("TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_assets() -> Path:
    if not SHARED_ASSETS.is_dir():
        pytest.skip(f"shared test assets not found at {SHARED_ASSETS} (they sit beside the checkout in CI)")
    return SHARED_ASSETS


@pytest.fixture(scope="session")
def comfyui_path() -> Path:
    path = os.environ.get("COMFYUI_PATH")
    if not path or not (Path(path) / "comfy").is_dir():
        pytest.skip("integration test: set COMFYUI_PATH to a ComfyUI checkout (CI has none)")
    return Path(path)
