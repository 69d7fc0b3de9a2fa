"""MiniMax-H3 request geometry: canvas, frame-count snapping, latent sizes. Pure arithmetic, no tensors.

Facts (diffusers 0.42.1 / the released checkpoint): 24 fps; 5..15 s; the video VAE encodes 17-frame chunks into 5
latent frames, so frame counts snap up to 17n+5 and give 5n+2 latent frames; spatial /16 and patch 2 make the canvas
a multiple of 32; default canvas short edge 768 with area cap 768*1344; aspect 1:4..4:1; audio 40 latents/s stereo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import RequestError  # noqa: F401 - H3 code raises it from here
# The canvas rule is shared with the media layer (Load Video's "H3 canvas" resize), so it lives below both.
from ...media.canvas import CANVAS_MAX_PIXELS, CANVAS_SHORT_EDGE, MAX_ASPECT, MIN_ASPECT, resolve_canvas  # noqa: F401

FPS = 24
MIN_SECONDS = 5.0
MAX_SECONDS = 15.0
AUDIO_LATENTS_PER_SECOND = 40
AUDIO_CHANNELS = 2
VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2


def snap_frames(num_frames: int, frames_per_chunk: int = 17, latents_per_chunk: int = 5) -> int:
    """Round a frame count up to the next frames_per_chunk*n + latents_per_chunk (17n+5 for the release)."""
    if num_frames < 1:
        raise RequestError(f"Frame count must be positive, got {num_frames}.")
    remainder = (num_frames - latents_per_chunk) % frames_per_chunk
    return num_frames + ((frames_per_chunk - remainder) % frames_per_chunk)


def frames_for_seconds(seconds: float, frames_per_chunk: int = 17, latents_per_chunk: int = 5) -> int:
    """A duration in 5..15 s -> a valid frame count: snapped up to 17n+5, or, where that would pass 15 s (above
    14.375 s), the longest valid count (345 frames). The one rule for the node's seconds and the CLI's --seconds /
    --frames (frames / 24). Durations outside 5..15 s are left for validation to refuse (resolve_geometry)."""
    if not math.isfinite(seconds):
        raise RequestError(f"The duration must be a finite number of seconds, got {seconds}.")
    frames = snap_frames(max(1, int(round(seconds * FPS))), frames_per_chunk, latents_per_chunk)
    longest = snap_frames(int(MAX_SECONDS * FPS), frames_per_chunk, latents_per_chunk)
    while longest > MAX_SECONDS * FPS:
        longest -= frames_per_chunk
    return longest if MIN_SECONDS <= seconds <= MAX_SECONDS and frames > longest else frames


def check_duration(seconds: float) -> None:
    """A requested duration must lie in 5..15 s (what the node's seconds widget allows): 4.5 s is refused, not
    snapped up to 5.17 s."""
    if not (math.isfinite(seconds) and MIN_SECONDS <= seconds <= MAX_SECONDS):
        raise RequestError(f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s, got {seconds:g} s.")


def check_frame_count(frames: int) -> None:
    """A requested frame count (the CLI's --frames) by the duration rule, refused quoting the count asked for (not
    the count it would snap to)."""
    if not MIN_SECONDS * FPS <= frames <= MAX_SECONDS * FPS:
        raise RequestError(f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s at {FPS} fps: "
                           f"{int(MIN_SECONDS * FPS)}..{int(MAX_SECONDS * FPS)} frames, got {frames}.")


def latent_frames(num_frames: int, frames_per_chunk: int = 17, latents_per_chunk: int = 5) -> int:
    if num_frames % frames_per_chunk != latents_per_chunk:
        raise RequestError(f"Frame count must be {frames_per_chunk}n+{latents_per_chunk}, got {num_frames}.")
    return (num_frames - latents_per_chunk) // frames_per_chunk * latents_per_chunk + 2


def audio_latents(num_frames: int) -> int:
    return int(round(num_frames / FPS * AUDIO_LATENTS_PER_SECOND))


@dataclass(frozen=True)
class Geometry:
    """Resolved shapes of one request. Latent video [1, C, latent_frames, latent_h, latent_w]; audio [2, 32, Ta]."""

    height: int
    width: int
    num_frames: int
    latent_frames: int
    latent_height: int
    latent_width: int
    audio_latents: int

    @property
    def seconds(self) -> float:
        return self.num_frames / FPS


def resolve_geometry(num_frames: int, height: int, width: int, spatial_ratio: int = 16, multiple: int = 32,
                     frames_per_chunk: int = 17, latents_per_chunk: int = 5) -> Geometry:
    """Validate and snap a request's size; raises RequestError with the fix in the message."""
    if height % multiple or width % multiple:
        raise RequestError(f"Width and height must be multiples of {multiple}, got {width}x{height}.")
    if not MIN_ASPECT <= width / height <= MAX_ASPECT:
        raise RequestError(f"MiniMax-H3 supports aspect ratios 1:4 to 4:1, got {width}x{height}.")
    frames = snap_frames(num_frames, frames_per_chunk, latents_per_chunk)
    seconds = frames / FPS
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise RequestError(
            f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s at {FPS} fps: {num_frames} frames snap up to "
            f"{frames} ({seconds:.3f} s). Use {int(MIN_SECONDS * FPS)}..{frames_for_seconds(MAX_SECONDS)} frames."
        )
    return Geometry(height, width, frames, latent_frames(frames, frames_per_chunk, latents_per_chunk),
                    height // spatial_ratio, width // spatial_ratio, audio_latents(frames))
