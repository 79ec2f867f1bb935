"""A Ray worker's disk use stays bounded (runner/ray/worker.WorkerFiles): an item's input goes when the item is done,
constants are written once per content, and at most two chunked videos stay staged (issue 10: a runner or a service
sends a worker thousands of items; each used to leave its bytes in the worker's scratch folder until it closed)."""

from __future__ import annotations

from pathlib import Path

from tokenfuse.runner.ray.worker import WorkerFiles, constant_key


class _Engine:
    """EmbeddedComfy's staging, on a folder: stage links a file into input/ under a unique name, unstage unlinks."""

    def __init__(self, root: Path) -> None:
        self.input = root / "input"
        self.input.mkdir()
        self.count = 0

    def stage(self, path: Path) -> str:
        self.count += 1
        name = f"{self.count:05d}_{path.name}"
        (self.input / name).symlink_to(path)
        return name

    def unstage(self, name: str) -> None:
        (self.input / name).unlink(missing_ok=True)


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_items_go_constants_stay_once(tmp_path: Path) -> None:
    engine = _Engine(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    files = WorkerFiles(engine, scratch)
    ref = constant_key("ref.png", b"face")
    names = []
    for i in range(5):
        const = files.stage(ref, "ref.png", b"face")
        item = files.stage(f"item:{i}", "photo.png", b"x" * (i + 1))
        assert (engine.input / item).read_bytes() == b"x" * (i + 1)
        names.append(const)
        files.drop(f"item:{i}")
        assert not (engine.input / item).exists()
    assert len(set(names)) == 1 and _files(scratch) == ["ref.png"]  # one copy of the constant, no item left
    assert sorted(p.name for p in engine.input.iterdir()) == [names[0]]
    assert constant_key("ref.png", b"face") != constant_key("ref.png", b"other")
    files.drop("never staged")  # nothing to do, no error


def test_at_most_two_videos_stay_staged(tmp_path: Path) -> None:
    engine = _Engine(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    files = WorkerFiles(engine, scratch, keep_videos=2)
    a = files.stage("video:a", "a.mp4", b"a", video=True)
    assert files.stage("video:a", "a.mp4", b"a", video=True) == a  # a second chunk of a: staged once
    files.stage("video:b", "b.mp4", b"b", video=True)
    files.stage("video:a", "a.mp4", b"a", video=True)  # a used again: b is now the oldest
    files.stage("video:c", "c.mp4", b"c", video=True)
    assert files.keys() == ["video:a", "video:c"] and _files(scratch) == ["a.mp4", "c.mp4"]
    assert len(list(engine.input.iterdir())) == 2
    b2 = files.stage("video:b", "b.mp4", b"b", video=True)  # a retried chunk of b brings its bytes again
    assert (engine.input / b2).read_bytes() == b"b" and files.keys() == ["video:c", "video:b"]
