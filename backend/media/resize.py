"""Fit decoded frames to a size: MiniMax-H3's canvas, the nearest multiple of 32, or a target, keeping the aspect ratio
by cropping or padding. Pure size arithmetic plus one per-frame resampler; no ComfyUI imports.

Choice of resampler: PIL's LANCZOS on each uint8 frame (Pillow's SIMD path). It keeps frames uint8 end to end (no
float32 copy of a chunk on the host), is a proper low-pass filter when downscaling (a 4K phone clip to 1344x768 does not
alias) and runs frame by frame inside the decode loop, so a long 4K file never holds its full-size frames.

Contract of `ResizePlan`: a source frame `[src_h, src_w, 3]` uint8 is scaled to `scaled_w x scaled_h`, then
- fit "crop": the centred `out_w x out_h` window of the scaled frame is kept (scaled >= out in both axes);
- fit "pad": the scaled frame is placed centred on a black `out_w x out_h` frame (scaled <= out in both axes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .canvas import MAX_ASPECT, MIN_ASPECT, resolve_canvas

RESIZE_MODES = ("none", "H3 canvas", "multiple of 32", "target size")
FIT_MODES = ("crop", "pad")
CANVAS_MULTIPLE = 32


@dataclass(frozen=True)
class ResizePlan:
    src_w: int
    src_h: int
    out_w: int
    out_h: int
    scaled_w: int
    scaled_h: int
    fit: str

    @property
    def identity(self) -> bool:
        return (self.src_w, self.src_h) == (self.out_w, self.out_h) == (self.scaled_w, self.scaled_h)


def _round_multiple(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


def h3_canvas_size(src_w: int, src_h: int) -> tuple[int, int]:
    """(width, height) of MiniMax-H3's canvas for this source's aspect (short edge 768, area cap 768*1344, multiple 32;
    aspects beyond 1:4 .. 4:1 are clamped there and the fit crops or pads the rest)."""
    ratio = min(max(src_w / src_h, MIN_ASPECT), MAX_ASPECT)
    height, width = resolve_canvas(ratio, 1.0, multiple=CANVAS_MULTIPLE)
    return width, height


def plan_resize(src_w: int, src_h: int, mode: str = "none", fit: str = "crop", width: int = 0,
                height: int = 0) -> ResizePlan | None:
    """Size arithmetic for `mode` (one of RESIZE_MODES) and `fit` (crop / pad); None when nothing changes.

    "H3 canvas": `h3_canvas_size`; "multiple of 32": the source size rounded to the nearest multiple of 32 (at least
    32); "target size": exactly `width x height`. Raises ValueError naming the bad value."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {mode!r}")
    if fit not in FIT_MODES:
        raise ValueError(f"fit must be one of {FIT_MODES}, got {fit!r}")
    if src_w < 1 or src_h < 1:
        raise ValueError(f"source size must be positive, got {src_w}x{src_h}")
    if mode == "none":
        return None
    if mode == "H3 canvas":
        out_w, out_h = h3_canvas_size(src_w, src_h)
    elif mode == "multiple of 32":
        out_w, out_h = _round_multiple(src_w, CANVAS_MULTIPLE), _round_multiple(src_h, CANVAS_MULTIPLE)
    else:
        if int(width) < 2 or int(height) < 2:
            raise ValueError(f"target size must be at least 2x2, got {width}x{height}")
        out_w, out_h = int(width), int(height)
    if fit == "crop":
        scale = max(out_w / src_w, out_h / src_h)
        scaled_w, scaled_h = max(out_w, round(src_w * scale)), max(out_h, round(src_h * scale))
    else:
        scale = min(out_w / src_w, out_h / src_h)
        scaled_w, scaled_h = min(out_w, max(1, round(src_w * scale))), min(out_h, max(1, round(src_h * scale)))
    plan = ResizePlan(src_w, src_h, out_w, out_h, scaled_w, scaled_h, fit)
    return None if plan.identity else plan


def apply_resize(image: np.ndarray, plan: ResizePlan | None) -> np.ndarray:
    """uint8 `[src_h, src_w, 3]` -> uint8 `[out_h, out_w, 3]` (see the module contract)."""
    if plan is None:
        return image
    if image.shape[:2] != (plan.src_h, plan.src_w):
        raise ValueError(
            f"frame is {image.shape[1]}x{image.shape[0]}, the resize plan expects {plan.src_w}x{plan.src_h}"
        )
    from PIL import Image

    if (plan.scaled_w, plan.scaled_h) != (plan.src_w, plan.src_h):
        scaled = np.array(Image.fromarray(image).resize((plan.scaled_w, plan.scaled_h), Image.Resampling.LANCZOS))
    else:
        scaled = image
    if plan.fit == "crop":
        x0, y0 = (plan.scaled_w - plan.out_w) // 2, (plan.scaled_h - plan.out_h) // 2
        return np.ascontiguousarray(scaled[y0 : y0 + plan.out_h, x0 : x0 + plan.out_w])
    out = np.zeros((plan.out_h, plan.out_w, 3), dtype=np.uint8)
    x0, y0 = (plan.out_w - plan.scaled_w) // 2, (plan.out_h - plan.scaled_h) // 2
    out[y0 : y0 + plan.scaled_h, x0 : x0 + plan.scaled_w] = scaled
    return out


def resize_frames(frames, plan: ResizePlan | None):
    """uint8 torch `[T, H, W, 3]` (CPU) -> uint8 `[T, out_h, out_w, 3]`, frame by frame (for videos already decoded)."""
    import torch

    if plan is None:
        return frames
    out = torch.empty((frames.shape[0], plan.out_h, plan.out_w, 3), dtype=torch.uint8)
    for index in range(frames.shape[0]):
        out[index].copy_(torch.from_numpy(apply_resize(frames[index].cpu().numpy(), plan)))
    return out
