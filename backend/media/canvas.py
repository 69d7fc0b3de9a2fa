"""MiniMax-H3's canvas rule: an aspect ratio -> the frame size the model takes (short edge 768, at most 768*1344
pixels, multiples of 32, aspects 1:4 to 4:1). Pure arithmetic, stated once: media fits decoded frames to it
(resize.py, the "H3 canvas" mode) and the H3 pipeline sizes its requests with it (pipelines/h3/geometry.py)."""

from __future__ import annotations

from ..errors import RequestError

CANVAS_SHORT_EDGE = 768
CANVAS_MAX_PIXELS = 768 * 1344
MIN_ASPECT, MAX_ASPECT = 1 / 4, 4.0


def resolve_canvas(aspect_w: float, aspect_h: float, multiple: int = 32, short_edge: int = CANVAS_SHORT_EDGE,
                   max_pixels: int = CANVAS_MAX_PIXELS) -> tuple[int, int]:
    """Aspect ratio (or source size) -> (height, width) on H3's canvas rule."""
    if aspect_w <= 0 or aspect_h <= 0:
        raise RequestError(f"Aspect ratio must be positive, got {aspect_w}:{aspect_h}.")
    ratio = aspect_w / aspect_h
    if not MIN_ASPECT <= ratio <= MAX_ASPECT:
        raise RequestError(f"MiniMax-H3 supports aspect ratios 1:4 to 4:1, got {aspect_w}:{aspect_h} ({ratio:.3g}).")
    width, height = (short_edge * ratio, float(short_edge)) if ratio >= 1 else (float(short_edge), short_edge / ratio)
    if width * height > max_pixels:
        scale = (max_pixels / (width * height)) ** 0.5
        width, height = width * scale, height * scale
    return max(multiple, round(height / multiple) * multiple), max(multiple, round(width / multiple) * multiple)
