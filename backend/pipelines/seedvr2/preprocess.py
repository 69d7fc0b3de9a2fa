"""SeedVR2 input/output frames: target size, resize, the multiple-of-16 fit, 4n+1 frames, [-1, 1] <-> uint8.

Contracts:
- Input frames: `[F, h, w, 3]` RGB, uint8 (0..255) or floating (0..1, ComfyUI IMAGE); any device.
- Model frames: `[3, F', H', W']` floating in [-1, 1] (channels first, frames second, the VAE's layout without the
  batch axis); H', W' multiples of 16; F' = `padded_frame_count(F)` (4n+1, the last frame repeated, official).
- Output frames: `[F, H, W, 3]` uint8, the model frames with the fit undone (pad cropped back) and cut to F.

Recipe (official projects/inference_seedvr2_*.py, except the target size and the pad fit): frames to float 0..1,
bicubic resize with antialias (torch's, = torchvision's tensor resize), clamp to 0..1, fit to /16, x * 2 - 1.
Output: clamp(-1, 1) * 0.5 + 0.5, * 255, round half to even (float64 for float32 input, float32 for half types).

Memory: work runs over chunks of frames (`chunk_bytes` of float32 temporaries, default 256 MiB), writing into the one
output tensor. Peak of `prepare_video` = its output (3 * F' * H' * W' * itemsize) + one chunk (about chunk_bytes, at
least one frame: 4 * 3 * (h*w + 2*H'*W') bytes). Example: 241 frames of 1344x768 at x2 (2688x1536): output 11.9 GB
float32 / 6.0 GB bf16, chunk 2 frames (~0.3 GB); the uint8 input itself is 0.75 GB. `prepare_frames` on a slice
(one long-video batch, or a chunk of colour-fix references) avoids even the full output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ...errors import RequestError
from .batches import padded_frames
from .options import EDGE_MODES as FITS, MAX_SIDE, MIN_SIDE  # the output's bounds and fits are the options'

MULTIPLE = 16  # VAE /8 then patch 2: the model's pixel grid
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024

HW = Tuple[int, int]


@dataclass(frozen=True)
class Geometry:
    """Sizes of one upscale, all (height, width).

    source: input frames; resized: after the resize (the requested target); model: what the VAE/DiT see (multiples of
    16); fit: "pad" (edge-replicated to /16, cropped back after decode: output = resized) or "crop" (centre-cropped to
    /16 before the model, as the official code: output = model, up to 15 pixels smaller than the target per side);
    offset: pad: where the resized frame sits inside the model frame; crop: where the model frame sits inside the
    resized frame (top, left)."""

    source: HW
    resized: HW
    model: HW
    fit: str
    offset: HW

    @property
    def output(self) -> HW:
        return self.resized if self.fit == "pad" else self.model

    @property
    def box(self) -> Tuple[int, int, int, int]:
        """(top, left, height, width) of a model-size frame that is kept in the output."""
        if self.fit == "pad":
            return self.offset[0], self.offset[1], self.resized[0], self.resized[1]
        return 0, 0, self.model[0], self.model[1]


def _positive_finite(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"SeedVR2 {name} must be a number, got {value!r}.") from None
    if not math.isfinite(v) or v <= 0:
        raise RequestError(f"SeedVR2 {name} must be a positive finite number, got {value!r}.")
    return v


def _whole(value, name: str) -> int:
    if isinstance(value, bool) or not float(_positive_finite(value, name)).is_integer():
        raise RequestError(f"SeedVR2 {name} must be a whole number of pixels, got {value!r}.")
    return int(value)


def target_size(height: int, width: int, *, scale: Optional[float] = None, short_side: Optional[int] = None,
                size: Optional[Sequence[int]] = None) -> HW:
    """Output (height, width) for an input of height x width, from exactly one of:
    scale: each side round(side * scale); short_side: the shorter side becomes short_side, the other
    round(side * short_side / shorter) (a square input gets both); size: (width, height) exactly.
    round is Python's (half to even, as the official resize), on float64 values. Each resulting side must be
    MIN_SIDE..MAX_SIDE, else RequestError."""
    if int(height) < 1 or int(width) < 1:
        raise RequestError(f"SeedVR2 input frames are {width}x{height}; both sides must be at least 1 pixel.")
    h, w = int(height), int(width)
    given = [n for n, v in (("scale", scale), ("short_side", short_side), ("size", size)) if v is not None]
    if len(given) != 1:
        raise RequestError(f"SeedVR2 needs exactly one target (a scale, a short side, or a width and height); "
                           f"got {', '.join(given) or 'none'}.")
    if scale is not None:
        s = _positive_finite(scale, "scale")
        out, what = (round(h * s), round(w * s)), f"scale {scale:g}"
    elif short_side is not None:
        s = _whole(short_side, "short side")
        if h <= w:
            out = (s, round(w * s / h))
        else:
            out = (round(h * s / w), s)
        what = f"short side {s}"
    else:
        if isinstance(size, (str, bytes)) or len(size) != 2:
            raise RequestError(f"SeedVR2 target size must be (width, height), got {size!r}.")
        tw, th = _whole(size[0], "target width"), _whole(size[1], "target height")
        out, what = (th, tw), f"target {tw}x{th}"
    if not (MIN_SIDE <= min(out) and max(out) <= MAX_SIDE):
        raise RequestError(f"SeedVR2 {what} turns {w}x{h} into {out[1]}x{out[0]}; each side must be "
                           f"{MIN_SIDE}..{MAX_SIDE} pixels, choose a target inside that range.")
    return out


def plan_geometry(height: int, width: int, *, scale: Optional[float] = None, short_side: Optional[int] = None,
                  size: Optional[Sequence[int]] = None, fit: str = "pad") -> Geometry:
    """Geometry for input frames of height x width (target as in `target_size`)."""
    if fit not in FITS:
        raise RequestError(f"SeedVR2 fit {fit!r} is not one of {', '.join(FITS)}.")
    rh, rw = target_size(height, width, scale=scale, short_side=short_side, size=size)
    if fit == "pad":
        mh, mw = -(-rh // MULTIPLE) * MULTIPLE, -(-rw // MULTIPLE) * MULTIPLE
        offset = ((mh - rh) // 2, (mw - rw) // 2)  # the odd pixel goes to the bottom / right
    else:
        mh, mw = rh - rh % MULTIPLE, rw - rw % MULTIPLE
        # torchvision's center_crop offsets (Python round of half the excess), as the official DivisibleCrop
        offset = (int(round((rh - mh) / 2.0)), int(round((rw - mw) / 2.0)))
    return Geometry(source=(int(height), int(width)), resized=(rh, rw), model=(mh, mw), fit=fit, offset=offset)


def padded_frame_count(frames: int) -> int:
    """Frames the model sees for `frames` input frames: 1 stays 1, else the next 4n+1 (official)."""
    if frames < 1:
        raise RequestError(f"SeedVR2 input has {frames} frames; at least 1 is needed.")
    return padded_frames(frames)


def _frames_per_chunk(pixels_per_frame: int, chunk_bytes: int, chunk_frames: Optional[int]) -> int:
    if chunk_frames is not None:
        if int(chunk_frames) < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        return int(chunk_frames)
    return max(1, int(chunk_bytes) // max(1, 4 * 3 * pixels_per_frame))


def _check_frames(frames: torch.Tensor, geometry: Geometry) -> None:
    if not isinstance(frames, torch.Tensor) or frames.dim() != 4 or frames.shape[-1] != 3:
        shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
        raise RequestError(f"SeedVR2 input must be RGB frames [frames, height, width, 3], got {shape}.")
    if frames.dtype != torch.uint8 and not frames.is_floating_point():
        raise RequestError(f"SeedVR2 input frames must be uint8 or floating point, got {frames.dtype}.")
    if tuple(frames.shape[1:3]) != geometry.source:
        raise ValueError(f"frames are {tuple(frames.shape[1:3])} (h, w) but the geometry was planned for "
                         f"{geometry.source}")


def _prepare_into(out: torch.Tensor, frames: torch.Tensor, geometry: Geometry) -> None:
    """frames [n, h, w, 3] -> out [3, n, H', W'] (any float dtype/device), one chunk."""
    x = frames.to(out.device, non_blocking=True)
    x = x.to(torch.float32).div_(255.0) if x.dtype == torch.uint8 else torch.nan_to_num(x.to(torch.float32))
    x = x.permute(0, 3, 1, 2)  # [n, 3, h, w]
    if geometry.resized != geometry.source:
        x = F.interpolate(x.contiguous(), size=geometry.resized, mode="bicubic", align_corners=False,
                          antialias=True)
    x = x.clamp_(0.0, 1.0)  # x is our own copy here; also where no resize ran: float input is only nominally 0..1
    (mh, mw), (rh, rw), (top, left) = geometry.model, geometry.resized, geometry.offset
    if geometry.fit == "crop":
        x = x[:, :, top:top + mh, left:left + mw]
    elif (mh, mw) != (rh, rw):
        x = F.pad(x, (left, mw - rw - left, top, mh - rh - top), mode="replicate")
    out.copy_(x.mul_(2.0).sub_(1.0).permute(1, 0, 2, 3))


def prepare_frames(frames: torch.Tensor, geometry: Geometry, *, dtype: torch.dtype = torch.float32,
                   device=None, chunk_frames: Optional[int] = None,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """Frames [n, h, w, 3] -> [3, n, H', W'] in [-1, 1] (`dtype`, on `device`, default the frames' device), no
    temporal padding: for one long-video batch or the colour-fix reference of a chunk of frames."""
    _check_frames(frames, geometry)
    device = frames.device if device is None else torch.device(device)
    n = frames.shape[0]
    out = torch.empty((3, n) + geometry.model, dtype=dtype, device=device)
    sh, sw = geometry.source
    step = _frames_per_chunk(sh * sw + 2 * geometry.model[0] * geometry.model[1], chunk_bytes, chunk_frames)
    for start in range(0, n, step):
        stop = min(n, start + step)
        _prepare_into(out[:, start:stop], frames[start:stop], geometry)
    return out


def prepare_video(frames: torch.Tensor, geometry: Geometry, *, dtype: torch.dtype = torch.float32, device=None,
                  chunk_frames: Optional[int] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """Frames [F, h, w, 3] -> model input [3, F', H', W'] in [-1, 1], F' = padded_frame_count(F) (last frame
    repeated). Peak memory: see the module docstring."""
    _check_frames(frames, geometry)
    total = frames.shape[0]
    padded = padded_frame_count(total)
    device = frames.device if device is None else torch.device(device)
    out = torch.empty((3, padded) + geometry.model, dtype=dtype, device=device)
    sh, sw = geometry.source
    step = _frames_per_chunk(sh * sw + 2 * geometry.model[0] * geometry.model[1], chunk_bytes, chunk_frames)
    for start in range(0, total, step):
        stop = min(total, start + step)
        _prepare_into(out[:, start:stop], frames[start:stop], geometry)
    if padded > total:
        out[:, total:] = out[:, total - 1:total]
    return out


def _quantize(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] floats -> uint8, official order: clamp(-1, 1) * 0.5 + 0.5, * 255, round (half to even); NaN reads
    as -1 (black). float32 and wider compute in float64 (except on MPS), half types in float32."""
    wide = x.dtype in (torch.float32, torch.float64) and x.device.type != "mps"
    y = torch.nan_to_num(x.to(torch.float64 if wide else torch.float32), nan=-1.0)
    return y.clamp_(-1.0, 1.0).mul_(0.5).add_(0.5).mul_(255.0).round_().to(torch.uint8)


def iter_uint8_frames(video: torch.Tensor, geometry: Geometry, frames: int, *, chunk_frames: Optional[int] = None,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[torch.Tensor]:
    """Model output [3, F', H', W'] (or [1, 3, F', H', W']) in [-1, 1] -> uint8 chunks [k, H, W, 3] in frame order
    on the video's device: the fit undone (`geometry.box`) and only the first `frames` frames (the original count)."""
    if video.dim() == 5 and video.shape[0] == 1:
        video = video[0]
    if video.dim() != 4 or video.shape[0] != 3 or tuple(video.shape[2:]) != geometry.model:
        raise ValueError(f"expected a decoded video [3, frames, {geometry.model[0]}, {geometry.model[1]}], got "
                         f"{tuple(video.shape)}")
    if not video.is_floating_point():
        raise ValueError(f"expected a floating point decoded video, got {video.dtype}")
    if not 1 <= frames <= video.shape[1]:
        raise ValueError(f"cannot cut {frames} frames from a decoded video of {video.shape[1]}")
    top, left, h, w = geometry.box
    step = _frames_per_chunk(h * w * 2, chunk_bytes, chunk_frames)  # float64 compute: 2 float32s per value
    for start in range(0, frames, step):
        stop = min(frames, start + step)
        chunk = video[:, start:stop, top:top + h, left:left + w]
        yield _quantize(chunk).permute(1, 2, 3, 0).contiguous()


def uint8_frames(video: torch.Tensor, geometry: Geometry, frames: int, *, chunk_frames: Optional[int] = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """`iter_uint8_frames` gathered: uint8 [frames, H, W, 3] on the video's device."""
    h, w = geometry.box[2:]
    out = torch.empty((frames, h, w, 3), dtype=torch.uint8, device=video.device)
    at = 0
    for chunk in iter_uint8_frames(video, geometry, frames, chunk_frames=chunk_frames, chunk_bytes=chunk_bytes):
        out[at:at + chunk.shape[0]].copy_(chunk)
        at += chunk.shape[0]
    return out
