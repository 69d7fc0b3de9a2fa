"""Latent mask editing (remove / replace / inpaint): pure helpers that map a user's MASK onto H3's grids.

Mask convention (ComfyUI MASK): float 0..1, 1 = regenerate, 0 = keep the source, in between = blend.

Source normalisation (`prepare_source`), in this order, the mask always resampled exactly like the frames:
  1. time onto 24 fps by holding frames (conditioning.video_to_24fps: slot = floor(i * 24 / fps + 0.5)); the mask's
     frames are held with the same counts (a single-frame mask [H, W] / [1, H, W] applies to every frame);
  2. length cut DOWN to the largest 17n+5 <= the source (never invented frames), at most 15 s (345 frames); a clip
     shorter than 5 s (124 frames at 24 fps) is refused;
  3. size: if H*W exceeds the canvas pixel cap the frames are area-downscaled (PIL BOX; the mask by area averaging),
     then centre-CROPPED (never resampled) to multiples of 32, so the kept pixels stay the source's own pixels.
  4. grow then feather, once, in pixels at the canvas size, by the pack's one definition (media/mask_raster.py,
     `grow_feather_invert`, the one H3 Mask Draw uses): grow = dilation by the Euclidean disk of radius `grow`;
     feather = three box blurs of radius ceil(feather / 3), a soft edge centred on the grown border. The presets
     (PRESETS) keep the given mask fully regenerated: their grow covers their feather's reach
     (2 * (3 * ceil(feather / 3))^2 <= grow^2), so every pixel the mask regenerates stays exactly 1 and the soft
     edge lies around it. (A mask H3 Mask Draw already grew or feathered reaches here with grow = feather = 0:
     nodes/edit.py; a mask is shaped once.)

Temporal rule (derived from the video VAE, not hard-coded): the encoder cuts `clip_length` (17) frame chunks and
left-pads each with `pre = (-clip_length) % ratio` (3) frames before its stride-`ratio` (4) temporal patching, giving
`tokens_chunk = ceil(clip_length / ratio)` (5) latents per chunk; `token_drop` trailing latents of the whole video are
dropped, so 17n+5 frames -> 5n+2 latents. Pixel frame f therefore belongs to latent
    L(f) = (f // clip_length) * tokens_chunk + ((f % clip_length) + pre) // ratio
i.e. per 17-frame chunk the latents cover (1, 4, 4, 4, 4) frames: latent 0 <- frame 0, latent 1 <- frames 1..4,
..., latent 5 <- frame 17 ... A latent's mask is the MAX over its frames (the reference takes the nearest frame; a max
never keeps a latent whose frames the user asked to regenerate).

Spatial rule: max-pool by the VAE's spatial ratio (16) -> the latent grid (the RESTORE mask, per latent cell, 24
channels broadcast), then max-pool by the DiT patch (2x2) -> the token grid (the MODEL mask, one value per packed
96-wide row): a row is regenerated as much as its most-regenerated pixel. Both are quantised UPWARD to 1/256
(ceil(m * 256 - 1e-4) / 256; 0 and 1 stay exact) so at most 257 distinct timesteps per modality reach the AdaLN.

Denoising (tasks/edit.py's step plan, run by denoise.py), per step i with sigma_i (video / audio schedules of t2va)
and row mask m:
  row timestep  t_r = min(1 - m * sigma_i, 0.999)   (a kept row sits at the condition level 0.999; text rows ride
                                                     the video clock as in t2va)
  model input   x_in = lerp(anchor, state, m)      video anchor = 0.999 * clean + 0.001 * (the request's seeded
                                                     initial video noise); audio anchor = clean source latents
  prediction    x0 = x_in + (1 - t_r) * v           (per-row; equals the t2va Euler x0 where m = 1)
  state update  state <- r * state + (1 - r) * x0,  r = sigma_{i+1} / sigma_i; no per-step renoise
  final         x0_final = lerp(clean, state, restore_mask)   (kept cells are the encoded source bit for bit)
The state starts from the same noise draw as t2va (video [1, 24, T, h, w], then audio rows), from one CPU generator.
Audio: per channel-major row mask: keep 0, regenerate 1, blend `audio_level`; rows past the end of a short (or
missing) source soundtrack are forced to 1 (the source is zero-padded there). The same t-clip at 0.999 is used for
audio rows, whose anchor is the clean source (as the reference does).

Pixel composite after decode: out = lerp(recon, edited, pixel_mask) with recon = a plain decode of the encoded source
latents and pixel_mask the grown + feathered (step 4) canvas-size mask; rounded to uint8. Where the pixel mask is 0 the
output IS the encode-decode of the source (bit for bit), which hides the VAE decoder's spatial/temporal reach
(clip overlap blend, tiling) across the latent mask's border. The soundtrack is not composited in sample space:
kept audio rows decode from the source latents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...media.mask_raster import grow_feather_invert
from .geometry import FPS, MAX_SECONDS, MIN_SECONDS, RequestError, snap_frames

QUANT_LEVELS = 256
KEEP_T = 0.999  # = layout.CONDITION_T; duplicated so this module imports nothing heavy
AUDIO_MODES = ("keep", "regenerate", "blend")
MAX_MASK_SHAPING = 512  # px: the largest mask grow / feather; -1 (or None) = the preset's


@dataclass(frozen=True)
class Preset:
    """Defaults a preset brings: mask grow / feather in canvas pixels (media/mask_raster.py's definition, as H3 Mask
    Draw's widgets) and audio handling."""

    name: str
    grow: int
    feather: int
    audio_mode: str
    audio_level: float
    description: str


# Each soft edge sits where the earlier presets' outward ramp (grow g0, then a ramp f0 px wide outside it) had its
# middle: grow = g0 + f0 / 2, feather = f0 (about as wide a ramp); and every grow covers its feather's reach (module
# docstring, step 4; inpaint's 12 would not: 13), so the given mask stays fully regenerated.
# tests/pipelines/h3/test_editing.py checks that for each preset.
PRESETS = {
    "removal": Preset("removal", 40, 16, "blend", 0.5,
                      "remove what the mask covers: grow 40 px (room for the object's shadow and edge), feather 16 px "
                      "around that, audio half regenerated (its sound may go with it)"),
    "replace": Preset("replace", 22, 12, "blend", 0.5,
                      "replace what the mask covers with what the prompt says: grow 22 px, feather 12 px, audio half "
                      "regenerated"),
    "inpaint": Preset("inpaint", 13, 8, "keep", 0.0,
                      "fill the masked area so it fits its surroundings: grow 13 px, feather 8 px, audio kept"),
}


# -- small pure pieces -------------------------------------------------------------------------------------------------
def quantize_up(mask: torch.Tensor, levels: int = QUANT_LEVELS) -> torch.Tensor:
    """float 0..1 -> float32 on the 1/levels grid, rounded up (0 -> 0, 1 -> 1, 0.001 -> 1/256)."""
    m = mask.float().clamp(0.0, 1.0)
    return (torch.ceil(m * levels - 1e-4).clamp(0, levels) / levels).float()


def frame_to_latent(num_frames: int, clip_length: int = 17, ratio: int = 4) -> np.ndarray:
    """[num_frames] int: the latent frame each pixel frame belongs to (the rule in the module docstring)."""
    pre = (-clip_length) % ratio
    tokens_chunk = math.ceil(clip_length / ratio)
    f = np.arange(num_frames)
    return (f // clip_length) * tokens_chunk + ((f % clip_length) + pre) // ratio


def latent_frame_count(num_frames: int, clip_length: int = 17, ratio: int = 4) -> int:
    return int(frame_to_latent(num_frames, clip_length, ratio)[-1]) + 1


def mask_to_latent_time(mask: torch.Tensor, clip_length: int = 17, ratio: int = 4) -> torch.Tensor:
    """[F, H, W] -> [T_lat, H, W]: each latent frame takes the max over the pixel frames it covers."""
    index = frame_to_latent(mask.shape[0], clip_length, ratio)  # non-decreasing: each latent is one frame run
    starts = np.flatnonzero(np.diff(index, prepend=-1))
    ends = np.append(starts[1:], mask.shape[0])
    return torch.stack([mask[a:b].float().amax(dim=0) for a, b in zip(starts, ends)])


def max_pool_space(mask: torch.Tensor, factor: int) -> torch.Tensor:
    """[T, H, W] -> [T, H/factor, W/factor] max-pooled; H and W must be multiples of factor."""
    t, h, w = mask.shape
    if h % factor or w % factor:
        raise RequestError(f"Mask size {w}x{h} is not a multiple of {factor}.")
    return mask.float().reshape(t, h // factor, factor, w // factor, factor).amax(dim=(2, 4))


@dataclass
class LatentMasks:
    """restore [T_lat, h, w] (latent grid) and token [T_lat, h/ph, w/pw] (one per packed video row), quantised."""

    restore: torch.Tensor
    token: torch.Tensor

    def token_rows(self) -> torch.Tensor:
        """[T_lat * h/ph * w/pw] in packed (frame-major, row-major) order."""
        return self.token.reshape(-1)

    def restore_rows(self, patch: tuple[int, int, int], channels: int) -> torch.Tensor:
        """[rows, channels*pt*ph*pw]: the restore mask laid out like layout.patchify's rows (channels broadcast)."""
        from .layout import patchify

        m = self.restore[None, None].expand(1, channels, *self.restore.shape)
        return patchify(m.contiguous(), patch)


def mask_to_latent_grid(mask: torch.Tensor, spatial_ratio: int = 16, patch: tuple[int, int] = (2, 2),
                        clip_length: int = 17, ratio: int = 4) -> LatentMasks:
    """Pixel mask [F, H, W] (F = 17n+5, H, W multiples of spatial_ratio*patch) -> LatentMasks."""
    if mask.ndim != 3:
        raise RequestError(f"The mask must be [frames, height, width], got {tuple(mask.shape)}.")
    timed = mask_to_latent_time(mask, clip_length, ratio)
    restore = max_pool_space(timed, spatial_ratio)
    t, h, w = restore.shape
    ph, pw = patch
    if h % ph or w % pw:
        raise RequestError(f"Latent grid {w}x{h} is not a multiple of the patch {pw}x{ph}.")
    token = restore.reshape(t, h // ph, ph, w // pw, pw).amax(dim=(2, 4))
    return LatentMasks(quantize_up(restore), quantize_up(token))


def row_timesteps(mask: torch.Tensor, sigma: float) -> torch.Tensor:
    """t_r = min(1 - m * sigma, 0.999) per row, float32."""
    return torch.clamp(1.0 - mask.float() * float(sigma), max=KEEP_T)


def audio_row_mask(num_latents: int, valid_latents: int, mode: str, level: float = 0.5,
                   channels: int = 2) -> torch.Tensor:
    """Channel-major audio rows [channels * num_latents]: keep 0 / regenerate 1 / blend `level` (quantised up);
    latents at or past `valid_latents` (no source sound there) are forced to 1."""
    if mode not in AUDIO_MODES:
        raise RequestError(f"audio_mode must be one of {', '.join(AUDIO_MODES)}, got {mode!r}.")
    value = {"keep": 0.0, "regenerate": 1.0, "blend": float(level)}[mode]
    per_channel = torch.full((num_latents,), value, dtype=torch.float32)
    per_channel[max(0, valid_latents):] = 1.0
    return quantize_up(per_channel.repeat(channels))


# -- pixel-space mask work -----------------------------------------------------------------------------------------
def composite_frames(recon: torch.Tensor, edited: torch.Tensor, mask: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """uint8 [F, H, W, 3] x2 + float mask [F, H, W] -> uint8 lerp(recon, edited, mask), round half-even.
    Exactly `recon` where mask == 0 and exactly `edited` where mask == 1."""
    if recon.shape != edited.shape or recon.shape[:3] != mask.shape:
        raise RuntimeError(f"Composite shapes disagree: {tuple(recon.shape)}, {tuple(edited.shape)}, "
                           f"mask {tuple(mask.shape)}.")
    out = torch.empty_like(recon)
    for i in range(0, recon.shape[0], chunk):
        a, b = recon[i:i + chunk].float(), edited[i:i + chunk].float()
        m = mask[i:i + chunk].to(a.device, torch.float32)[..., None]
        out[i:i + chunk] = torch.lerp(a, b, m).round().clamp(0, 255).to(torch.uint8)
    return out


# -- source normalisation -------------------------------------------------------------------------------------------
def resolve_preset(name: str, grow: int | None, feather: int | None, audio_mode: str | None,
                   audio_level: float | None) -> tuple[int, int, str, float]:
    """Preset defaults, each overridden where the caller gave a value (None / 'preset' / -1 = default)."""
    if name not in PRESETS:
        raise RequestError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}.")
    p = PRESETS[name]
    grow, feather = _shaping(grow, p.grow, "mask grow"), _shaping(feather, p.feather, "mask feather")
    mode = p.audio_mode if audio_mode in (None, "", "preset") else audio_mode
    level = p.audio_level if audio_level is None or audio_level < 0 else float(audio_level)
    if mode not in AUDIO_MODES:
        raise RequestError(f"audio_mode must be preset, {', '.join(AUDIO_MODES)}; got {audio_mode!r}.")
    if not 0.0 <= level <= 1.0:
        raise RequestError(f"audio level must be within 0..1, got {level}.")
    return grow, feather, mode, level


def _shaping(value: int | None, preset: int, what: str) -> int:
    """A mask grow / feather: None or -1 -> the preset's; 0..MAX_MASK_SHAPING px as given; anything else refused
    (a -5 is a typo, not a request for the preset)."""
    if value is None or value == -1:
        return preset
    if not (float(value).is_integer() and 0 <= value <= MAX_MASK_SHAPING):
        raise RequestError(f"{what} must be 0..{MAX_MASK_SHAPING} px, or -1 for the preset's ({preset}), got "
                           f"{value}.")
    return int(value)


def check_mask_shape(mask_shape: tuple, video_shape: tuple) -> None:
    """mask [T, H, W] or [H, W] vs frames [F, H, W, 3] as given (before normalisation)."""
    if len(video_shape) != 4 or video_shape[-1] != 3:
        raise RequestError(f"The source video must be uint8 [frames, height, width, 3], got {tuple(video_shape)}.")
    if len(mask_shape) == 2:
        mask_shape = (1,) + tuple(mask_shape)
    if len(mask_shape) != 3:
        raise RequestError(f"The mask must be [frames, height, width] or [height, width], got {tuple(mask_shape)}.")
    if tuple(mask_shape[1:]) != tuple(video_shape[1:3]):
        raise RequestError(f"Mask size {mask_shape[2]}x{mask_shape[1]} differs from the video's "
                           f"{video_shape[2]}x{video_shape[1]}: draw the mask on the video itself (or resize it).")
    if mask_shape[0] not in (1, video_shape[0]):
        what = "shorter" if mask_shape[0] < video_shape[0] else "longer"
        raise RequestError(f"The mask has {mask_shape[0]} frames, {what} than the video's {video_shape[0]}: give one "
                           "mask frame per video frame, or a single frame for all of them.")


def edit_frame_count(frames_24: int, clip_length: int = 17, keep: int = 5) -> int:
    """Largest clip_length*n + keep <= frames_24, capped at 15 s; refuses clips under 5 s."""
    longest = int(MAX_SECONDS * FPS)
    n = min(frames_24, longest)
    n = (n - keep) // clip_length * clip_length + keep if n >= keep else 0
    if n / FPS < MIN_SECONDS:
        shortest = snap_frames(int(MIN_SECONDS * FPS), clip_length, keep)
        raise RequestError(f"The source is {frames_24} frames ({frames_24 / FPS:.2f} s) at 24 fps; MiniMax-H3 edits "
                           f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s clips: give at least {shortest} frames at 24 fps.")
    return n


def _hold_counts(num: int, fps: float) -> np.ndarray:
    scale = FPS / fps
    slots = np.floor(np.arange(num + 1) * scale + 0.5).astype(np.int64)
    return np.diff(slots)


@dataclass
class EditSource:
    """The source on H3's grid: frames uint8 [F, H, W, 3] (F = 17n+5, H, W multiples of 32, 24 fps) and the
    grown + feathered pixel mask float32 [F, H, W]."""

    frames: np.ndarray
    mask: torch.Tensor


def fit_canvas(frames: np.ndarray, mask: torch.Tensor | None, multiple: int = 32, max_pixels: int = 768 * 1344
               ) -> tuple[np.ndarray, torch.Tensor | None]:
    """Frames uint8 [F, H, W, 3] (+ mask [T, H, W]) -> area-downscaled (PIL BOX; the mask by area averaging) when
    H*W exceeds `max_pixels`, then centre-CROPPED to multiples of `multiple` (kept pixels stay the source's own)."""
    from PIL import Image

    h, w = frames.shape[1:3]
    if h * w > max_pixels:
        scale = (max_pixels / (h * w)) ** 0.5
        nh, nw = max(multiple, int(h * scale)), max(multiple, int(w * scale))
        frames = np.stack([np.asarray(Image.fromarray(f).resize((nw, nh), Image.Resampling.BOX)) for f in frames])
        if mask is not None:
            mask = F.interpolate(mask[:, None], size=(nh, nw), mode="area")[:, 0]
        h, w = nh, nw
    ch, cw = h // multiple * multiple, w // multiple * multiple
    if ch < multiple or cw < multiple:
        raise RequestError(f"The source video is {w}x{h}; MiniMax-H3 needs at least {multiple}x{multiple}.")
    if not 0.25 <= cw / ch <= 4.0:
        raise RequestError(f"MiniMax-H3 supports aspect ratios 1:4 to 4:1, got {cw}x{ch}.")
    top, left = (h - ch) // 2, (w - cw) // 2
    frames = np.ascontiguousarray(frames[:, top:top + ch, left:left + cw])
    if mask is not None:
        mask = mask[:, top:top + ch, left:left + cw].clamp(0.0, 1.0)
    return frames, mask


def prepare_source(frames: np.ndarray, mask, fps: float, grow: int, feather: int, multiple: int = 32,
                   max_pixels: int = 768 * 1344, clip_length: int = 17, keep: int = 5) -> EditSource:
    """Bring frames + mask onto H3's grid (see the module docstring, steps 1-4)."""
    frames = np.asarray(frames)
    mask = torch.as_tensor(np.asarray(mask, dtype=np.float32))
    check_mask_shape(tuple(mask.shape), frames.shape)
    if frames.dtype != np.uint8:
        raise RequestError(f"The source frames must be uint8, got {frames.dtype}.")
    if mask.ndim == 2:
        mask = mask[None]
    if not fps or fps <= 0:
        raise RequestError(f"The source video needs a positive frame rate, got {fps}.")
    # 1. time onto 24 fps (the mask's frames held exactly like the video's)
    if fps != FPS:
        counts = _hold_counts(frames.shape[0], fps)
        frames = np.repeat(frames, counts, axis=0)
        if mask.shape[0] > 1:
            mask = torch.repeat_interleave(mask, torch.from_numpy(counts), dim=0)
    # 2. length: cut down to 17n+5 within 5..15 s
    n = edit_frame_count(frames.shape[0], clip_length, keep)
    frames = frames[:n]
    mask = mask[:n] if mask.shape[0] > 1 else mask
    # 3. size: area-downscale over the pixel cap, then centre-crop to multiples of `multiple`
    frames, mask = fit_canvas(frames, mask, multiple, max_pixels)
    # 4. grow + feather at the canvas size (the one definition); a single mask frame broadcasts over time
    if grow < 0 or feather < 0:
        raise RequestError(f"mask grow and feather must be >= 0 px, got {grow} and {feather}.")
    mask = grow_feather_invert(mask, grow, feather)
    if mask.shape[0] == 1:
        mask = mask.expand(n, -1, -1)
    return EditSource(frames, mask.contiguous())


def prepare_audio(wave: torch.Tensor | None, rate: int | None, target_rate: int, num_samples: int
                  ) -> tuple[torch.Tensor, int]:
    """Source soundtrack -> ([2, num_samples] float32 at target_rate, zero-padded / cut; valid sample count)."""
    if wave is None:
        return torch.zeros(2, num_samples), 0
    from .conditioning import normalize_audio

    wave = normalize_audio(torch.as_tensor(wave), int(rate or target_rate), target_rate, num_samples / target_rate + 1)
    valid = min(wave.shape[1], num_samples)
    out = torch.zeros(2, num_samples)
    out[:, :valid] = wave[:, :valid]
    return out, valid
