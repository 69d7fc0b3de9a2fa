"""Float video <-> uint8 frames, on the tensor's own device, in bounded chunks.

Contracts:
- float video: `[T, H, W, 3]` (ComfyUI IMAGE layout, frames-first) or `[1, 3, T, H, W]` (a VAE decoder's output),
  any floating dtype, values nominally in [0, 1]; anything outside is clamped and NaN reads as 0.
- uint8 frames: `[T, H, W, 3]`, contiguous, on the same device as the input.
- IMAGE: `[B, H, W, C]` float32 in [0, 1] (ComfyUI's type), B = frames.

Quantisation is `round_half_even(clamp(x, 0, 1) * 255)`, computed so that it equals the same expression evaluated in
float64 for every input value: half-precision inputs (bf16, fp16) are exact in float32, float32 inputs are computed in
float64 (exact: 24 + 8 mantissa bits fit in 53). Devices without float64 (MPS) fall back to float32, which can differ
from the float64 result by one level for values within an ulp of a rounding tie.

Peak extra memory is one chunk of the compute dtype (`chunk_bytes`, default 256 MiB), not a full float copy: a 15-s
1080p clip is 9 GB as float32 but 0.75 GB as uint8.
"""

from __future__ import annotations

from typing import Iterator

import torch

DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024


def _compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if device.type == "mps":
        return torch.float32
    return torch.float64


def _frames_per_chunk(height: int, width: int, channels: int, itemsize: int, chunk_bytes: int) -> int:
    return max(1, int(chunk_bytes) // max(1, height * width * channels * itemsize))


def _as_frames_last(video: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Return (video, channels_first). channels_first means `video` is `[3, T, H, W]` (batch dim dropped)."""
    if not isinstance(video, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor video, got {type(video).__name__}")
    if not video.is_floating_point():
        raise TypeError(f"expected a floating point video in [0, 1], got dtype {video.dtype}")
    if video.ndim == 4 and video.shape[-1] == 3:
        return video, False
    if video.ndim == 5 and video.shape[1] == 3:
        if video.shape[0] != 1:
            raise ValueError(f"a [B, 3, T, H, W] video must have B == 1, got shape {tuple(video.shape)}")
        return video[0], True
    raise ValueError(
        f"expected a float video [T, H, W, 3] or [1, 3, T, H, W], got shape {tuple(video.shape)}"
    )


def _quantize(chunk: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    x = chunk.to(compute_dtype)
    x = torch.nan_to_num(x, nan=0.0).clamp_(0.0, 1.0).mul_(255.0)
    return torch.round(x).to(torch.uint8)  # torch.round rounds half to even


def iter_uint8_chunks(
    video: torch.Tensor, chunk_frames: int | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[torch.Tensor]:
    """Yield uint8 `[t, H, W, 3]` chunks of `video` in order, on `video.device`.

    Use this to stream frames into an encoder (convert a chunk, copy it to the host, encode it) without ever holding
    the whole clip as uint8 either. `chunk_frames` overrides the size picked from `chunk_bytes`.
    """
    frames, channels_first = _as_frames_last(video)
    if channels_first:
        _, total, height, width = frames.shape
    else:
        total, height, width, _ = frames.shape
    compute_dtype = _compute_dtype(frames.dtype, frames.device)
    step = chunk_frames or _frames_per_chunk(
        height, width, 3, torch.empty((), dtype=compute_dtype).element_size(), chunk_bytes
    )
    if step < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    for start in range(0, total, step):
        stop = min(total, start + step)
        if channels_first:
            out = _quantize(frames[:, start:stop], compute_dtype).permute(1, 2, 3, 0).contiguous()
        else:
            out = _quantize(frames[start:stop], compute_dtype)
        yield out


def video_to_uint8(
    video: torch.Tensor, chunk_frames: int | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> torch.Tensor:
    """Float video ([T, H, W, 3] or [1, 3, T, H, W], 0..1) -> uint8 [T, H, W, 3] on the same device."""
    frames, channels_first = _as_frames_last(video)
    if channels_first:
        _, total, height, width = frames.shape
    else:
        total, height, width, _ = frames.shape
    out = torch.empty((total, height, width, 3), dtype=torch.uint8, device=frames.device)
    start = 0
    for chunk in iter_uint8_chunks(video, chunk_frames=chunk_frames, chunk_bytes=chunk_bytes):
        out[start : start + chunk.shape[0]].copy_(chunk)
        start += chunk.shape[0]
    return out


def uint8_to_image(
    frames: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    chunk_frames: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """uint8 frames [T, H, W, C] -> ComfyUI IMAGE [T, H, W, C] in `dtype` (default float32), value / 255.

    Stays on the frames' device; the caller moves it (ComfyUI keeps IMAGE tensors on the CPU).
    """
    if not isinstance(frames, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor of uint8 frames, got {type(frames).__name__}")
    if frames.dtype != torch.uint8:
        raise TypeError(f"expected uint8 frames, got dtype {frames.dtype}")
    if frames.ndim != 4:
        raise ValueError(f"expected uint8 frames [T, H, W, C], got shape {tuple(frames.shape)}")
    total, height, width, channels = frames.shape
    out = torch.empty((total, height, width, channels), dtype=dtype, device=frames.device)
    step = chunk_frames or _frames_per_chunk(height, width, channels, out.element_size(), chunk_bytes)
    for start in range(0, total, step):
        stop = min(total, start + step)
        torch.div(frames[start:stop].to(dtype), 255.0, out=out[start:stop])
    return out
