"""RGB -> YUV 4:2:0 (BT.709, limited range) on the frames' own device, for the encoder's fast path.

Why: with a GPU decoder feeding libx264 the CPU work per frame was the RGB -> YUV conversion (swscale) plus the
encoder itself, and it competed with the thread that launches the decoder's kernels (docs/BENCHMARKS.md, "Decode
streamed into the MP4"). Converting on the GPU moves that work off the CPU and halves the bytes that cross to the host
again (1.5 bytes per pixel instead of 3).

Contract (`rgb_to_yuv420p`): uint8 RGB frames [t, H, W, 3] (H, W even) -> uint8 [t, H * 3 // 2, W], each frame the
three planes stacked as PyAV's `VideoFrame.from_ndarray(..., format="yuv420p")` reads them: Y [H, W], then U [H/2, W/2]
and V [H/2, W/2] laid out row-major in the next H/2 rows (U's H/4 rows of W, then V's). Values (r, g, b in 0..1):

    y' = 0.2126 r + 0.7152 g + 0.0722 b
    Y  = 16 + 219 y'                     Cb = 128 + 224 (b - y') / 1.8556     Cr = 128 + 224 (r - y') / 1.5748

rounded to nearest; chroma is the mean of each 2x2 block of Cb / Cr (centre-sited). swscale (the CPU path) lands
within one code value of this on Y and within a few on chroma (it filters chroma with a wider kernel).
"""

from __future__ import annotations

import torch

KR, KB = 0.2126, 0.0722
KG = 1.0 - KR - KB


def rgb_to_yuv420p(frames: torch.Tensor) -> torch.Tensor:
    """uint8 [t, H, W, 3] RGB -> uint8 [t, H * 3 // 2, W] planar YUV 4:2:0 (layout and rule in the module docstring)."""
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames [t, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
    t, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise ValueError(f"YUV 4:2:0 needs an even width and height, got {width}x{height}")
    rgb = frames.float().div_(255.0)  # float32 on every device: the rounding must not depend on it
    r, g, b = rgb.unbind(-1)
    luma = r * KR + g * KG + b * KB
    y = luma.mul(219.0).add_(16.0)
    cb = (b - luma).mul_(224.0 / (2.0 * (1.0 - KB))).add_(128.0)
    cr = (r - luma).mul_(224.0 / (2.0 * (1.0 - KR))).add_(128.0)

    def half(plane: torch.Tensor) -> torch.Tensor:  # mean of each 2x2 block
        return plane.reshape(t, height // 2, 2, width // 2, 2).mean(dim=(2, 4))

    out = torch.empty((t, height * 3 // 2, width), dtype=torch.uint8, device=frames.device)
    out[:, :height] = y.round_().clamp_(0, 255).to(torch.uint8)
    chroma = out[:, height:].reshape(t, 2, height * width // 4)
    chroma[:, 0] = half(cb).round_().clamp_(0, 255).to(torch.uint8).reshape(t, -1)
    chroma[:, 1] = half(cr).round_().clamp_(0, 255).to(torch.uint8).reshape(t, -1)
    return out


def yuv420p_to_rgb(planes: torch.Tensor) -> torch.Tensor:
    """The inverse (for tests and previews): uint8 [t, H * 3 // 2, W] -> float32 RGB [t, H, W, 3] in 0..1 (chroma
    repeated over each 2x2 block; not clamped, so a round trip shows the conversion's own error)."""
    t, rows, width = planes.shape
    height = rows * 2 // 3
    p = planes.to(torch.float64 if planes.device.type == "cpu" else torch.float32)
    y = (p[:, :height] - 16.0) / 219.0
    chroma = p[:, height:].reshape(t, 2, height // 2, width // 2)
    cb = (chroma[:, 0] - 128.0) / 224.0 * (2.0 * (1.0 - KB))
    cr = (chroma[:, 1] - 128.0) / 224.0 * (2.0 * (1.0 - KR))
    cb = cb.repeat_interleave(2, 1).repeat_interleave(2, 2)
    cr = cr.repeat_interleave(2, 1).repeat_interleave(2, 2)
    r = y + cr
    b = y + cb
    g = (y - KR * r - KB * b) / KG
    return torch.stack([r, g, b], dim=-1).float()
