"""GFPGANEnhance inside real ComfyUI (CPU): models/facerestore_models lookup through folder_paths, the restorer
wrapped in ModelPatcher and loaded by comfy.model_management, ComfyUI's progress bar, reload after an unload.

Random GFPGAN weights of the real architecture (spandrel's class), saved as .safetensors like a converted release.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenfuse.faces.types import Face, FaceSet
from tokenfuse.nodes import enhance_node
from tokenfuse.nodes.enhance_node import GFPGANEnhance
from tokenfuse.nodes.glue import paths

pytestmark = pytest.mark.integration
MODEL = "GFPGANv1.4-random.safetensors"


def _faces(crop: np.ndarray) -> FaceSet:
    affine = np.array([[2.0, 0.0, -100.0], [0.0, 2.0, -80.0]])
    face = Face(bbox=(50.0, 40.0, 306.0, 296.0), score=0.9, landmarks=np.zeros((5, 2), np.float32), affine=affine,
                inverse=np.array([[0.5, 0.0, 50.0], [0.0, 0.5, 40.0]]), crop_size=512,
                mask=np.ones((512, 512), np.float32), crop=crop)  # fmt: skip
    return FaceSet(image_size=(384, 384), faces=((face,),))


@pytest.fixture(scope="module")
def model_dir(comfy: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import folder_paths
    from spandrel.architectures.GFPGAN import GFPGAN

    root = tmp_path_factory.mktemp("facerestore_models")
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in GFPGAN(different_w=True, sft_half=True).state_dict().items()},
              str(root / MODEL))  # fmt: skip
    paths.model_dirs(paths.FACERESTORE_FOLDER)  # registers ComfyUI's own models/facerestore_models first
    folder_paths.add_model_folder_path(paths.FACERESTORE_FOLDER, str(root))
    yield root
    enhance_node._CACHE.clear()


def test_model_folder_lookup(model_dir: Path) -> None:
    import folder_paths

    dirs = paths.model_dirs(paths.FACERESTORE_FOLDER)
    assert dirs[0] == Path(folder_paths.models_dir) / "facerestore_models" and model_dir in dirs
    assert MODEL in GFPGANEnhance.INPUT_TYPES()["required"]["model_name"][0]
    assert enhance_node._model_file(MODEL) == str((model_dir / MODEL).resolve())
    with pytest.raises(
        FileNotFoundError, match=f"not a readable file in the model folders searched .*{model_dir}.*press R"
    ):
        enhance_node._model_file("GFPGANv1.3.pth")


def test_model_patcher_path_and_progress(model_dir: Path) -> None:
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.utils

    updates: list[tuple[int, int]] = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview=None, node_id=None: updates.append((value, total))
    )
    try:
        rng = np.random.default_rng(0)
        crop = np.clip(np.linspace(0, 1, 512, dtype=np.float32)[None, :, None] + rng.normal(0, 0.05, (512, 512, 3)),
                       0, 1).astype(np.float32)  # fmt: skip
        image = torch.rand(1, 384, 384, 3, generator=torch.Generator().manual_seed(0))
        crops, faces, report = GFPGANEnhance().enhance(image, _faces(crop), MODEL, 1.0, 0.5)
        assert updates and updates[-1] == (1, 1)  # one step per face through ComfyUI's ProgressBar
    finally:
        comfy.utils.set_progress_bar_global_hook(None)

    ((restorer, patcher),) = enhance_node._CACHE.values()
    assert isinstance(patcher, comfy.model_patcher.ModelPatcher) and patcher.model is restorer.module
    assert any(lm.model is patcher for lm in mm.current_loaded_models), "not loaded through load_model_gpu"
    assert "GFPGAN" in report and "cpu float32" in report
    assert crops.shape == (1, 512, 512, 3) and torch.isfinite(crops).all()
    first = faces.faces[0][0].crop
    assert np.abs(first - crop).mean() > 0.01

    mm.unload_all_models()  # what ComfyUI does when a diffusion model needs the memory
    assert not any(lm.model is patcher for lm in mm.current_loaded_models)
    _, faces2, _ = GFPGANEnhance().enhance(image, _faces(crop), MODEL, 1.0, 0.5)
    assert any(lm.model is patcher for lm in mm.current_loaded_models), "not reloaded after an unload"
    np.testing.assert_array_equal(faces2.faces[0][0].crop, first)
