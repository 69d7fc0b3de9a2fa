"""Hard cuts in a clip, so SeedVR2's batches never span one: frames on both sides of a cut restored in one batch
attend to each other in time, and a cross-fade over the cut blends two shots (the popular pack's #307).

Detection is cheap and runs on the host's uint8 frames before any work: each frame is sampled on a grid of about
36x64 pixels (strided, no resize of the full frame) and pooled to a 9x16 colour thumbnail; a cut is where the mean
absolute difference of consecutive thumbnails is both large in absolute terms (> CUT_LEVEL of the 0..255 range) and
several times (CUT_RATIO) the differences around it. The second test keeps fast motion, flashes of noise and a
clip of random frames (every difference large alike) from reading as cuts; it is the usual content-change rule of
shot detectors, kept small.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

CUT_LEVEL = 0.12  # mean |thumbnail difference| / 255 below which two frames are the same shot
CUT_RATIO = 3.0  # and how many times the neighbourhood's median difference a cut must be
NEIGHBOURS = 8  # frames each side whose differences make that median
_GRID = (36, 64)  # rows, columns sampled from each frame
_POOL = 4  # the sampled grid pooled by this to the thumbnail (9x16)


def thumbnails(frames: torch.Tensor) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> float32 [F, 3, h, w] in 0..1: a small, pooled picture of each frame."""
    f, h, w, _ = frames.shape
    sy, sx = max(1, h // _GRID[0]), max(1, w // _GRID[1])
    grid = frames[:, ::sy, ::sx, :].permute(0, 3, 1, 2).float() / 255.0
    pool = max(1, min(_POOL, grid.shape[2], grid.shape[3]))
    return torch.nn.functional.avg_pool2d(grid, pool, ceil_mode=True)


def frame_differences(frames) -> torch.Tensor:
    """float32 [F - 1]: the mean absolute difference (0..1) of each frame's thumbnail with the one before. `frames`:
    a uint8 tensor [F, H, W, 3] or a source read in chunks (media/planned_frames.py: one pass over its file)."""
    if frames.shape[0] < 2:
        return torch.zeros(0)
    chunks = frames.chunks() if hasattr(frames, "chunks") else frames.split(64)
    thumbs = torch.cat([thumbnails(chunk) for chunk in chunks])
    return (thumbs[1:] - thumbs[:-1]).abs().mean(dim=(1, 2, 3))


def find_cuts(frames) -> List[int]:
    """The frames that start a new shot (index c: frames c - 1 and c are in different shots), in order."""
    diffs = frame_differences(frames)
    cuts = []
    for i, d in enumerate(diffs.tolist()):
        if d <= CUT_LEVEL:
            continue
        around = torch.cat([diffs[max(0, i - NEIGHBOURS):i], diffs[i + 1:i + 1 + NEIGHBOURS]])
        # With no neighbours (a two-frame clip) the absolute level alone decides.
        if around.numel() == 0 or d > CUT_RATIO * float(around.median()):
            cuts.append(i + 1)
    return cuts


def shots(frames: int, cuts: List[int]) -> List[Tuple[int, int]]:
    """(start, stop) of each shot of a clip of `frames` frames cut at `cuts`."""
    edges = [0] + [c for c in cuts if 0 < c < frames] + [frames]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]
