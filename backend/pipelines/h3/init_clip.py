"""A start from a decoded clip (video-to-video at a strength, strength.py): the clip is put on the request's grids
where the request is made, and encoded on the workers, where the VAEs are.

Host (`prepare_init_clip`): the frames held onto 24 fps (conditioning.video_to_24fps), cut DOWN to the largest
17n+5 (frames are never invented; a clip longer than H3's longest, 345 frames, gives its first 345), then put on
the canvas: stretched to width x height (PIL LANCZOS) when both are
given, else fitted as an edit's source is (editing.fit_canvas: area-downscale over the pixel cap, centre crop to 32).
The request's num_frames / width / height are the clip's from then on.

Worker (`with_clip_latents`): the frames through the video VAE (the posterior's fixed-seed sample, as every
condition is encoded), the soundtrack through the audio VAE over the request's audio grid (zero-padded where the
clip is short; a clip without one encodes silence, as an extension's source does) -> the request's init_video /
init_audio, which strength.start_rows starts from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .conditioning import stretch_frames, video_to_24fps
from .editing import fit_canvas
from .extension_plan import grid_floor
from .extension_source import encode_soundtrack
from .geometry import FPS, MAX_SECONDS, Geometry, RequestError, frames_for_seconds


@dataclass
class InitClip:
    """frames uint8 [F, H, W, 3] at 24 fps with F = 17n+5 and H, W multiples of 32; waveform [C, N] float32 at
    sample_rate (None: a silent clip)."""

    frames: np.ndarray
    waveform: torch.Tensor | None = None
    sample_rate: int | None = None

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return int(self.frames.shape[2]), int(self.frames.shape[1])


def prepare_init_clip(frames, fps: float, waveform=None, sample_rate: int | None = None,
                      width: int | None = None, height: int | None = None, multiple: int = 32,
                      max_pixels: int = 768 * 1344) -> InitClip:
    """A decoded clip (uint8 [T, H, W, 3] at `fps`) on H3's grids (module docstring)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise RequestError(f"The source video must be uint8 frames [frames, height, width, 3], got {frames.dtype} "
                           f"{tuple(frames.shape)}.")
    frames = video_to_24fps(frames, float(fps))
    keep = grid_floor(min(int(frames.shape[0]), frames_for_seconds(MAX_SECONDS)))  # a longer clip: its first 14.4 s
    if keep == 0:
        raise RequestError(f"The source video is {frames.shape[0]} frames at {FPS} fps; MiniMax-H3 needs at least 5.")
    frames = frames[:keep]
    if (width is None) != (height is None):
        raise RequestError("Give width and height together, or neither (then the canvas follows the source video).")
    if width is None:
        frames, _ = fit_canvas(frames, None, multiple, max_pixels)
    elif frames.shape[1:3] != (height, width):
        if width % multiple or height % multiple:
            raise RequestError(f"width and height must be multiples of {multiple}, got {width}x{height}.")
        frames = stretch_frames(frames, width, height)
    if waveform is not None and sample_rate is None:
        raise RequestError("The source video's soundtrack needs its sample rate.")
    wave = None if waveform is None else torch.as_tensor(waveform).float().cpu()
    return InitClip(np.ascontiguousarray(frames), wave, None if wave is None else int(sample_rate))


def fitted_size(frames, multiple: int = 32, max_pixels: int = 768 * 1344) -> tuple[int, int]:
    """(width, height) prepare_init_clip fits a clip to without a width / height (its first frame tells)."""
    fitted, _ = fit_canvas(np.asarray(frames[:1]), None, multiple, max_pixels)
    return int(fitted.shape[2]), int(fitted.shape[1])


def with_clip_latents(c, req, geo: Geometry):
    """The request with its clip encoded (init_video [1, 24, T, h, w], init_audio [2, 32, Ta]) and the clip
    dropped; the request as it is without one."""
    clip = req.init_clip
    if clip is None:
        return req
    if (clip.num_frames, clip.size) != (geo.num_frames, (geo.width, geo.height)):
        raise RequestError(f"The source clip is {clip.size[0]}x{clip.size[1]}, {clip.num_frames} frames; this "
                           f"request is {geo.width}x{geo.height}, {geo.num_frames} frames (prepare_init_clip puts "
                           "a clip on the request's grids).")
    video = c.cond.encode_video(clip.frames)
    audio, _ = encode_soundtrack(c, clip.waveform, clip.sample_rate, geo.audio_latents)
    return replace(req, init_clip=None, init_video=video, init_audio=audio)
