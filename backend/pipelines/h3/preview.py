"""Live previews while sampling: a small picture of what the denoiser is making, every few steps, for ComfyUI's
preview channel (the node shows it as KSampler previews show theirs).

Tensor contracts, stated once here:
- LatentRGB: per latent pixel, rgb = clamp(z @ weight + bias, 0, 1); z the DiT's normalised video latent channels
  [C] (C = the video VAE's latent_channels: 24 for MiniMax-H3), weight [C, 3] and bias [3] float32 on the device.
  Fitted once per engine (rank 0, when the first request asks for previews: H3Pipeline) by ridge least squares from
  the loaded VAE's own encoder: FIT_COLOURS solid-colour clips (the 27 points of the RGB cube's {0, .5, 1} grid and
  5 seeded draws) of one encoder chunk of frames at FIT_SIZE px are encoded (posterior mode, normalised as the DiT
  sees latents), and every latent cell of clip k is paired with colour k. Deterministic: same VAE, same table.
- StepPreview.capture: the clean estimate x0 = x_in + (1 - t) * v (the driver's own flow_step formula) of the
  target video rows of PREVIEW_FRAMES latent frames spread evenly over the clip (first and last included), only
  those rows; projected at the latent grid's resolution (1/16 of the pixels), each frame area-downscaled so its
  longer side is at most FRAME_MAX_SIDE, laid out in reading order on the grid whose shape is closest to one frame's
  (sheet_columns: 4 frames make 2 x 2, so the sheet has the clip's own orientation and aspect, as a KSampler preview
  has its image's; empty cells of a shorter clip are black) -> uint8 [H, W, 3] numpy on the host (48 KB at the 10-s
  1344x768 shape).
The cost per preview is a gather of ~4/T of the target rows, a 24 -> 3 matmul and a ~50 KB copy to the host;
bench/preview_cost.py measures it against a DiT step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

PREVIEW_FRAMES = 4  # latent frames on the sheet
FRAME_MAX_SIDE = 128  # px per frame on the sheet (the latent grid of a 2048-px canvas still fits)
FIT_SIZE = 64  # px of each fitting clip: a 4x4 latent grid (reflect padding at the VAE's deepest level needs > 1)
FIT_BATCH = 8  # clips per encoder call (bounds the encoder's activations on the released VAE)
FIT_SEED = 0
FIT_RIDGE = 1e-3  # relative to the mean diagonal of the normal equations: a VAE whose latents barely move still fits


def fit_colours() -> torch.Tensor:
    """The fitting colours [32, 3] float32 in 0..1: the {0, 0.5, 1}^3 grid, then 5 seeded uniform draws."""
    levels = torch.tensor([0.0, 0.5, 1.0])
    grid = torch.cartesian_prod(levels, levels, levels)
    extra = torch.rand((5, 3), generator=torch.Generator().manual_seed(FIT_SEED))
    return torch.cat([grid, extra]).float()


def ridge_fit(x: torch.Tensor, y: torch.Tensor, ridge: float = FIT_RIDGE) -> tuple[torch.Tensor, torch.Tensor]:
    """Least squares y ~ x @ w + b with a small ridge on w (not on b), in float64: x [N, C], y [N, 3] ->
    (w [C, 3], b [3]) float32."""
    x = x.double()
    x1 = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
    gram = x1.T @ x1
    reg = torch.eye(gram.shape[0], dtype=gram.dtype) * (ridge * float(gram.diagonal()[:-1].mean().clamp_min(1e-12)))
    reg[-1, -1] = 0.0
    coef = torch.linalg.solve(gram + reg, x1.T @ y.double())
    return coef[:-1].float(), coef[-1].float()


@dataclass
class LatentRGB:
    """weight [C, 3] and bias [3] float32 (the module docstring states the projection)."""

    weight: torch.Tensor
    bias: torch.Tensor

    def to(self, device) -> "LatentRGB":
        return LatentRGB(self.weight.to(device, torch.float32), self.bias.to(device, torch.float32))

    @property
    def channels(self) -> int:
        return int(self.weight.shape[0])

    @classmethod
    def fit(cls, encode: Callable[[torch.Tensor], torch.Tensor], frames: int) -> "LatentRGB":
        """`encode`: uint8 pixels [B, 3, frames, FIT_SIZE, FIT_SIZE] -> normalised latents [B, C, t, h, w] (the VAE
        encoder's posterior mode). `frames`: one encoder chunk (17 + 5 for H3's VAE)."""
        colours = fit_colours()
        xs, ys = [], []
        for start in range(0, colours.shape[0], FIT_BATCH):
            batch = colours[start:start + FIT_BATCH]
            pixels = (batch * 255.0).round().to(torch.uint8)[:, :, None, None, None]
            pixels = pixels.expand(-1, -1, frames, FIT_SIZE, FIT_SIZE).contiguous()
            latents = encode(pixels).float().cpu()  # [B, C, t, h, w]
            cells = latents.shape[2] * latents.shape[3] * latents.shape[4]
            xs.append(latents.permute(0, 2, 3, 4, 1).reshape(-1, latents.shape[1]))
            ys.append(batch.repeat_interleave(cells, dim=0))
        weight, bias = ridge_fit(torch.cat(xs), torch.cat(ys))
        return cls(weight, bias)


def strip_frames(latent_frames: int, count: int = PREVIEW_FRAMES) -> list[int]:
    """`count` latent frame indices spread evenly over [0, latent_frames), first and last included (fewer for a
    shorter clip)."""
    if latent_frames <= 0:
        return []
    if count <= 1 or latent_frames == 1:
        return [0]
    return sorted({round(i * (latent_frames - 1) / (count - 1)) for i in range(count)})


def sheet_columns(count: int, height: int, width: int) -> int:
    """Columns of the contact sheet of `count` frames of height x width (rows: as many as the frames need): the grid
    whose shape is closest to one frame's, so a landscape clip gets a landscape sheet and a portrait clip a portrait
    one (a "closest to square" sheet stacked a 2:1 clip's 4 frames into a 1 x 4 portrait strip). Ties go to fewer
    empty cells, then to the sheet that leans most the clip's way (a square clip's: wider)."""
    aspect = width / height

    def cost(cols: int) -> tuple:
        rows = -(-count // cols)
        sheet = cols * width / (rows * height)
        lean = math.log(sheet) if aspect >= 1 else -math.log(sheet)
        return round(abs(math.log(sheet / aspect)), 9), rows * cols - count, -lean

    return min(range(1, max(count, 1) + 1), key=cost)


def rows_to_frames(rows: torch.Tensor, frames: int, grid_h: int, grid_w: int, channels: int,
                   patch: tuple[int, int, int]) -> torch.Tensor:
    """Patchified rows [frames * grid_h * grid_w, C * pt * ph * pw] (layout.patchify's order) -> latent frames
    [frames, grid_h * ph, grid_w * pw, C] (the first latent frame of each temporal patch)."""
    pt, ph, pw = patch
    x = rows.reshape(frames, grid_h, grid_w, channels, pt, ph, pw)[:, :, :, :, 0]
    return x.permute(0, 1, 4, 2, 5, 3).reshape(frames, grid_h * ph, grid_w * pw, channels)


def contact_sheet(rgb: torch.Tensor, max_side: int = FRAME_MAX_SIDE) -> torch.Tensor:
    """Frames [n, H, W, 3] float 0..1 -> one uint8 image [rows * h, cols * w, 3] on the same device (sheet_columns'
    grid), each frame area-downscaled to at most `max_side` px on its longer side."""
    n, height, width, _ = rgb.shape
    if max(height, width) > max_side:
        scale = max_side / max(height, width)
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
        rgb = torch.nn.functional.interpolate(rgb.permute(0, 3, 1, 2), size=size, mode="area").permute(0, 2, 3, 1)
        height, width = size
    cols = sheet_columns(n, height, width)
    rows = -(-n // cols)
    if rows * cols > n:  # a shorter clip's empty cells stay black
        rgb = torch.cat([rgb, rgb.new_zeros((rows * cols - n, height, width, 3))])
    sheet = rgb.reshape(rows, cols, height, width, 3).permute(0, 2, 1, 3, 4).reshape(rows * height, cols * width, 3)
    return (sheet.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)


def target_grid(layout) -> tuple[int, int, int]:
    """(latent frames, patch rows, patch columns) of the layout's target video rows (patchify order: frame-major,
    then row-major), read off their rotary positions."""
    rows = layout.video_indices[layout.num_condition_video_rows:].cpu()
    if rows.numel() == 0:
        return 0, 0, 0
    pos = layout.position_ids.cpu()[rows]
    grid_h, grid_w = int(torch.unique(pos[:, 1]).numel()), int(torch.unique(pos[:, 2]).numel())
    frames, left = divmod(rows.numel(), grid_h * grid_w)
    if left:
        raise ValueError(f"{rows.numel()} target video rows are not whole {grid_h}x{grid_w} frames.")
    return frames, grid_h, grid_w


class StepPreview:
    """Rank 0's previews during one request: every `every`-th denoise step, counted over the whole request (an
    extension's windows go on counting). The driver calls `begin(layout)` once per plan (a request; an extension
    window), `due()` at every step, and `capture(...)` on the steps it says yes to."""

    def __init__(self, rgb: LatentRGB, patch: tuple[int, int, int], every: int, frames: int = PREVIEW_FRAMES,
                 max_side: int = FRAME_MAX_SIDE):
        if every < 1:
            raise ValueError(f"preview interval must be at least 1 step, got {every}.")
        self.rgb, self.patch, self.every = rgb, tuple(patch), int(every)
        self.frames, self.max_side = int(frames), int(max_side)
        self.steps = 0  # steps seen so far in this request
        self.sent = 0  # previews captured
        self._select = None  # target-row indices of the sheet's frames, on the device
        self._shape = None  # (frames on the sheet, grid_h, grid_w)

    def begin(self, layout, device) -> None:
        """The rows of this plan's sheet frames. `layout`: the plan's PackedLayout in the state's row order."""
        frames, grid_h, grid_w = target_grid(layout)  # frames counted in temporal patches
        per_frame = grid_h * grid_w
        chosen = strip_frames(frames, self.frames)
        index = [torch.arange(f * per_frame, (f + 1) * per_frame) for f in chosen]
        self._select = (torch.cat(index) if index else torch.zeros(0, dtype=torch.long)).to(device)
        self._shape = (len(chosen), grid_h, grid_w)
        self.rgb = self.rgb.to(device)

    def due(self) -> bool:
        """Counts a step; True when this step's preview is to be made."""
        self.steps += 1
        return self.steps % self.every == 0 and self._shape is not None and self._shape[0] > 0

    @torch.no_grad()
    def capture(self, x_in: torch.Tensor, velocity: torch.Tensor, row_t: torch.Tensor) -> np.ndarray:
        """Target video rows in the state's order: what the model saw x_in [N, D], its velocity v [N, D] and each
        row's timestep t [N] -> the sheet, uint8 [H, W, 3] (host)."""
        sel = self._select
        x0 = x_in.index_select(0, sel).float() + \
            (1.0 - row_t.index_select(0, sel).float())[:, None] * velocity.index_select(0, sel).float()
        n, grid_h, grid_w = self._shape
        latents = rows_to_frames(x0, n, grid_h, grid_w, self.rgb.channels, self.patch)
        rgb = torch.addmm(self.rgb.bias, latents.reshape(-1, self.rgb.channels), self.rgb.weight)
        sheet = contact_sheet(rgb.reshape(*latents.shape[:3], 3), self.max_side)
        self.sent += 1
        return sheet.cpu().numpy()
