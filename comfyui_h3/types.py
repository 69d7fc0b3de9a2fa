"""Value types that travel between the pack's nodes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backend.engine_config import EngineConfig


@dataclass(frozen=True)
class H3EngineHandle:
    """H3_ENGINE: which engine to use. Equal configs share one engine (models load once, persist across prompts)."""

    config: EngineConfig

    def engine(self):
        from .backend.engine import get_engine

        return get_engine(self.config)


@dataclass
class H3Latents:
    """H3_LATENTS: video [1, 24, T, h, w] and audio [2, 32, Ta] float32 (normalised, the reference's layout)."""

    video: torch.Tensor
    audio: torch.Tensor
    fps: int = 24


# MASK is ComfyUI's plain tensor; H3 Mask Draw notes on the one it returns the grow / feather it applied, so that H3
# Edit shapes a mask once (a tensor another node makes carries no note: H3 Edit's preset shapes it).
_MASK_SHAPING = "h3_mask_shaping"


def mark_mask_shaping(mask: torch.Tensor, grow: int, feather: int) -> torch.Tensor:
    """Note on `mask` that it was grown by `grow` / feathered by `feather` px (nothing when both are 0)."""
    if int(grow) != 0 or int(feather) > 0:
        setattr(mask, _MASK_SHAPING, (int(grow), int(feather)))
    return mask


def mask_shaping(mask) -> tuple[int, int] | None:
    """(grow, feather) H3 Mask Draw applied to this MASK, or None (not grown or feathered there)."""
    return getattr(mask, _MASK_SHAPING, None)
