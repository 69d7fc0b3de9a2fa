"""What a SeedVR2 upscale asks for and what it returns. `validate()` is the request boundary: everything a user can
get wrong is refused here with a RequestError naming the value, before any frame is resized or any weight runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ...errors import RequestError
from ...media.planned_frames import PlannedFrames
from . import options
from .options import MAX_SIDE, MIN_SIDE


@dataclass
class UpscaleRequest:
    """frames: torch.uint8 [F, H, W, 3] RGB on the host (a ComfyUI IMAGE batch or a VIDEO's frames, F >= 1), or a
    media.planned_frames.PlannedFrames reading them from their file batch by batch (host memory bounded by a batch,
    not the clip; workers on this machine).
    Target size: exactly one of `scale` (x the input), `short_side` (pixels of the output's shorter side) or
    `width`+`height`; the output keeps the input's frame count and frame rate.
    batch_frames: frames restored together (options.py's rule; 0 = as many as fit, memory.py); overlap:
    frames shared by consecutive batches and cross-faded. seed: the noise of batch k is drawn from a generator seeded
    (seed, k).
    output_path: a reserved .mp4 the driver streams finished frames into (None: frames come back in memory).
    vae_tile: 0 (auto: whole frames when they fit, else on one GPU the tiles memory.plan_memory chooses), or the VAE
    encodes and decodes in tiles of at most this many pixels a side (a multiple of 8, >= 128; one GPU): close to, not
    equal to, the whole pass (vae_tiling.py).
    vae_tile_stats: a tiled VAE's GroupNorm statistics, "frame" (from a first pass) or "tile" (each tile's own).
    scene_cuts: hard cuts found in `frames` (scene_cuts.py) are kept: batches planned shot by shot (batches.py)."""

    frames: "torch.Tensor | PlannedFrames"
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
    vae_tile_stats: str = "frame"
    scene_cuts: bool = True

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def validate(self) -> None:
        f = self.frames
        if not isinstance(f, (torch.Tensor, PlannedFrames)) or f.dim() != 4 or f.shape[-1] != 3 \
                or f.dtype != torch.uint8:
            shape = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
            raise RequestError(f"Upscale input must be uint8 RGB frames [frames, height, width, 3], got {shape}.")
        if f.shape[0] < 1:
            raise RequestError("Upscale input has no frames.")
        if min(f.shape[1], f.shape[2]) < 16:
            raise RequestError(f"Upscale input is {f.shape[2]}x{f.shape[1]}; each side must be >= 16 pixels.")
        given = [self.scale is not None, self.short_side is not None, self.width is not None or self.height is not None]
        if sum(given) != 1:
            raise RequestError("Give exactly one target: a scale, a short side, or a width and height.")
        if given[2] and (self.width is None or self.height is None):
            raise RequestError(f"Give both a target width and height, each {MIN_SIDE}..{MAX_SIDE} pixels; got width "
                               f"{self.width}, height {self.height}.")
        options.UPSCALE.check_fields(self)  # each field by its option's one rule (options.py)
        if self.batch_frames and self.overlap >= self.batch_frames:
            raise RequestError(f"Overlap {self.overlap} must be >= 0 and smaller than the batch ({self.batch_frames} "
                               "frames).")


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
