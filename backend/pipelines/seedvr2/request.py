"""What a SeedVR2 upscale asks for and what it returns. `validate()` is the request boundary: everything a user can
get wrong is refused here with a RequestError naming the value, before any frame is resized or any weight runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ...errors import RequestError
from .colorfix import METHODS as COLOR_FIXES, unknown_method  # declared once, where the methods are

EDGE_MODES = ("pad", "crop")  # making the size a multiple of 16: replicate-pad (cropped back after) or centre-crop
MAX_SCALE = 8.0
MAX_SIDE = 8192
MIN_VAE_TILE = 128  # px; smaller tiles see too little of the frame (and a tile this small always fits)
MIN_BATCH_FRAMES = 5  # several batches need a latent frame of history besides the first; one frame is auto's anyway
MAX_BATCH_FRAMES = 4097


def batch_frames_error(value, name: str = "Batch frames") -> str | None:
    """The one rule for the batch size a user gives (node, CLI and request alike): 0 (auto: as many as fit) or 4n+1
    from MIN_BATCH_FRAMES to MAX_BATCH_FRAMES, whatever the video's length. None when `value` passes, else the
    sentence naming `name`, the value and the nearest sizes allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")) or not float(value).is_integer():
        return f"{name} must be a whole number, 0 (auto) or 4n+1 from {MIN_BATCH_FRAMES}, got {value!r}."
    value = int(value)
    if value == 0 or (MIN_BATCH_FRAMES <= value <= MAX_BATCH_FRAMES and value % 4 == 1):
        return None
    if value < 0 or value > MAX_BATCH_FRAMES:
        hint = f"0 for auto, or up to {MAX_BATCH_FRAMES}"
    elif value < MIN_BATCH_FRAMES:
        hint = f"0 for auto or {MIN_BATCH_FRAMES} (a single image is one batch either way)"
    else:
        lower = value - (value - 1) % 4
        hint = f"{lower} or {lower + 4}"
    return (f"{name} must be 4n+1 from {MIN_BATCH_FRAMES} to {MAX_BATCH_FRAMES} ({MIN_BATCH_FRAMES}, 9, 13, 17, 21, "
            f"...) or 0 for auto, got {value}: use {hint}.")


def finite_number(value, name: str) -> None:
    """RequestError naming the input when a numeric setting is NaN or infinite (ComfyUI's range checks let both
    through, and int() of them fails with no name)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"SeedVR2 Upscale's {name} must be a finite number, got {value}.")


@dataclass
class UpscaleRequest:
    """frames: torch.uint8 [F, H, W, 3] RGB on the host (a ComfyUI IMAGE batch or a VIDEO's frames, F >= 1).
    Target size: exactly one of `scale` (x the input), `short_side` (pixels of the output's shorter side) or
    `width`+`height`; the output keeps the input's frame count and frame rate.
    batch_frames: frames restored together (batch_frames_error's rule; 0 = as many as fit, memory.py); overlap:
    frames shared by consecutive batches and cross-faded. seed: the noise of batch k is drawn from a generator seeded
    (seed, k).
    output_path: a reserved .mp4 the driver streams finished frames into (None: frames come back in memory).
    vae_tile: 0, or the VAE encodes and decodes in tiles of at most this many pixels a side (a multiple of 8, >= 128;
    one GPU), for outputs whose frames do not fit whole: close to, not equal to, the whole pass (vae_tiling.py)."""

    frames: torch.Tensor
    scale: float | None = 2.0
    short_side: int | None = None
    width: int | None = None
    height: int | None = None
    batch_frames: int = 0
    overlap: int = 8
    color_fix: str = "wavelet"
    seed: int = 0
    edge: str = "pad"
    fps: Fraction = Fraction(24)
    output_path: str | None = None
    encode_options: dict = field(default_factory=dict)  # crf, preset, metadata for output_path
    audio: torch.Tensor | None = None  # [C, S] float32 muxed into output_path unchanged
    sample_rate: int | None = None
    timings: bool = False  # seconds per stage in the result (synchronises the device at stage borders)
    vae_tile: int = 0

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def validate(self) -> None:
        f = self.frames
        if not isinstance(f, torch.Tensor) or f.dim() != 4 or f.shape[-1] != 3 or f.dtype != torch.uint8:
            shape = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
            raise RequestError(f"Upscale input must be uint8 RGB frames [frames, height, width, 3], got {shape}.")
        if f.shape[0] < 1:
            raise RequestError("Upscale input has no frames.")
        if min(f.shape[1], f.shape[2]) < 16:
            raise RequestError(f"Upscale input is {f.shape[2]}x{f.shape[1]}; each side must be >= 16 pixels.")
        for name in ("scale", "short_side", "width", "height", "batch_frames", "overlap", "seed", "vae_tile"):
            finite_number(getattr(self, name), name)
        given = [self.scale is not None, self.short_side is not None, self.width is not None or self.height is not None]
        if sum(given) != 1:
            raise RequestError("Give exactly one target: a scale, a short side, or a width and height.")
        if self.scale is not None and not (0 < float(self.scale) <= MAX_SCALE):
            raise RequestError(f"Scale {self.scale} is out of range; use a value in (0, {MAX_SCALE:g}].")
        if self.short_side is not None and not (16 <= int(self.short_side) <= MAX_SIDE):
            raise RequestError(f"Short side {self.short_side} is out of range; use 16..{MAX_SIDE} pixels.")
        if given[2] and not (self.width and self.height and 16 <= self.width <= MAX_SIDE
                             and 16 <= self.height <= MAX_SIDE):
            raise RequestError(f"Give both a target width and height, each 16..{MAX_SIDE} pixels; got width "
                               f"{self.width}, height {self.height}.")
        problem = batch_frames_error(self.batch_frames)
        if problem:
            raise RequestError(problem)
        if self.overlap < 0 or (self.batch_frames and self.overlap >= self.batch_frames):
            raise RequestError(f"Overlap {self.overlap} must be >= 0 and smaller than the batch ({self.batch_frames} "
                               "frames).")
        if self.color_fix not in COLOR_FIXES:
            raise RequestError(unknown_method(self.color_fix))
        if self.edge not in EDGE_MODES:
            raise RequestError(f"Edge mode {self.edge!r} is not one of {', '.join(EDGE_MODES)}.")
        if self.vae_tile and not (MIN_VAE_TILE <= self.vae_tile <= MAX_SIDE and self.vae_tile % 8 == 0):
            raise RequestError(f"VAE tile {self.vae_tile} must be 0 (off) or a multiple of 8 from {MIN_VAE_TILE} to "
                               f"{MAX_SIDE} pixels.")
        if not 0 <= int(self.seed) < 2**64:
            raise RequestError(f"Seed {self.seed} must be in 0..2^64-1.")


@dataclass
class UpscaleResult:
    """frames: uint8 [F, H', W', 3] on the host (None when streamed to `path`); batches restored; stopped: a Stop
    ended the run after `frames_done` final frames (a streamed file then holds those)."""

    frames: torch.Tensor | None
    width: int
    height: int
    frames_done: int
    batches: int
    path: str | None = None
    stopped: bool = False
    timings: dict = field(default_factory=dict)
    manifest: dict | None = None  # the stage manifest (backend/manifest.py), filled by the pipeline and the engine
