"""SeedVR2 colour fix: pull the restored frames' colours back to the input's, per frame.

Both tensors are `[3, F, H, W]` in [-1, 1] (the model's layout): `x` the decoded output, `ref` the preprocessed input
frames of the same size (the model input before temporal padding, or any chunk of frames of it). Work runs per chunk
of frames in float32 (float64 when `x` is float64); the result has x's dtype and device.

Methods:
- "wavelet" (official, StableSR's wavelet reconstruction, written from its math): low(v) = five passes of the
  depthwise 3x3 kernel [[1,2,1],[2,4,2],[1,2,1]]/16 with dilation r and replicate padding r, r = 1, 2, 4, 8, 16,
  each pass on the previous pass's output; result = (x - low(x)) + low(ref): x's detail on the input's colours.
- "adain": per frame and channel, (x - mean(x)) / std(x) * std(ref) + mean(ref), std = sqrt(unbiased var + 1e-5)
  (StableSR's adaptive instance normalisation).
- "lab": frames (clamped to [0, 1] RGB, read as sRGB with a D65 white) to CIELAB; per frame, the a and b channels
  (and L when match_luminance) get the AdaIN above (mean and std of ref, same std definition); back to sRGB. L is
  kept by default, so the restored lightness and detail stay; only the chroma statistics follow the input. The
  result is not clamped (out-of-gamut values are clipped when quantised).
- "none": x unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

WAVELET_LEVELS = 5
ADAIN_EPS = 1e-5
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024

# sRGB primaries, D65 (IEC 61966-2-1); the white point is the matrix applied to RGB (1, 1, 1), so white is (100, 0, 0).
_RGB_TO_XYZ = ((0.4124564, 0.3575761, 0.1804375),
               (0.2126729, 0.7151522, 0.0721750),
               (0.0193339, 0.1191920, 0.9503041))
_DELTA = 6.0 / 29.0


# linear RGB -> XYZ / white (rows divided by the white point) and its inverse, float64, computed once
_TO_XYZN = [[v / sum(row) for v in row] for row in _RGB_TO_XYZ]
_FROM_XYZN = torch.linalg.inv(torch.tensor(_TO_XYZN, dtype=torch.float64)).tolist()


def wavelet_low(v: torch.Tensor, levels: int = WAVELET_LEVELS) -> torch.Tensor:
    """Low-frequency part of frames v [N, C, H, W]: `levels` dilated 3x3 blurs, radius 1, 2, 4, ..."""
    c = v.shape[1]
    k = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]], dtype=v.dtype, device=v.device) / 16.0
    k = k.expand(c, 1, 3, 3)
    for i in range(levels):
        r = 2 ** i
        v = F.conv2d(F.pad(v, (r, r, r, r), mode="replicate"), k, groups=c, dilation=r)
    return v


def _adain(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per (frame, channel) over the spatial axes: x [N, C, H, W] with ref's mean and std."""
    xm, rm = x.mean(dim=(2, 3), keepdim=True), ref.mean(dim=(2, 3), keepdim=True)
    xs = (x.var(dim=(2, 3), keepdim=True, unbiased=True) + ADAIN_EPS).sqrt()
    rs = (ref.var(dim=(2, 3), keepdim=True, unbiased=True) + ADAIN_EPS).sqrt()
    return (x - xm) / xs * rs + rm


def _mix(m, v: torch.Tensor) -> torch.Tensor:
    """3x3 matrix (nested tuples/lists of floats) times the channels (dim 1) of v, as elementwise sums: the same
    result whatever the chunk of frames (a batched matmul may reduce in a different order per shape)."""
    c = v.unbind(dim=1)
    return torch.stack([row[0] * c[0] + row[1] * c[1] + row[2] * c[2] for row in m], dim=1)


def rgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """sRGB in [0, 1], channels on dim 1 ([N, 3, ...]) -> CIELAB (L 0..100, a, b), D65 white."""
    lin = torch.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055).clamp(min=0) ** 2.4)
    xyz = _mix(_TO_XYZN, lin)
    f = torch.where(xyz > _DELTA ** 3, xyz.clamp(min=0) ** (1.0 / 3.0), xyz / (3 * _DELTA ** 2) + 4.0 / 29.0)
    fx, fy, fz = f[:, 0], f[:, 1], f[:, 2]
    return torch.stack((116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)), dim=1)


def lab_to_rgb(lab: torch.Tensor) -> torch.Tensor:
    """Inverse of `rgb_to_lab`; values outside the sRGB gamut come back outside [0, 1] (not clamped)."""
    fy = (lab[:, 0] + 16.0) / 116.0
    f = torch.stack((fy + lab[:, 1] / 500.0, fy, fy - lab[:, 2] / 200.0), dim=1)
    xyz = torch.where(f > _DELTA, f ** 3, 3 * _DELTA ** 2 * (f - 4.0 / 29.0))
    lin = _mix(_FROM_XYZN, xyz)
    # the encoding's linear segment also carries negative (out-of-gamut) values; the power branch only sees > 0.0031
    return torch.where(lin <= 0.0031308, lin * 12.92, 1.055 * lin.clamp(min=0.0031308) ** (1.0 / 2.4) - 0.055)


def _lab_fix(x: torch.Tensor, ref: torch.Tensor, match_luminance: bool) -> torch.Tensor:
    to01 = lambda v: v.mul(0.5).add(0.5).clamp(0.0, 1.0)  # noqa: E731
    lx, lr = rgb_to_lab(to01(x)), rgb_to_lab(to01(ref))
    first = 0 if match_luminance else 1
    lx = torch.cat((lx[:, :first], _adain(lx[:, first:], lr[:, first:])), dim=1)
    return lab_to_rgb(lx).mul(2.0).sub(1.0)


def _wavelet_fix(x: torch.Tensor, ref: torch.Tensor, match_luminance: bool) -> torch.Tensor:
    return x - wavelet_low(x) + wavelet_low(ref)


def _adain_fix(x: torch.Tensor, ref: torch.Tensor, match_luminance: bool) -> torch.Tensor:
    return _adain(x, ref)


# The modes by name, in the order the node lists them: fix(x, ref, match_luminance) on [n, 3, H, W] chunks; "none"
# copies x. The one declaration of the modes: the node's choices, the CLI's and the request's check read it, so a new
# mode is one entry here.
METHODS = {"wavelet": _wavelet_fix, "adain": _adain_fix, "lab": _lab_fix, "none": None}


def _fix_frames(x: torch.Tensor, ref: torch.Tensor, method: str, match_luminance: bool) -> torch.Tensor:
    """x, ref [n, 3, H, W] compute dtype -> fixed [n, 3, H, W]."""
    fix = METHODS.get(method) if isinstance(method, str) else None
    if fix is None:
        raise ValueError(unknown_method(method))
    return fix(x, ref, match_luminance)


def unknown_method(method) -> str:
    return f"Colour fix {method!r} is not one of {', '.join(METHODS)}."


def color_fix(x: torch.Tensor, ref: torch.Tensor, method: str = "wavelet", *, match_luminance: bool = False,
              out: Optional[torch.Tensor] = None, chunk_frames: Optional[int] = None,
              chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """x, ref [3, F, H, W] in [-1, 1] -> x colour-fixed by `method` ([3, F, H, W], x's dtype and device).
    `out` may be x itself (in place; each chunk is read before it is written). ref may live on another device (each
    chunk is moved to x's). match_luminance: "lab" only, also match L. Peak extra memory: one chunk (chunk_bytes,
    about 8 float32 frames' worth of temporaries per frame in the chunk, at least one frame)."""
    if method not in METHODS:
        raise ValueError(unknown_method(method))
    if x.dim() != 4 or x.shape[0] != 3 or tuple(ref.shape) != tuple(x.shape):
        raise ValueError(f"colour fix needs x and ref of one shape [3, frames, H, W], got {tuple(x.shape)} and "
                         f"{tuple(ref.shape)}")
    if out is None:
        out = x.clone() if METHODS[method] is None else torch.empty_like(x)
    elif out.shape != x.shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(x.shape)}")
    if METHODS[method] is None:
        if out.data_ptr() != x.data_ptr():
            out.copy_(x)
        return out
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    _, frames, h, w = x.shape
    step = chunk_frames or max(1, int(chunk_bytes) // (8 * 3 * h * w * 4))
    for start in range(0, frames, step):
        stop = min(frames, start + step)
        xc = x[:, start:stop].to(compute).permute(1, 0, 2, 3)
        rc = ref[:, start:stop].to(x.device, compute, non_blocking=True).permute(1, 0, 2, 3)
        out[:, start:stop] = _fix_frames(xc, rc, method, match_luminance).permute(1, 0, 2, 3)
    return out
