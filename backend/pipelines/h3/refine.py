"""H3 Refine, the latent route to 1080p: a clip's video latents upscaled in latent space to the target canvas, then
H3 denoises them again there from a strength (strength.py), within one pipeline and no second model (the other
route is SeedVR2's restoration in pixel space).

Interpolation: bilinear over each latent frame (align_corners False), in float32, on the normalised latents; the
frame count is unchanged. Bilinear is smooth (no ringing that the second pass would have to undo) and what ComfyUI's
Upscale Latent offers by default besides nearest; the second pass repaints the detail it blurs.

Default strength 0.2: on H3's shift-12 grid the rule of diffusers skips the first 80 % of the steps and restarts at
sigma ~0.75 (50 steps: 10 run) -- enough noise to replace the interpolation's blur with detail, little enough to
keep the composition and the motion; refine passes on shifted flow-matching video models are usually run at
0.15-0.3 (at 0.5 the second pass starts at sigma ~0.92 and re-invents the clip). The soundtrack is kept by default:
the source's latents are held clean (init_audio_mode "keep"), so the output sounds exactly like the source.

Target (options.REFINE: a short side, 1088 by default, a scale or width x height): a canvas of multiples of 32 (H3
Sample's rule), no smaller than the source on either side (a refine that shrinks is a resize, not a refinement); the
aspect may change slightly (1344x768 -> 1920x1088 stretches 0.8 %), as a first keyframe is stretched onto its canvas.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from .extension_source import frames_for_latents
from .geometry import RequestError
from .options import REFINE
from .request import H3Request

REFINE_SIZE = (REFINE["width"].default, REFINE["height"].default)  # (width, height): 1080p on 32-multiples
REFINE_DENOISE = 0.2
REFINE_AUDIO = "keep"
INTERPOLATION = "bilinear"
MAX_ASPECT_CHANGE = 0.1  # a target whose aspect differs more than 10 % from the source's is a mistake, not a refine


def source_size(video: torch.Tensor, spatial_ratio: int = 16) -> tuple[int, int]:
    """(width, height) in pixels of video latents [1, C, T, h, w]."""
    return int(video.shape[4]) * spatial_ratio, int(video.shape[3]) * spatial_ratio


def refine_size(source: tuple[int, int], target: str = REFINE["target"].default,
                short_side: int = REFINE["short_side"].default, scale: float = REFINE["scale"].default,
                width: int = REFINE_SIZE[0], height: int = REFINE_SIZE[1], multiple: int = 32) -> tuple[int, int]:
    """(width, height) of a refine (options.REFINE's target): width x height as given ("size"), or the source's
    sides x a factor (`scale`, or `short_side` / the source's short side), each to the nearest multiple of 32 and
    never below the source's."""
    if target == "size":
        return width, height
    if target not in ("short_side", "scale"):
        raise RequestError(f"target must be short_side, scale or size, got {target!r}.")
    sw, sh = source
    factor = scale if target == "scale" else short_side / min(sw, sh)
    return tuple(max(side, int(side * factor / multiple + 0.5) * multiple) for side in (sw, sh))


def check_refine_size(source: tuple[int, int], target: tuple[int, int], multiple: int = 32) -> None:
    """(width, height) pairs: the target on `multiple`s, no side smaller than the source's, about its aspect."""
    (sw, sh), (tw, th) = source, target
    if tw % multiple or th % multiple or tw <= 0 or th <= 0:
        raise RequestError(f"The refine size must be multiples of {multiple}, got {tw}x{th}.")
    if tw < sw or th < sh:
        raise RequestError(f"The refine size {tw}x{th} is smaller than the source's {sw}x{sh} on a side: refining "
                           "upscales (choose at least the source's size).")
    change = abs((tw / th) / (sw / sh) - 1)
    if change > MAX_ASPECT_CHANGE:
        raise RequestError(f"The refine size {tw}x{th} changes the source's aspect ({sw}x{sh}) by {change:.0%}; keep it "
                           f"within {MAX_ASPECT_CHANGE:.0%} (e.g. {round(th * sw / sh / multiple) * multiple}x{th}).")


def upscale_latents(video: torch.Tensor, width: int, height: int, spatial_ratio: int = 16) -> torch.Tensor:
    """Normalised video latents [1, C, T, h, w] -> [1, C, T, height/ratio, width/ratio] float32 (module docstring)."""
    if video.dim() != 5 or video.shape[0] != 1:
        raise RequestError(f"The latents to refine must be video latents [1, channels, T, h, w], got "
                           f"{tuple(video.shape)}.")
    size = (height // spatial_ratio, width // spatial_ratio)
    frames = video[0].float().permute(1, 0, 2, 3)  # [T, C, h, w]: each latent frame on its own
    if tuple(frames.shape[2:]) == size:
        return video.float().clone()
    up = F.interpolate(frames, size=size, mode=INTERPOLATION, align_corners=False)
    return up.permute(1, 0, 2, 3).unsqueeze(0).contiguous()


def refine_request(video: torch.Tensor, audio: torch.Tensor | None, prompt: str, width: int = REFINE_SIZE[0],
                   height: int = REFINE_SIZE[1], denoise: float = REFINE_DENOISE, init_audio_mode: str = REFINE_AUDIO,
                   spatial_ratio: int = 16, **fields) -> H3Request:
    """A t2va request that refines `video` [1, 24, T, h, w] (+ `audio` [2, 32, Ta]) at width x height from
    `denoise`; `fields`: the rest of H3Request's (steps, seed, shifts, schedule, ...)."""
    check_refine_size(source_size(video, spatial_ratio), (width, height))
    if audio is None and init_audio_mode != "regenerate":
        init_audio_mode = "regenerate"  # nothing to keep: the soundtrack is made again over the remaining steps
    request = H3Request(prompt=prompt, num_frames=frames_for_latents(int(video.shape[2])), width=width,
                        height=height, **fields)
    return replace(request, init_video=upscale_latents(video, width, height, spatial_ratio),
                   init_audio=None if init_audio_mode == "regenerate" else audio.float(),
                   denoise=denoise, init_audio_mode=init_audio_mode)


def refine_clip_request(frames, fps: float, waveform, sample_rate: int | None, prompt: str,
                        width: int = REFINE_SIZE[0], height: int = REFINE_SIZE[1], denoise: float = REFINE_DENOISE,
                        init_audio_mode: str = REFINE_AUDIO, **fields) -> H3Request:
    """The same second pass from a decoded clip (uint8 [T, H, W, 3] at `fps`): the clip, fitted to its own canvas
    first (to check the target against), is resized in pixels (LANCZOS) onto the target and encoded there by the
    workers' VAE (init_clip.py) -- its latents would come from that VAE anyway, and a pixel resize blurs less than
    the latent one."""
    from .init_clip import fitted_size, prepare_init_clip

    check_refine_size(fitted_size(frames), (width, height))
    clip = prepare_init_clip(frames, fps, waveform, sample_rate, width=width, height=height)
    request = H3Request(prompt=prompt, num_frames=clip.num_frames, width=width, height=height, **fields)
    return replace(request, init_clip=clip, denoise=denoise, init_audio_mode=init_audio_mode)
