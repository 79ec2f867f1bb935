"""What the fusion loop needs from a diffusion stack, injected (pure: never imports ComfyUI).

ComfyUI's sampler and VAE become a `FusionBackend` in nodes/glue/fusion_backend.py; the project's small face model
(face_model/torch_sampling.py) and the tests' fakes build one the same way, so the crop-batch loop (fusion/refine.py)
runs unchanged on all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .fallback import Attempt


@dataclass(frozen=True)
class CropHooks:
    """What the node adds around each crop besides sampling (frozen; all optional).

    embed(crop [S, S, 3], landmarks [5, 2] in crop pixels) -> [D] or None: ArcFace embedding for the identity
        check; compared with identity_ref when set (the swap source), else with face.embedding.
    pre_swap(crop [S, S, 3], landmarks [5, 2] in crop pixels) -> crop: identity pre-swap.
    """

    embed: Callable[[np.ndarray, np.ndarray], np.ndarray | None] | None = None
    identity_ref: np.ndarray | None = None
    pre_swap: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None


@dataclass(frozen=True)
class FusionBackend:
    """The sampler interface: what the loop needs from a diffusion stack (frozen: derive variants with
    dataclasses.replace, never assign to a built one).

    encode(pixels [B, S, S, 3] float 0..1, tiled) -> latent [B, C, S/8, S/8].
    decode(latent, tiled) -> pixels [B, S, S, 3] float 0..1.
    sample(model, latent, noise_mask [B, 1, S, S], seeds: list[int], plan: TokenPlan | None) -> latent.
    model_for(attempt) -> (model, note): the model for this attempt (scheduling off / stronger preset); note is "" or
        what could not be done (reported).
    is_oom(exc) -> bool: an out-of-memory error (fallbacks apply). is_fatal(exc) -> bool: must propagate (cancel).
    progress(): once per face, when its batch is done (fallbacks included); ComfyUI's node moves its faces x steps
        bar from the sampler callback and here only catches up (denoise 0, a failed batch).
    peak_reset()/peak_bytes(): device memory peak (None = n/a).
    memory_check(batch, side, tiled_vae) -> "" when the estimated peak of sampling `batch` crops of side x side fits
        the device's free memory, else a message with the estimate; a misfit is handled like an OOM before any work
        (so a CPU run that would swap the machine steps down the fallback chain instead).
    hooks: the crop hooks (identity pre-swap and check), a separate frozen object (CropHooks).
    """

    encode: Callable[[torch.Tensor, bool], torch.Tensor]
    decode: Callable[[torch.Tensor, bool], torch.Tensor]
    sample: Callable[..., torch.Tensor]
    model_for: Callable[[Attempt], tuple[Any, str]]
    is_oom: Callable[[BaseException], bool] = lambda exc: isinstance(exc, MemoryError)
    is_fatal: Callable[[BaseException], bool] = lambda exc: False
    progress: Callable[[], None] = lambda: None
    peak_reset: Callable[[], None] = lambda: None
    peak_bytes: Callable[[], int | None] = lambda: None
    empty_cache: Callable[[], None] = lambda: None
    memory_check: Callable[[int, int, bool], str] | None = None
    hooks: CropHooks = field(default_factory=CropHooks)


def unsampled(backend: FusionBackend) -> FusionBackend:
    """The backend for denoise 0: nothing is re-generated, so no VAE round trip (it blurs the face) and no sampling;
    the crops come back as prepared (with the identity pre-swap, if any). Latents are the pixels themselves."""
    return replace(
        backend,
        encode=lambda pixels, tiled: pixels,
        decode=lambda latent, tiled: latent,
        sample=lambda model, latent, *args, **kwargs: latent,
        model_for=lambda attempt: (None, ""),
        memory_check=None,
    )


class MemoryEstimateError(MemoryError):
    """The pre-flight estimate says this batch cannot fit in free memory; the message holds the figures."""
