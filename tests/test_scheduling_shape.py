"""scheduling/ stays in small named parts: short functions, low complexity, short files, one strategy registry.

The attention hooks were one 351-line closure factory once; these checks keep each part readable on its own, and keep
the patches free of per-strategy branches (a new strategy is a module in scheduling/strategies/, one registry entry
and its words in scheduling/vocabulary.py).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from tokenfuse.scheduling.strategies import STRATEGIES
from tokenfuse.scheduling.vocabulary import STRATEGY_LABELS, Strategy

REPO = Path(__file__).resolve().parents[1]
SCHEDULING = REPO / "scheduling"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500
MAX_COMPLEXITY = 15
# the modules that make up the U-Net and DiT hooks: they reach strategies through the registry only
HOOK_MODULES = ("patches.py", "unet_eager.py", "unet_trace.py", "unet_state.py", "unet_table.py", "compile_wrapper.py")


def _sources() -> list[Path]:
    return sorted(SCHEDULING.rglob("*.py"))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'file:line name (n lines)' of every function (nested ones too, and a closure factory with its closures)
    longer than `limit` lines, decorators and docstring included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - start + 1
            if lines > limit:
                found.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_every_function_in_scheduling_is_short() -> None:
    offenders = [hit for p in _sources() for hit in long_functions(p)]
    assert not offenders, offenders


def test_the_length_check_finds_a_long_closure(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = tmp_path / "long.py"
    src.write_text(f"def factory():\n    def inner():\n{body}\n    return inner\n", encoding="utf-8")
    assert [h.split()[1] for h in long_functions(src)] == ["factory", "inner"]
    src.write_text("def short():\n    return 1\n", encoding="utf-8")
    assert long_functions(src) == []


def test_scheduling_files_are_short() -> None:
    offenders = {
        p.name: n for p in _sources() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert not offenders, offenders


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (requirements-test.txt)")
def test_scheduling_complexity_is_low() -> None:
    """ruff's mccabe check (C901) at max-complexity 15; a closure counts towards its factory."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--select",
            "C901",
            "--config",
            f"lint.mccabe.max-complexity={MAX_COMPLEXITY}",
        ]
        + ["--output-format", "concise", "--no-cache", str(SCHEDULING)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_one_registry_covers_the_strategy_vocabulary() -> None:
    assert list(STRATEGIES) == list(get_args(Strategy)) == sorted(STRATEGY_LABELS, key=list(get_args(Strategy)).index)
    modules = {p.stem for p in (SCHEDULING / "strategies").glob("*.py") if p.stem != "__init__"}
    registered = {parts.reduce.__module__.rsplit(".", 1)[1] for parts in STRATEGIES.values()}
    assert modules == registered  # every strategy module is registered, each once
    for parts in STRATEGIES.values():  # an entry's parts come from its own module
        assert {f.__module__ for f in (parts.reduce, parts.settle, parts.action, parts.traced)} == {
            parts.reduce.__module__
        }


def strategy_names_in(path: Path) -> list[str]:
    """'file:line name' of each string literal naming a strategy (code that switches on a strategy's name)."""
    names = set(get_args(Strategy))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.name}:{node.lineno} {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_the_hooks_never_name_a_strategy(tmp_path: Path) -> None:
    offenders = [hit for name in HOOK_MODULES for hit in strategy_names_in(SCHEDULING / name)]
    assert not offenders, offenders
    branch = tmp_path / "branch.py"
    branch.write_text('def f(s):\n    return s.strategy == "tome"\n', encoding="utf-8")
    assert strategy_names_in(branch) == ["branch.py:2 tome"]
