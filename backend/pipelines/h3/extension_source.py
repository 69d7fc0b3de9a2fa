"""The extension's source on H3's grids: normalised latents [1, 24, 5n+2, h, w] + audio latents [2, 32, Ta] with
Ta = audio_index(frames), and (audio mode "lock") the driving soundtrack's latents over the whole result.

A decoded video is held onto 24 fps (conditioning.video_to_24fps), cut DOWN to the largest 17n+5 frames (frames are
never invented: a continuation must start where the source really ends), fitted to a 32-multiple canvas
(editing.fit_canvas: area-downscale over the pixel cap, centre crop) and encoded once. Latents of an earlier H3 run
are used as they are, so nothing is re-encoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .conditioning import video_to_24fps
from .editing import fit_canvas, prepare_audio
from .extension_plan import audio_index, grid_floor
from .geometry import AUDIO_LATENTS_PER_SECOND, FPS, RequestError


@dataclass
class ExtensionSource:
    video_latents: torch.Tensor  # [1, 24, 5n+2, h, w] float32 CPU, normalised
    audio_latents: torch.Tensor  # [2, 32, audio_index(num_frames)] float32 CPU, normalised
    num_frames: int  # 17n+5
    width: int
    height: int
    given_frames: int  # frames at 24 fps before the cut to the grid (== num_frames for latents)


def frames_for_latents(latent_frames: int) -> int:
    """5n+2 latent frames -> 17n+5 pixel frames."""
    return (latent_frames - 2) // 5 * 17 + 5


def _fit_audio_latents(latents: torch.Tensor, count: int) -> torch.Tensor:
    """[2, 32, t] cut or zero-padded (normalised zero = the latent mean) to `count` latents."""
    if latents.shape[2] >= count:
        return latents[:, :, :count].contiguous()
    return torch.cat([latents, latents.new_zeros(latents.shape[0], latents.shape[1], count - latents.shape[2])], 2)


def encode_soundtrack(c, wave, rate, num_latents: int) -> tuple[torch.Tensor, int]:
    """Waveform [C, N] (or None: silence) -> (audio latents [2, 32, num_latents], valid samples at the VAE rate)."""
    hop = c.audio_rate // AUDIO_LATENTS_PER_SECOND
    samples, valid = prepare_audio(wave, rate, c.audio_rate, num_latents * hop)
    rows = c.cond.encode_audio(samples)  # [2 * t, 32] channel-major
    latents = rows.reshape(2, -1, rows.shape[-1]).permute(0, 2, 1)
    return _fit_audio_latents(latents, num_latents), valid


def prepare_extension_source(c, req, min_frames: int) -> ExtensionSource:
    """`min_frames`: the fewest frames the window plan needs (the overlap)."""
    multiple = c.spatial_ratio * c.patch_size[2]
    if req.source_video_latents is not None:
        video = req.source_video_latents.float().cpu()
        lh, lw = video.shape[3], video.shape[4]
        if video.shape[1] != c.latent_channels or lh % c.patch_size[1] or lw % c.patch_size[2]:
            raise RequestError(f"Source latents {tuple(video.shape)} do not fit this model ({c.latent_channels} "
                               f"channels, latent size a multiple of {c.patch_size[1]}).")
        frames = frames_for_latents(video.shape[2])
        if frames < min_frames:
            raise RequestError(f"The source is {frames} frames; the overlap needs at least {min_frames}.")
        audio = _fit_audio_latents(req.source_audio_latents.float().cpu(), audio_index(frames))
        return ExtensionSource(video, audio, frames, lw * c.spatial_ratio, lh * c.spatial_ratio, frames)

    frames = video_to_24fps(np.asarray(req.source_frames), float(req.source_fps))
    if frames.dtype != np.uint8:
        raise RequestError(f"The source frames must be uint8, got {frames.dtype}.")
    given = int(frames.shape[0])
    keep = grid_floor(given)
    if keep < max(min_frames, 5):
        raise RequestError(f"The source is {given} frames at {FPS} fps ({given / FPS:.2f} s); extending it with this "
                           f"overlap needs at least {max(min_frames, 5)} frames.")
    frames, _ = fit_canvas(frames[:keep], None, multiple, c.options.canvas_max_pixels)
    video = c.cond.encode_video(frames)
    audio, _ = encode_soundtrack(c, req.source_audio, req.source_sample_rate, audio_index(keep))
    return ExtensionSource(video, audio, keep, frames.shape[2], frames.shape[1], given)


def driving_soundtrack(c, req, total_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Audio mode "lock": (latents [2, 32, audio_index(total)], waveform [2, N] at the VAE rate) of the driving
    soundtrack, which must cover the whole result."""
    wave, rate = req.driving_audio, req.driving_sample_rate
    if wave is None:
        wave, rate = req.source_audio, req.source_sample_rate
    needed = total_frames / FPS
    have = torch.as_tensor(wave).shape[-1] / float(rate)
    if have + 1e-6 < needed:
        raise RequestError(f"The driving soundtrack is {have:.2f} s but the extended video is {needed:.2f} s: give "
                           "audio at least as long as the result (it is aligned with the start of the source).")
    num = audio_index(total_frames)
    latents, _ = encode_soundtrack(c, wave, rate, num)
    samples, _ = prepare_audio(wave, rate, c.audio_rate, math.ceil(total_frames * c.audio_rate / FPS))
    return latents, samples
