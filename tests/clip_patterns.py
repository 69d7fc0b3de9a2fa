"""Small synthetic clips for the media and SeedVR2 tests: smooth drifting patterns (one shot), optionally cut."""

from __future__ import annotations

import math

import torch


def pattern(frames: int, h: int = 48, w: int = 64, cut: int | None = None) -> torch.Tensor:
    """uint8 [frames, h, w, 3]: stripes drifting a little each frame; from `cut` on, another shot (flipped,
    re-tinted)."""
    y = torch.arange(h).view(1, h, 1).float()
    x = torch.arange(w).view(1, 1, w).float()
    t = torch.arange(frames).view(-1, 1, 1).float()
    wave = 0.5 + 0.5 * torch.sin(2 * math.pi * (x / 29.0 + y / 17.0) + 0.2 * t)
    rgb = torch.stack([wave, 0.6 * wave, 1 - wave], dim=-1)
    if cut is not None:
        rgb[cut:] = rgb[cut:].flip(-1) * torch.tensor([0.2, 0.9, 0.4])
    return (rgb * 255).round().to(torch.uint8)
