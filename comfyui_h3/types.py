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
