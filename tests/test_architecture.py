"""The layer rules of docs/architecture.md, checked over every package of the pack.

Arrows only point down: cores -> nodes -> runner -> service. Both spellings of an import count: relative
(`from ..runner import x`) and absolute (`from tokenfuse.runner import x`, which service/ uses so Ray can pickle by
name). devkit/ serves tests, benches and tools only: nothing the pack runs imports it. That no node class is used
outside its own module, and that nothing the pack runs names devkit even by path, is checked in test_package.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_PACK = {"tests", "bench", "tools", "web", "workflows", "docs", "build", "dist"}

# package -> the packages it may import (itself always). "" is the root package (__init__.py: node mappings).
ALLOWED: dict[str, set[str]] = {
    "scheduling": set(),
    "faces": {"scheduling"},
    "fusion": {"faces", "scheduling"},
    "video": {"faces", "scheduling", "fusion"},
    "face_model": {"faces", "fusion", "scheduling"},
    "nodes": {"scheduling", "faces", "fusion", "video", "face_model"},
    "runner": {"", "scheduling", "faces", "fusion", "video", "face_model", "nodes"},
    "service": {"scheduling", "faces", "fusion", "video", "face_model", "nodes", "runner"},
    "devkit": {"", "scheduling", "faces", "fusion", "video", "face_model", "nodes", "runner", "service"},
}


def _packages() -> list[str]:
    return sorted(
        p.name
        for p in REPO.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() and p.name not in NOT_PACK and not p.name.startswith(".")
    )


def _targets(path: Path) -> list[tuple[str, int]]:
    """(top-level pack package imported, line) for every relative or `tokenfuse.*` import in the file."""
    rel = path.relative_to(REPO).with_suffix("").parts
    here = list(rel[:-1]) if rel[-1] != "__init__" else list(rel[:-1])
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            full = base + (node.module.split(".") if node.module else [])
            names.append(full[0] if full else "")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tokenfuse":
            parts = (node.module or "").split(".")
            names.append(parts[1] if len(parts) > 1 else "")
        elif isinstance(node, ast.Import):
            names += [a.name.split(".")[1] for a in node.names if a.name.startswith("tokenfuse.")]
        out += [(n, node.lineno) for n in names]
    return out


def test_every_package_has_a_rule() -> None:
    missing = [p for p in _packages() if p not in ALLOWED]
    assert not missing, f"add {missing} to ALLOWED (and to docs/architecture.md's picture)"


@pytest.mark.parametrize("package", _packages())
def test_imports_point_down(package: str) -> None:
    allowed = ALLOWED.get(package, set()) | {package}
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for target, line in _targets(path):
            if target not in allowed:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {target or 'the root package'}")
    assert not bad, "\n".join(bad)


def test_the_root_package_imports_only_nodes() -> None:
    targets = {t for t, _ in _targets(REPO / "__init__.py")}
    assert targets <= {"nodes"}, targets


# runner/'s rooms (docs/architecture.md, "The runner"): room -> the other rooms it may import. Every room may import
# the shared modules at runner/'s top; the shared modules import no room, except cli.py (it starts each side) and the
# `Comfy` protocol the item loop runs on.
RUNNER_ROOMS: dict[str, set[str]] = {"on_comfyui": set(), "ray": {"on_comfyui"}, "core": {"ray"}}
RUNNER_SHARED_MAY_IMPORT = {"on_comfyui.protocol"}


def _runner_imports(path: Path) -> list[tuple[list[str], int]]:
    """(module path under runner/ as parts, line) for every import of a runner module in the file."""
    here = list(path.relative_to(REPO).with_suffix("").parts[:-1])
    out: list[tuple[list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
        full = base + (node.module.split(".") if node.module else [])
        if full[:1] != ["runner"]:
            continue
        modules = [full[1:]] if node.module else [full[1:] + [a.name] for a in node.names]
        out += [(m, node.lineno) for m in modules if m]
    return out


def test_runner_rooms_import_one_way() -> None:
    """on_comfyui/ imports no other room, ray/ only on_comfyui/, core/ only ray/; the shared modules only the Comfy
    protocol (cli.py, which starts every side, aside). A cycle between rooms (ray/ once imported the core engine's
    private chunk helpers while core/ used the Ray pool) fails here."""
    bad = []
    for path in sorted((REPO / "runner").rglob("*.py")):
        rel = path.relative_to(REPO / "runner").parts
        room = rel[0] if len(rel) > 1 else ""
        if path.name == "__init__.py" or rel == ("cli.py",):
            continue
        for parts, line in _runner_imports(path):
            target = parts[0] if parts[0] in RUNNER_ROOMS else ""
            if target in ("", room):
                continue
            ok = target in RUNNER_ROOMS[room] if room else ".".join(parts) in RUNNER_SHARED_MAY_IMPORT
            if not ok:
                bad.append(f"runner/{'/'.join(rel)}:{line} imports runner.{'.'.join(parts)}")
    assert not bad, "\n".join(bad)


MAX_LINES = 500
# TEMPORARY: the runner's reorganisation into sub-packages and the scheduling patches' split into small parts
# (issue 31) bring these two under the limit; remove each entry when that work lands.


def _pack_files() -> list[Path]:
    """Every Python file the pack ships: the root modules and each package's files (tests/, bench/, tools/... aside)."""
    files = sorted(REPO.glob("*.py"))
    for package in _packages():
        files += sorted((REPO / package).rglob("*.py"))
    return [f for f in files if f.name != "conftest.py"]


def test_no_pack_file_is_over_500_lines() -> None:
    """A file a maintainer can read in one sitting: past 500 lines a module holds more than one idea (split it by
    what the parts are for, as nodes/detector_inputs.py and nodes/peak_memory.py were split out)."""
    files = _pack_files()
    assert len(files) > 50  # the walk found the pack
    lines = {f.relative_to(REPO).as_posix(): len(f.read_text(encoding="utf-8").splitlines()) for f in files}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"
