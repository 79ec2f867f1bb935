"""Model names from prompts resolve inside the model folders only (issue 13): one resolver, one folder list."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenfuse.faces.model_paths import (
    ALLOW_ABSOLUTE_ENV,
    MAX_NAME_CHARS,
    MODELS_ENV,
    ModelLookup,
    ModelPathError,
    resolve_model,
)
from tokenfuse.faces.models import ModelFileError
from tokenfuse.nodes.checks import NodeInputError
from tokenfuse.nodes.glue import env, paths

# FaceDetect's widgets besides backend and model_name, as the tests of its model names pass them
DETECT_ARGS = {
    "score_threshold": 0.5,
    "order": "left-right",
    "indices": "",
    "max_faces": 0,
    "min_face_size": 0,
    "crop_size": 128,
    "crop_factor": 1.0,
    "detect_size": 320,
    "device": "cpu",
}


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """models/ (two folders) plus a secret file beside them; the opt-in unset."""
    monkeypatch.delenv(ALLOW_ABSOLUTE_ENV, raising=False)
    a, b = tmp_path / "models" / "a", tmp_path / "models" / "b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "sub").mkdir()
    (a / "model.onnx").write_bytes(b"a")
    (b / "model.onnx").write_bytes(b"b")
    (b / "only_b.onnx").write_bytes(b"b")
    (a / "sub" / "deep.onnx").write_bytes(b"d")
    secret = tmp_path / "secret.txt"
    secret.write_text("not a model")
    return SimpleNamespace(root=tmp_path, a=a, b=b, folders=[a, b], secret=secret)


def _error(name: str, folders: list[Path], **kw: object) -> str:
    with pytest.raises(ModelPathError) as err:
        resolve_model(name, folders, ModelLookup("test model", **kw))  # type: ignore[arg-type]
    return str(err.value)


def test_names_resolve_in_folder_order(tree: SimpleNamespace) -> None:
    assert resolve_model("model.onnx", tree.folders, ModelLookup("m")) == (tree.a / "model.onnx").resolve()
    assert resolve_model("only_b.onnx", tree.folders, ModelLookup("m")) == (tree.b / "only_b.onnx").resolve()
    assert resolve_model("sub/deep.onnx", tree.folders, ModelLookup("m")) == (tree.a / "sub" / "deep.onnx").resolve()
    assert (
        resolve_model("model", tree.folders, ModelLookup("m", candidates=lambda n: (n, f"{n}.onnx"))).name
        == "model.onnx"
    )
    assert resolve_model("sub", tree.folders, ModelLookup("m", want="dir")) == (tree.a / "sub").resolve()


def test_dot_dot_escapes_are_refused(tree: SimpleNamespace) -> None:
    for name in ("../../secret.txt", "sub/../../../secret.txt", "../b/model.onnx/../../../secret.txt", ".."):
        msg = _error(name, tree.folders)
        assert str(tree.a) in msg and str(tree.b) in msg, msg  # names the folders searched
        assert str(tree.secret) not in msg
    # `..` that stays inside the folder is just a path
    assert resolve_model("sub/../model.onnx", tree.folders, ModelLookup("m")) == (tree.a / "model.onnx").resolve()


def test_absolute_paths_only_with_the_operator_opt_in(tree: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    msg = _error(str(tree.secret), tree.folders)
    assert ALLOW_ABSOLUTE_ENV in msg and "absolute path" in msg
    assert ALLOW_ABSOLUTE_ENV in _error("~/secret.txt", tree.folders)
    monkeypatch.setenv(ALLOW_ABSOLUTE_ENV, "1")
    assert resolve_model(str(tree.secret), tree.folders, ModelLookup("m")) == tree.secret.resolve()
    missing = _error(str(tree.root / "nope.onnx"), tree.folders)
    assert "not a readable file in the model folders searched" in missing and str(tree.a) in missing


def test_symlinks_leaving_the_folder_are_refused(tree: SimpleNamespace) -> None:
    (tree.a / "link.onnx").symlink_to(tree.secret)
    (tree.a / "out").symlink_to(tree.root, target_is_directory=True)
    (tree.a / "inside.onnx").symlink_to(tree.a / "model.onnx")
    for name in ("link.onnx", "out/secret.txt"):
        assert "not a readable file" in _error(name, tree.folders)
    assert resolve_model("inside.onnx", tree.folders, ModelLookup("m")) == (tree.a / "model.onnx").resolve()
    # a model folder that is itself a symlink (models on another disk) is fine
    linked = tree.root / "linked_models"
    linked.symlink_to(tree.b, target_is_directory=True)
    assert resolve_model("only_b.onnx", [linked], ModelLookup("m")) == (tree.b / "only_b.onnx").resolve()


def test_long_names_are_refused_before_any_file_access(tree: SimpleNamespace) -> None:
    msg = _error("x" * 1_000_000, tree.folders)
    assert f"the limit is {MAX_NAME_CHARS}" in msg and len(msg) < 300
    assert "x" * 100 not in msg
    assert resolve_model("model.onnx", tree.folders, ModelLookup("m"))  # a normal name still works
    assert len(_error("y" * MAX_NAME_CHARS, tree.folders)) < 600  # at the cap: looked up, echoed truncated


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_missing_and_unreadable_give_one_message(tree: SimpleNamespace) -> None:
    unreadable = tree.a / "locked.onnx"
    unreadable.write_bytes(b"x")
    unreadable.chmod(0)
    try:
        locked = _error("locked.onnx", tree.folders)
    finally:
        unreadable.chmod(0o600)
    assert locked.replace("locked", "absent") == _error("absent.onnx", tree.folders)


def test_missing_file_directory_and_bad_names_give_one_message(tree: SimpleNamespace) -> None:
    def norm(name: str) -> str:
        return _error(name, tree.folders).replace(repr(name), "NAME")

    same = {norm(n) for n in ("absent.onnx", "sub", "../../secret.txt", "a\x00b", "out/secret.txt")}
    assert len(same) == 1, same
    assert "not a readable file in the model folders searched" in same.pop()
    assert "no test model given" in _error("", tree.folders)
    assert isinstance(ModelPathError("x"), ModelFileError) and isinstance(ModelPathError("x"), FileNotFoundError)


def test_model_dirs_honour_the_override_for_every_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if env.comfy_available():
        pytest.skip("outside ComfyUI only (in ComfyUI folder_paths roots come first)")
    monkeypatch.delenv(MODELS_ENV, raising=False)
    assert paths.model_dirs("insightface") == []
    monkeypatch.setenv(MODELS_ENV, str(tmp_path))
    for kind in ("facedetection", "insightface", "facerestore_models"):
        assert paths.model_dirs(kind) == [tmp_path / kind]  # type: ignore[arg-type]
    (tmp_path / "insightface" / "models" / "pack").mkdir(parents=True)
    (tmp_path / "insightface" / "swap.onnx").write_bytes(b"x")
    (tmp_path / "insightface" / "models" / "pack" / "det_1.onnx").write_bytes(b"x")
    (tmp_path / "insightface" / "escape.onnx").symlink_to(tmp_path / "insightface" / ".." / "elsewhere.onnx")
    (tmp_path / "elsewhere.onnx").write_bytes(b"x")
    assert paths.list_models("insightface", (".onnx",)) == ["models/pack/det_1.onnx", "swap.onnx"]
    assert paths.model_path("insightface", "swap.onnx", ModelLookup("swap model")) == (
        tmp_path / "insightface" / "swap.onnx"
    )
    # links back up (a `models -> .` shortcut) are followed once: before, each level listed every file again (83
    # entries for 2 files) and two such links never finished (every /object_info walked them)
    (tmp_path / "insightface" / "again").symlink_to(".")
    (tmp_path / "insightface" / "models" / "up").symlink_to("..")
    (tmp_path / "insightface" / "models" / "pack_link").symlink_to("pack")
    assert paths.list_models("insightface", (".onnx",)) == ["models/pack/det_1.onnx", "swap.onnx"]


def test_extra_model_paths_keep_the_default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """extra_model_paths.yaml naming facerestore_models (ComfyUI loads it before custom nodes) used to hide
    ComfyUI's models/facerestore_models, where the README says to put GFPGANv1.4.pth."""
    import types

    fake = types.ModuleType("folder_paths")
    fake.models_dir = str(tmp_path / "models")  # type: ignore[attr-defined]
    shared = str(tmp_path / "shared" / "facerestore_models")
    fake.folder_names_and_paths = {"facerestore_models": ([shared], set())}  # type: ignore[attr-defined]

    def add_model_folder_path(name: str, path: str, is_default: bool = False) -> None:
        fake.folder_names_and_paths.setdefault(name, ([], set()))[0].append(path)  # type: ignore[attr-defined]

    fake.add_model_folder_path = add_model_folder_path  # type: ignore[attr-defined]
    fake.get_folder_paths = lambda name: list(fake.folder_names_and_paths[name][0])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "folder_paths", fake)
    monkeypatch.setattr(paths, "comfy_available", lambda: True)
    monkeypatch.delenv(MODELS_ENV, raising=False)
    default = tmp_path / "models" / "facerestore_models"
    assert paths.model_dirs("facerestore_models") == [Path(shared), default]  # the yaml's first, then the default
    assert paths.model_dirs("facerestore_models") == [Path(shared), default]  # registered once
    assert paths.model_dirs("facedetection") == [tmp_path / "models" / "facedetection"]
    default.mkdir(parents=True)
    (default / "GFPGANv1.4.pth").write_bytes(b"x")
    assert paths.list_models("facerestore_models", (".pth",)) == ["GFPGANv1.4.pth"]


def test_nodes_confine_every_model_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FaceDetect model_name (YuNet file, insightface pack), ScheduledFusion swap/arcface, GFPGANEnhance model."""
    import numpy as np
    import torch
    from tokenfuse.faces.types import Face, FaceSet
    from tokenfuse.nodes import NODE_CLASS_MAPPINGS
    from tokenfuse.nodes.identity import setup_swap

    monkeypatch.delenv(ALLOW_ABSOLUTE_ENV, raising=False)
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models"))
    (tmp_path / "secret.onnx").write_bytes(b"x")
    image = torch.zeros(1, 64, 64, 3)
    detect = NODE_CLASS_MAPPINGS["TokenFuseFaceDetect"]()
    args = dict(DETECT_ARGS)
    hostile = ["../../secret.onnx", str(tmp_path / "secret.onnx"), "a" * 100_000]
    for backend in ("yunet", "insightface"):
        for name in hostile:
            # a 100 000-character name stops at the node's input check (nodes/checks.py) before the resolver
            with pytest.raises((ModelPathError, NodeInputError)) as err:
                detect.detect(image, backend=backend, model_name=name, **args)
            assert str(tmp_path / "secret.onnx") not in str(err.value) or "absolute path" in str(err.value)
            assert len(str(err.value)) < 600
    for name in hostile:
        with pytest.raises(ModelPathError, match="arcface_model"):
            setup_swap(SimpleNamespace(), "none", name, None, None)
    face = Face(
        bbox=(0.0, 0.0, 32.0, 32.0),
        score=0.9,
        landmarks=np.zeros((5, 2), np.float32),
        affine=np.eye(2, 3),
        inverse=np.eye(2, 3),
        crop_size=64,
        mask=np.ones((64, 64), np.float32),
    )
    faces = FaceSet(image_size=(64, 64), faces=((face,),))
    enhance = NODE_CLASS_MAPPINGS["TokenFuseGFPGANEnhance"]()
    for name in hostile:
        with pytest.raises((ModelPathError, NodeInputError), match="face-restoration model|model_name"):
            enhance.enhance(image, faces, name, 1.0, 0.5)


def test_face_detectors_missing_models_name_file_folder_and_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 item 1 for FaceDetect / FaceTrack (one _folders): a missing insightface pack (the default buffalo_l
    or a named one) or YuNet file stops with the folder it goes in and where to get it."""
    import torch
    from tokenfuse.faces.models import ModelFileError
    from tokenfuse.nodes import NODE_CLASS_MAPPINGS

    monkeypatch.delenv(ALLOW_ABSOLUTE_ENV, raising=False)
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models"))
    (tmp_path / "models" / "insightface").mkdir(parents=True)
    detect = NODE_CLASS_MAPPINGS["TokenFuseFaceDetect"]()
    args = dict(DETECT_ARGS)
    image = torch.zeros(1, 64, 64, 3)
    buffalo = "https://github.com/deepinsight/insightface/releases/download/v0.7/buffalo_l.zip"
    for name in ("", "buffalo_l"):
        with pytest.raises(ModelFileError) as err:
            detect.detect(image, backend="insightface", model_name=name, **args)
        assert "buffalo_l" in str(err.value) and "models/insightface/models" in str(err.value), str(err.value)
        assert buffalo in str(err.value), str(err.value)
    with pytest.raises(ModelPathError) as err:
        detect.detect(image, backend="yunet", model_name="my_yunet.onnx", **args)
    assert "'my_yunet.onnx'" in str(err.value) and "models/facedetection" in str(err.value), str(err.value)
