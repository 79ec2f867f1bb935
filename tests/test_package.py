"""Packaging and architecture rules that keep the pack installable and layered."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10, which the pack supports (requires-python): the tomli backport, these tests skipped without it
    tomllib = pytest.importorskip("tomli", reason="Python 3.10 reads pyproject.toml with tomli (pip install tomli)")

REPO = Path(__file__).resolve().parents[1]
PACK_DIRS = ("nodes", "scheduling", "faces", "fusion", "video")
PURE_DIRS = ("scheduling", "faces", "fusion", "video")
COMFY_ROOTS = {
    "comfy",
    "comfy_extras",
    "comfy_api",
    "comfy_execution",
    "folder_paths",
    "server",
    "nodes",
    "node_helpers",
    "latent_preview",
    "execution",
}


def _requirement_names(lines: list[str]) -> list[str]:
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _pack_files() -> list[Path]:
    files = [REPO / "__init__.py"]
    for d in PACK_DIRS:
        files += sorted((REPO / d).rglob("*.py"))
    return files


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(level, module, lineno) for every import statement in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(0, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", node.lineno))
    return out


def test_requirements_equal_project_dependencies() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    reqs = _requirement_names((REPO / "requirements.txt").read_text(encoding="utf-8").splitlines())
    assert reqs == pyproject["project"]["dependencies"]


def test_torch_is_never_a_requirement() -> None:
    reqs = _requirement_names((REPO / "requirements.txt").read_text(encoding="utf-8").splitlines())
    names = [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs]
    assert not {"torch", "torchvision", "torchaudio"} & set(names)


def test_pyproject_registry_fields() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    assert project["name"] == "tokenfuse"
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    # PEP 639: an SPDX expression and the licence file; setuptools drops the table form on 2027-02-18 and refuses
    # licence classifiers next to an expression. The Comfy registry and ComfyUI's reader take the string as text.
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").is_file()
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]
    assert project["classifiers"]
    assert pyproject["tool"]["comfy"]["PublisherId"]
    assert pyproject["tool"]["comfy"]["DisplayName"] == "TokenFuse"


@pytest.mark.parametrize("path", _pack_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_pack_uses_relative_imports_only(path: Path) -> None:
    """ComfyUI loads the pack under a path-derived name; `import nodes` would even pick up ComfyUI's own module."""
    for level, module, lineno in _imports(path):
        root = module.split(".")[0]
        assert not (level == 0 and root in set(PACK_DIRS) | {"tokenfuse"}), f"{path}:{lineno} absolute pack import"


@pytest.mark.parametrize(
    "path", [p for d in PURE_DIRS for p in sorted((REPO / d).rglob("*.py"))], ids=lambda p: str(p.relative_to(REPO))
)
def test_core_layers_never_import_comfyui(path: Path) -> None:
    for level, module, lineno in _imports(path):
        root = module.split(".")[0]
        assert level > 0 or root not in COMFY_ROOTS, f"{path}:{lineno} imports {module}"
        if level > 0:
            assert root not in ("nodes",), f"{path}:{lineno} core imports the node layer"


def test_only_the_glue_module_touches_comfy() -> None:
    offenders = []
    for path in sorted((REPO / "nodes").rglob("*.py")):
        if path.parent.name == "glue":
            continue
        for level, module, lineno in _imports(path):
            if level == 0 and module.split(".")[0] in COMFY_ROOTS:
                offenders.append(f"{path.name}:{lineno} {module}")
    assert not offenders


def test_root_import_is_light() -> None:
    """Importing the pack must not pull torch, cv2 or onnxruntime (ComfyUI imports every pack at start-up)."""
    code = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('tf_light', {str(REPO / '__init__.py')!r},"
        f" submodule_search_locations=[{str(REPO)!r}]);"
        "m = importlib.util.module_from_spec(spec); sys.modules['tf_light'] = m; spec.loader.exec_module(m);"
        "heavy = [k for k in ('torch', 'cv2', 'onnxruntime', 'comfy', 'spandrel') if k in sys.modules];"
        "assert not heavy, heavy; assert m.NODE_CLASS_MAPPINGS is not None; print(len(m.NODE_CLASS_MAPPINGS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_no_print_no_eval_no_unsafe_loading() -> None:
    bad = []
    for path in _pack_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name in {"print", "eval", "exec"}:
                    bad.append(f"{path.name}:{node.lineno} {name}()")
                if name == "load" and isinstance(fn, ast.Attribute) and getattr(fn.value, "id", "") == "torch":
                    kw = {k.arg: k.value for k in node.keywords}
                    ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                    if not ok:
                        bad.append(f"{path.name}:{node.lineno} torch.load without weights_only=True")
                if name == "load" and getattr(fn.value, "id", "") == "yaml" if isinstance(fn, ast.Attribute) else False:
                    bad.append(f"{path.name}:{node.lineno} yaml.load (use yaml.safe_load)")
    assert not bad


def test_no_subprocess_in_pack() -> None:
    for path in _pack_files():
        for _level, module, lineno in _imports(path):
            assert module.split(".")[0] not in {"subprocess", "pickle"}, f"{path}:{lineno} imports {module}"


RUNTIME_DIRS = ("scheduling", "faces", "fusion", "video", "nodes", "face_model", "runner", "service")


def _runtime_files() -> list[Path]:
    files = [REPO / "__init__.py", REPO / "__main__.py"]
    for d in RUNTIME_DIRS:
        files += sorted((REPO / d).rglob("*.py"))
    return files


def _resolved(path: Path, level: int, module: str) -> str:
    """The pack-relative dotted name an import statement in `path` names ("runner.items", "devkit.standin")."""
    if level == 0:
        return module.removeprefix("tokenfuse.") if module.split(".")[0] == "tokenfuse" else f"<external>.{module}"
    package = list(path.relative_to(REPO).parent.parts)
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, *([module] if module else [])])


@pytest.mark.parametrize("path", _runtime_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_the_pack_runs_imports_devkit(path: Path) -> None:
    """devkit/ is for tests, benches and tools: the nodes, the runner (demo, core engine), the service and the face
    model package never import it, by relative or absolute name, nor load its files by path."""
    for level, module, lineno in _imports(path):
        target = _resolved(path, level, module)
        assert target.split(".")[0] != "devkit", f"{path}:{lineno} imports {target}"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value == "devkit":
            raise AssertionError(f"{path}:{node.lineno} names the devkit folder (loads it by path?)")


def _node_classes() -> dict[str, Path]:
    """Class name -> defining module, for every class in a nodes/ module's NODE_CLASS_MAPPINGS."""
    found: dict[str, Path] = {}
    for path in sorted((REPO / "nodes").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [getattr(t, "id", "") for t in node.targets] if isinstance(node, ast.Assign) else []
            if "NODE_CLASS_MAPPINGS" in names and isinstance(node.value, ast.Dict):  # type: ignore[union-attr]
                found.update({v.id: path for v in node.value.values if isinstance(v, ast.Name)})  # type: ignore[union-attr]
    return found


def test_no_node_class_is_used_by_another_module() -> None:
    """Nodes are thin callers of the cores: no node module, runner or service module imports or calls another
    node's class (they share functions: nodes/video_fusion.py, nodes/identity.py, nodes/input_specs.py, the cores).
    nodes/__init__.py, the registry, is the one place that collects them."""
    classes = _node_classes()
    assert {"ScheduledFusion", "VideoFaceFusion", "FaceTrack"} <= set(classes)
    offenders = []
    for path in _runtime_files():
        if path == REPO / "nodes" / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.ImportFrom):
                offenders += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if a.name in classes]
            elif name in classes and classes[name] != path:
                offenders.append(f"{path.name}:{node.lineno} uses {name}")
    assert not offenders
