"""`pip install .` (and `pip install git+<url>`, which builds the same way from a clone) gives a working `tokenfuse`
console script.

Offline: the wheel is built from the files git tracks (what a clone holds) with the build backend already in this
environment (setuptools, requirements-test.txt; `--no-build-isolation`), then installed with --no-deps into a new
venv that sees this environment's packages through a .pth file (the pack's requirements are not reinstalled), and
the installed command runs from a folder outside the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _source_tree(dst: Path) -> Path:
    """The tracked files (a clone's content) copied to `dst`; without git, the checkout minus local clutter."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if name and (REPO / name).is_file():
                (dst / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, dst / name)
        return dst
    clutter = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "*.egg-info", ".*_cache")
    shutil.copytree(REPO, dst, ignore=clutter, dirs_exist_ok=True)
    return dst


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(venv bin folder, wheel) with the pack installed from its wheel."""
    pytest.importorskip("setuptools", reason="the build backend (requirements-test.txt) is not installed")
    root = tmp_path_factory.mktemp("pip_install")
    src = _source_tree(root / "src")
    wheels = root / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("tokenfuse-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    bin_dir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    python = bin_dir / ("python.exe" if sys.platform == "win32" else "python")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this environment's packages (numpy, opencv, ...) without reinstalling them
    (Path(site) / "test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return bin_dir, wheel


def test_wheel_contents(installed: tuple[Path, Path]) -> None:
    """The pack's code, the runner, the service, the demo's face model and the example workflows are in; tests,
    benches, tools, docs and the frontend JS (meaningful only in a ComfyUI custom_nodes folder) are out."""
    _, wheel = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    for want in (
        "tokenfuse/__init__.py",
        "tokenfuse/__main__.py",
        "tokenfuse/runner/cli.py",
        "tokenfuse/runner/on_comfyui/server_ws.py",
        "tokenfuse/runner/core/video.py",
        "tokenfuse/runner/ray/pool.py",
        "tokenfuse/service/app.py",
        "tokenfuse/nodes/glue/ui.py",
        "tokenfuse/face_model/weights/unet.safetensors",
        "tokenfuse/devkit/face_model/MODEL_CARD.md",
        "tokenfuse/workflows/tokenfuse_face_refine_sd15_4gb.json",
    ):
        assert want in names, want
    tracked = {p.name for p in (REPO / "scheduling").glob("*.py")}
    assert {n.split("/")[-1] for n in names if n.startswith("tokenfuse/scheduling/")} == tracked
    for folder in ("tests", "bench", "tools", "docs", "web", ".github", ".ci"):
        assert not [n for n in names if n.startswith(f"tokenfuse/{folder}/")], folder
    assert "tokenfuse = tokenfuse.service.cli:main" in entry_points


def test_console_script_runs(installed: tuple[Path, Path], tmp_path: Path) -> None:
    bin_dir, _ = installed
    exe = str(bin_dir / "tokenfuse")
    top = subprocess.run([exe, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert top.returncode == 0 and "{run,serve}" in top.stdout, top.stderr[-2000:]
    run = subprocess.run([exe, "run", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--server URL" in run.stdout and "--demo" in run.stdout, run.stderr[-2000:]
    # the installed package (not the checkout) answers, and a run without ComfyUI is a clear usage error (exit 2)
    demo = subprocess.run(
        [exe, "run", "--demo", "--comfyui", str(tmp_path / "no_comfyui")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 2 and "no ComfyUI checkout found" in demo.stderr, demo.stderr[-2000:]
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import tokenfuse.runner.demo as d; print(d.PACK_DIR)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).parent.name == "site-packages" and (Path(where) / "face_model/weights").is_dir()
