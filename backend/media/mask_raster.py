"""Mask drawing state -> MASK frames: the rules H3 Mask Draw runs, mirrored line for line by js/mask_logic.js (the
live preview). Change both together; tests/test_mask_nodes.py checks they agree.

State JSON (the `mask_state` widget of H3 Mask Draw), version 1::

    {
      "version": 1,
      "width": 832, "height": 480,          # the coordinate space of every shape (the video's size when drawn)
      "grow": 0, "feather": 0, "invert": false,   # copies of the node's widgets (the preview uses them)
      "keyframes": [                          # any order; one per frame index at most
        {"frame": 0, "shapes": [              # painted in order, later shapes on top
          {"id": "s1", "type": "brush",  "size": 24, "points": [[x, y], ...]},   # adds a round-capped polyline
          {"id": "s2", "type": "eraser", "size": 24, "points": [[x, y], ...]},   # removes one
          {"id": "s3", "type": "rect",    "x": 10, "y": 20, "w": 100, "h": 50},  # w / h may be negative
          {"id": "s4", "type": "ellipse", "cx": 60, "cy": 40, "rx": 30, "ry": 20}
        ]}
      ]
    }

Rules (output W x H, state space sw x sh):
- Pixel (row i, column j) is tested at its centre in state space: X = (j + 0.5) * sw / W, Y = (i + 0.5) * sh / H.
  rect: x0 <= X < x1 and y0 <= Y < y1 (x0/x1 = min/max of x and x + w); ellipse: ((X-cx)/rx)^2 + ((Y-cy)/ry)^2 <= 1
  (nothing when rx or ry <= 0); brush / eraser: squared distance to the polyline (a lone point: to the point) <=
  (size / 2)^2. Brush, rect and ellipse set 1, eraser sets 0, in list order.
- Keyframes: frame t uses the last keyframe k0 with k0.frame <= t (before the first keyframe: the first one). Strokes
  are held as drawn until the next keyframe. A rect / ellipse whose id (and type) also appears in the next keyframe k1
  is linearly interpolated: p = p0 + (p1 - p0) * (t - f0) / (f1 - f0) for each of x, y, w, h / cx, cy, rx, ry. After
  the last keyframe everything holds. No keyframes: an empty mask.
- Then (Python only) an external mask is combined; then grow, feather, invert, on output pixels:
  grow g > 0: grayscale dilation by the disk of radius g (row offset dy reaches columns |dx| <= isqrt(g^2 - dy^2));
  g < 0: erosion by |g| (1 - dilate(1 - m)); outside the frame counts as 0 for dilation (the frame edge does not
  erode). feather f > 0: three box-blur passes (radius ceil(f / 3), horizontal then vertical, edges replicated).
  invert: 1 - m.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

SCHEMA_VERSION = 1
SHAPE_TYPES = ("brush", "eraser", "rect", "ellipse")
COMBINE_MODES = ("replace", "union", "intersect", "subtract")
_INTERP_KEYS = {"rect": ("x", "y", "w", "h"), "ellipse": ("cx", "cy", "rx", "ry")}


def empty_state(width: int = 512, height: int = 512) -> dict:
    return {"version": SCHEMA_VERSION, "width": int(width), "height": int(height), "grow": 0, "feather": 0,
            "invert": False, "keyframes": []}


def parse_state(text: Any) -> dict:
    """The state from the widget's JSON string (or a dict); '' -> an empty state. ValueError on malformed input."""
    if isinstance(text, dict):
        state = text
    else:
        text = (text or "").strip()
        if not text:
            return empty_state()
        try:
            state = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"mask_state is not valid JSON: {exc}") from exc
    if not isinstance(state, dict):
        raise ValueError("mask_state must be a JSON object")
    width, height = float(state.get("width") or 0), float(state.get("height") or 0)
    if width <= 0 or height <= 0:
        raise ValueError(f"mask_state needs a positive width and height, got {width} x {height}")
    keyframes = state.get("keyframes") or []
    if not isinstance(keyframes, list):
        raise ValueError("mask_state.keyframes must be a list")
    for kf in keyframes:
        if not isinstance(kf, dict) or not isinstance(kf.get("shapes", []), list):
            raise ValueError("each keyframe needs a frame index and a list of shapes")
        for shape in kf.get("shapes", []):
            if not isinstance(shape, dict) or shape.get("type") not in SHAPE_TYPES:
                raise ValueError(f"unknown shape {shape!r}: type must be one of {SHAPE_TYPES}")
    return state


def _sorted_keyframes(state: dict) -> list[dict]:
    return sorted(state.get("keyframes") or [], key=lambda kf: int(kf.get("frame", 0)))


def shapes_at(state: dict, t: int) -> list[dict]:
    """The shapes drawn on frame t (interpolated / held per the module rules)."""
    kfs = _sorted_keyframes(state)
    if not kfs:
        return []
    idx = -1
    for k, kf in enumerate(kfs):
        if int(kf.get("frame", 0)) <= t:
            idx = k
    if idx < 0:
        return list(kfs[0].get("shapes") or [])
    k0 = kfs[idx]
    k1 = kfs[idx + 1] if idx + 1 < len(kfs) else None
    if k1 is None:
        return list(k0.get("shapes") or [])
    f0, f1 = int(k0["frame"]), int(k1["frame"])
    a = (t - f0) / (f1 - f0)
    nxt = {(s.get("id"), s.get("type")): s for s in k1.get("shapes") or []}
    out = []
    for shape in k0.get("shapes") or []:
        keys = _INTERP_KEYS.get(shape.get("type"))
        other = nxt.get((shape.get("id"), shape.get("type"))) if keys and shape.get("id") is not None else None
        if other is None:
            out.append(shape)
            continue
        moved = dict(shape)
        for key in keys:
            p0, p1 = float(shape.get(key, 0)), float(other.get(key, 0))
            moved[key] = p0 + (p1 - p0) * a
        out.append(moved)
    return out


def _span(lo: float, hi: float, scale: float, n: int) -> tuple[int, int]:
    """Pixel indices [a, b) whose centres (k + 0.5) * (1 / scale) may fall in [lo, hi] (generous by one)."""
    a = max(0, int(math.floor(lo * scale - 0.5)) - 1)
    b = min(n, int(math.ceil(hi * scale - 0.5)) + 2)
    return a, max(a, b)


def _shape_patch(shape: dict, sw: float, sh: float, width: int, height: int):
    """(row0, col0, bool patch) covering the shape, or None when it covers no pixel centre."""
    kind = shape["type"]
    sx, sy = width / sw, height / sh
    if kind == "rect":
        x, y, w, h = (float(shape.get(k, 0)) for k in ("x", "y", "w", "h"))
        x0, x1, y0, y1 = min(x, x + w), max(x, x + w), min(y, y + h), max(y, y + h)
    elif kind == "ellipse":
        cx, cy, rx, ry = (float(shape.get(k, 0)) for k in ("cx", "cy", "rx", "ry"))
        if rx <= 0 or ry <= 0:
            return None
        x0, x1, y0, y1 = cx - rx, cx + rx, cy - ry, cy + ry
    else:
        pts = [(float(p[0]), float(p[1])) for p in shape.get("points") or []]
        if not pts:
            return None
        r = float(shape.get("size", 1)) / 2
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1, y0, y1 = min(xs) - r, max(xs) + r, min(ys) - r, max(ys) + r
    c0, c1 = _span(x0, x1, sx, width)
    r0, r1 = _span(y0, y1, sy, height)
    if c1 <= c0 or r1 <= r0:
        return None
    X = ((np.arange(c0, c1, dtype=np.float64) + 0.5) * sw / width)[None, :]
    Y = ((np.arange(r0, r1, dtype=np.float64) + 0.5) * sh / height)[:, None]
    if kind == "rect":
        patch = (X >= x0) & (X < x1) & (Y >= y0) & (Y < y1)
    elif kind == "ellipse":
        patch = ((X - cx) / rx) ** 2 + ((Y - cy) / ry) ** 2 <= 1
    else:
        r2 = r * r
        patch = np.zeros((r1 - r0, c1 - c0), dtype=bool)
        segs = list(zip(pts[:-1], pts[1:])) if len(pts) > 1 else [(pts[0], pts[0])]
        for (ax, ay), (bx, by) in segs:
            dx, dy = bx - ax, by - ay
            l2 = dx * dx + dy * dy
            if l2 > 0:
                u = np.clip(((X - ax) * dx + (Y - ay) * dy) / l2, 0.0, 1.0)
            else:
                u = np.zeros((1, 1))
            qx, qy = ax + u * dx, ay + u * dy
            patch |= (X - qx) ** 2 + (Y - qy) ** 2 <= r2
    return r0, c0, patch


def rasterize_shapes(shapes: list[dict], sw: float, sh: float, width: int, height: int,
                     cache: dict | None = None) -> np.ndarray:
    """Hard float32 mask [H, W] of one frame's shapes."""
    out = np.zeros((height, width), dtype=np.float32)
    for shape in shapes:
        key = json.dumps(shape, sort_keys=True) if cache is not None else None
        if cache is not None and key in cache:
            found = cache[key]
        else:
            found = _shape_patch(shape, sw, sh, width, height)
            if cache is not None:
                cache[key] = found
        if found is None:
            continue
        r0, c0, patch = found
        view = out[r0:r0 + patch.shape[0], c0:c0 + patch.shape[1]]
        view[patch] = 0.0 if shape["type"] == "eraser" else 1.0
    return out


def rasterize_state(state: Any, frame_count: int, height: int, width: int) -> torch.Tensor:
    """Hard masks [T, H, W] float32 of the drawing (no grow / feather / invert)."""
    state = parse_state(state)
    sw, sh = float(state["width"]), float(state["height"])
    out = torch.zeros((frame_count, height, width), dtype=torch.float32)
    cache: dict = {}
    previous_key, previous = None, None
    for t in range(frame_count):
        shapes = shapes_at(state, t)
        key = json.dumps(shapes, sort_keys=True)
        if key != previous_key:
            previous = torch.from_numpy(rasterize_shapes(shapes, sw, sh, width, height, cache))
            previous_key = key
        out[t] = previous
    return out


def fit_mask(mask: torch.Tensor, frame_count: int, height: int, width: int) -> torch.Tensor:
    """A MASK ([H, W] or [B, H, W]) -> [T, H, W] float32: resized bilinearly, frames past its end hold its last."""
    mask = mask.detach().to("cpu", torch.float32)
    if mask.ndim == 2:
        mask = mask[None]
    if mask.ndim == 4 and mask.shape[-1] == 1:
        mask = mask[..., 0]
    if mask.ndim != 3 or mask.shape[0] < 1:
        raise ValueError(f"mask must be a MASK [frames, height, width], got {tuple(mask.shape)}")
    if tuple(mask.shape[1:]) != (height, width):
        mask = F.interpolate(mask[:, None], size=(height, width), mode="bilinear", align_corners=False)[:, 0]
    if mask.shape[0] >= frame_count:
        return mask[:frame_count].clamp(0, 1)
    tail = mask[-1:].expand(frame_count - mask.shape[0], -1, -1)
    return torch.cat([mask, tail]).clamp(0, 1)


def combine_masks(drawn: torch.Tensor, external: torch.Tensor, mode: str, hard_replace: torch.Tensor | None = None):
    """union = max, intersect = min, subtract = drawn minus external (clamped). replace: the external mask is the
    canvas the drawing is painted on (brush / rect / ellipse add, the eraser removes); needs `hard_replace`, the
    result of painting the shapes over it (see H3 Mask Draw)."""
    if mode == "union":
        return torch.maximum(drawn, external)
    if mode == "intersect":
        return torch.minimum(drawn, external)
    if mode == "subtract":
        return (drawn - external).clamp(0, 1)
    if mode == "replace":
        return hard_replace if hard_replace is not None else external
    raise ValueError(f"combine mode must be one of {COMBINE_MODES}, got {mode!r}")


def paint_over(state: Any, base: torch.Tensor) -> torch.Tensor:
    """Paint the drawing's shapes over `base` [T, H, W] (add = 1, eraser = 0)."""
    state = parse_state(state)
    frames, height, width = base.shape
    sw, sh = float(state["width"]), float(state["height"])
    out = base.clone()
    cache: dict = {}
    for t in range(frames):
        for shape in shapes_at(state, t):
            key = json.dumps(shape, sort_keys=True)
            if key not in cache:
                cache[key] = _shape_patch(shape, sw, sh, width, height)
            found = cache[key]
            if found is None:
                continue
            r0, c0, patch = found
            view = out[t, r0:r0 + patch.shape[0], c0:c0 + patch.shape[1]]
            view[torch.from_numpy(patch)] = 0.0 if shape["type"] == "eraser" else 1.0
    return out


def _dilate(masks: torch.Tensor, radius: int) -> torch.Tensor:
    frames, height, width = masks.shape
    padded = F.pad(masks, (0, 0, radius, radius))  # zero rows above / below
    out = torch.zeros_like(masks)
    for dy in range(-radius, radius + 1):
        half = math.isqrt(radius * radius - dy * dy)
        band = padded[:, radius + dy: radius + dy + height]
        if half:
            band = F.max_pool1d(F.pad(band.reshape(-1, 1, width), (half, half)), 2 * half + 1, stride=1)
            band = band.reshape(frames, height, width)
        out = torch.maximum(out, band)
    return out


def _box(masks: torch.Tensor, radius: int, dim: int) -> torch.Tensor:
    moved = masks.movedim(dim, -1)
    shape = moved.shape
    flat = moved.reshape(-1, 1, shape[-1])
    flat = F.avg_pool1d(F.pad(flat, (radius, radius), mode="replicate"), 2 * radius + 1, stride=1)
    return flat.reshape(shape).movedim(-1, dim)


def grow_feather_invert(masks: torch.Tensor, grow: int = 0, feather: int = 0, invert: bool = False) -> torch.Tensor:
    """Grow (dilate / erode by a disk), feather (3 box-blur passes) and invert, per the module rules."""
    masks = masks.to(torch.float32)
    grow = int(grow)
    if grow > 0:
        masks = _dilate(masks, grow)
    elif grow < 0:
        masks = 1.0 - _dilate(1.0 - masks, -grow)
    if int(feather) > 0:
        radius = math.ceil(int(feather) / 3)
        for _ in range(3):
            masks = _box(_box(masks, radius, 2), radius, 1)
    if invert:
        masks = 1.0 - masks
    return masks.clamp(0, 1).contiguous()


def render_state(state: Any, frame_count: int, height: int, width: int, grow: int | None = None,
                 feather: int | None = None, invert: bool | None = None) -> torch.Tensor:
    """The drawing with its grow / feather / invert (the state's own unless given): what the JS preview shows."""
    state = parse_state(state)
    masks = rasterize_state(state, frame_count, height, width)
    return grow_feather_invert(masks, state.get("grow", 0) if grow is None else grow,
                               state.get("feather", 0) if feather is None else feather,
                               bool(state.get("invert", False)) if invert is None else invert)
