"""TOKEN_PLAN: where the token budget goes, made by PatchTokenize and read by the scheduler's patches.

The plan travels to the attention patches through `model_options["transformer_options"]["tokenfuse_plan"]`, so its
type must stay stable: add fields with defaults, never rename.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TokenPlan:
    """Face-importance map and per-level token budgets.

    importance: [B, H, W] float32 in [0, 1] at image resolution (or any resolution: it is resampled per level).
        1.0 = face (protected), the background floor (e.g. 0.1) = free to merge/drop.
    image_size: (H, W) of the image the plan was made for.
    budgets: per image, {level factor: kept tokens} for the latent size the plan was made for.
    uniform_tokens: per image, {level factor: tokens under uniform tokenisation}.
    protect_threshold: tokens whose importance >= this are never merged or dropped.
    """

    importance: torch.Tensor
    image_size: tuple[int, int]
    budgets: tuple[dict[int, int], ...] = field(default_factory=tuple)
    uniform_tokens: tuple[dict[int, int], ...] = field(default_factory=tuple)
    protect_threshold: float = 0.5

    def __post_init__(self) -> None:
        if self.importance.ndim != 3:
            raise ValueError(f"TokenPlan.importance must be [B, H, W], got shape {tuple(self.importance.shape)}")
        if not 0.0 < self.protect_threshold <= 1.0:
            raise ValueError(f"TokenPlan.protect_threshold must be in (0, 1], got {self.protect_threshold}")

    @property
    def batch_size(self) -> int:
        return int(self.importance.shape[0])

    def expected_reduction(self) -> float:
        """Fraction of tokens saved vs uniform tokenisation, summed over levels and images (0 when unknown)."""
        total = sum(sum(u.values()) for u in self.uniform_tokens)
        kept = sum(sum(b.values()) for b in self.budgets)
        return 0.0 if total == 0 else 1.0 - kept / total

    def level_importance(
        self, grid_h: int, grid_w: int, batch: int, device: torch.device | None = None
    ) -> torch.Tensor:
        """Importance resampled to a token grid.

        Returns [batch, grid_h * grid_w] float32. The plan's images are repeated cyclically when the sampling batch is
        larger (CFG doubles it: cond and uncond of image i share its map); area pooling keeps small faces visible
        at coarse levels by taking the max over each token's pixels.
        """
        imp = self.importance.to(device=device, dtype=torch.float32).unsqueeze(1)
        pooled = F.adaptive_max_pool2d(imp, (grid_h, grid_w)).flatten(1)
        idx = torch.arange(batch, device=pooled.device) % pooled.shape[0]
        return pooled[idx]
