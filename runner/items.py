"""Runner inputs: expand images / folders / videos / list files into items, and bind them to the workflow's
LoadImage / LoadVideo nodes by name.

A loader node is named by its node id, its title, the stem of the file it loads in the saved workflow
(`portrait` for portrait.png) or its kind (`image`, `video`) when only one loader of that kind is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..faces.model_paths import WINDOWS_DEVICE_NAMES
from .errors import WorkflowError

IMAGE_EXTS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"})
VIDEO_EXTS = frozenset({".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v"})
LIST_EXTS = frozenset({".txt", ".lst", ".list"})
# Names an item's output folder must not take: the runner's own entries in the output folder (run.py REPLACED, the
# report) and Windows' device names (a folder `NUL` cannot be made there).
RESERVED_NAMES = frozenset({".replaced", "report.jsonl"}) | WINDOWS_DEVICE_NAMES
ItemKind = Literal["image", "video"]
# loader class -> (input holding the file name, kind of file it takes)
LOADERS: dict[str, tuple[str, ItemKind]] = {
    "LoadImage": ("image", "image"),
    "LoadImageMask": ("image", "image"),
    "LoadVideo": ("file", "video"),
}


@dataclass(frozen=True)
class Item:
    """One unit of work: a file, the name its outputs are filed under, and its kind."""

    path: Path
    name: str
    kind: ItemKind

    @property
    def key(self) -> str:
        """Identity in the JSONL report (what --resume matches)."""
        return str(self.path)


def kind_of(path: Path) -> ItemKind | None:
    ext = path.suffix.lower()
    return "image" if ext in IMAGE_EXTS else "video" if ext in VIDEO_EXTS else None


def folder_stem(path: Path) -> str:
    """The file's stem as an output folder name: `...png`'s stem `..` would file into the output's parent, `..png`'s
    `.` into the output folder itself; Windows drops a folder name's trailing dots and spaces (`a..png` would share
    `a.png`'s folder) and refuses device names (`nul.png`)."""
    stem = path.stem.rstrip(" .") or "item"
    head, dot, rest = stem.partition(".")
    if head.rstrip(" ").casefold() in WINDOWS_DEVICE_NAMES:  # Windows reads `nul.x` (and `nul .x`) as NUL: mark the
        return f"{head}_{dot}{rest}"  # part before the first dot (`nul.x_` would still be the device)
    return f"{stem}_" if stem.casefold() in RESERVED_NAMES else stem


def expand(sources: list[str | Path], known: dict[str, str] | None = None) -> list[Item]:
    """Images and videos as given, folders as their sorted images/videos (not recursive), list files (.txt) as one
    path per line (relative to the list; blank lines and # comments skipped). Missing paths raise WorkflowError;
    unknown extensions inside a folder are skipped, given explicitly they raise.

    known: item key -> output name from an earlier run's report (`--resume`): those items keep their names, and no
    other item gets one of them (a stem added since would otherwise take a finished item's folder)."""
    paths: list[Path] = []
    for src in sources:
        p = Path(src).expanduser()
        if p.is_dir():
            paths += sorted(f for f in p.iterdir() if f.is_file() and kind_of(f) is not None)
        elif p.is_file() and p.suffix.lower() in LIST_EXTS:
            try:
                text = p.read_text(encoding="utf-8-sig")  # a BOM (Notepad, PowerShell) is not part of the first path
            except UnicodeDecodeError as exc:
                raise WorkflowError(f"list file {p} is not UTF-8 text ({exc.reason}): save it as UTF-8") from exc
            for line in text.splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    q = Path(line).expanduser()
                    paths.append(q if q.is_absolute() else p.parent / q)
        else:
            paths.append(p)
    items: list[Item] = []
    known = known or {}
    reserved = {name.casefold() for name in known.values()}
    taken: set[str] = set()  # case-folded: a.png and A.png share a folder on macOS and Windows
    for p in paths:
        if not p.is_file():
            raise WorkflowError(f"input not found: {p}")
        kind = kind_of(p)
        if kind is None:
            raise WorkflowError(
                f"not an image or video file: {p} (images: {sorted(IMAGE_EXTS)}, videos: {sorted(VIDEO_EXTS)})"
            )
        name = known.get(str(p.resolve()), "")
        if not name or name.casefold() in taken:
            stem = folder_stem(p)
            name, n = stem, 1
            while name.casefold() in taken | reserved:  # a repeated stem gets _2, _3, ...: never another's name
                n += 1
                name = f"{stem}_{n}"
        taken.add(name.casefold())
        items.append(Item(path=p.resolve(), name=name, kind=kind))
    return items


def loaders(prompt: dict[str, dict[str, Any]]) -> dict[str, tuple[str, ItemKind]]:
    """node id -> (file input name, kind) for every loader node in an API prompt."""
    return {nid: LOADERS[n["class_type"]] for nid, n in prompt.items() if n["class_type"] in LOADERS}


def _names(nid: str, node: dict[str, Any], field: str) -> set[str]:
    names = {nid, str((node.get("_meta") or {}).get("title", "")).lower()}
    value = node["inputs"].get(field)
    if isinstance(value, str) and value:
        names.add(Path(value.split(" [")[0]).stem.lower())
    return names - {""}


def resolve(prompt: dict[str, dict[str, Any]], key: str, exclude: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    """The node id of the loader named `key` (module docstring); WorkflowError listing the choices otherwise."""
    found = loaders(prompt)
    hits = [nid for nid, (field, _) in found.items() if key.lower() in _names(nid, prompt[nid], field)]
    if not hits:
        hits = [nid for nid, (_, kind) in found.items() if kind == key.lower() and nid not in exclude]
    if len(hits) == 1:
        return hits[0]
    choices = "; ".join(
        f"node {nid} ({prompt[nid]['class_type']}: {', '.join(sorted(_names(nid, prompt[nid], f) - {nid}))})"
        for nid, (f, _) in found.items()
    )
    what = "matches several loaders" if hits else "matches no loader"
    raise WorkflowError(f"--input {key!r} {what}; loaders in this workflow: {choices or 'none'}")


def item_slot(prompt: dict[str, dict[str, Any]], bound: set[str], key: str | None = None) -> str:
    """The loader the items go to: `key` when given, else the one loader not bound by a --input constant."""
    if key is not None:
        return resolve(prompt, key, bound)
    free = [nid for nid in loaders(prompt) if nid not in bound]
    if len(free) == 1:
        return free[0]
    if not free:
        raise WorkflowError("every loader is bound by --input: give items on the command line for one of them")
    raise WorkflowError(
        f"the workflow has {len(free)} loaders ({', '.join(free)}): bind all but one with --input NAME=FILE "
        "or choose the one the items go to with --item-input NAME"
    )
