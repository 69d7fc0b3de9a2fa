"""Mask drawing state -> MASK frames: the rules H3 Mask Draw runs, mirrored line for line by js/mask_logic.js (the
live preview). Change both together; tests/nodes/test_mask_nodes.py checks they agree.

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
from typing import Any, Callable

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
    width, height = state.get("width") or 0, state.get("height") or 0
    if not _is_number(width) or not _is_number(height) or width <= 0 or height <= 0:
        raise ValueError(f"mask_state needs a positive width and height, got {width!r} x {height!r}")
    for key in ("grow", "feather"):  # the preview's copies of the node's widgets
        value = state.get(key, 0)
        if not _is_number(value) or value != int(value):
            raise ValueError(f"mask_state {key!r} must be an integer, got {value!r}")
    if not isinstance(state.get("invert", False), bool):
        raise ValueError(f"mask_state 'invert' must be true or false, got {state.get('invert')!r}")
    keyframes = state.get("keyframes") or []
    if not isinstance(keyframes, list):
        raise ValueError("mask_state.keyframes must be a list")
    for k, kf in enumerate(keyframes):
        if not isinstance(kf, dict) or not isinstance(kf.get("shapes", []), list):
            raise ValueError("each keyframe needs a frame index and a list of shapes")
        frame = kf.get("frame", 0)
        if isinstance(frame, bool) or not isinstance(frame, (int, float)) or not math.isfinite(frame) \
                or frame != int(frame) or frame < 0:
            raise ValueError(f"mask_state keyframe {k} needs 'frame' as an integer >= 0, got {frame!r}")
        for index, shape in enumerate(kf.get("shapes", [])):
            if not isinstance(shape, dict) or shape.get("type") not in SHAPE_TYPES:
                raise ValueError(f"unknown shape {shape!r}: type must be one of {SHAPE_TYPES}")
            _check_shape(shape, f"mask_state keyframe {k} (frame {int(frame)}) shape {index} ({shape['type']})")
    return state


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _check_shape(shape: dict, where: str) -> None:
    """ValueError naming the shape and field when a field the rasteriser reads is not a finite number (missing
    fields take their defaults: 0, and size 1)."""
    sid = shape.get("id")
    if sid is not None and not isinstance(sid, (str, int)):
        raise ValueError(f"{where}: 'id' must be a string or an integer, got {sid!r}")
    if shape["type"] in _INTERP_KEYS:
        for key in _INTERP_KEYS[shape["type"]]:
            if key in shape and not _is_number(shape[key]):
                raise ValueError(f"{where}: {key!r} must be a finite number, got {shape[key]!r}")
        return
    size = shape.get("size", 1)
    if not _is_number(size) or size < 0:
        raise ValueError(f"{where}: 'size' must be a finite number >= 0 (the stroke width in pixels), got {size!r}")
    points = shape.get("points") or []
    if not isinstance(points, list):
        raise ValueError(f"{where}: 'points' must be a list of [x, y] pairs, got {points!r}")
    for p, point in enumerate(points):
        if not isinstance(point, (list, tuple)) or len(point) != 2 or not all(_is_number(v) for v in point):
            raise ValueError(f"{where}: point {p} must be an [x, y] pair of finite numbers, got {point!r}")


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


def rasterize_state(state: Any, frame_count: int, height: int, width: int,
                    check: Callable[[], None] | None = None) -> torch.Tensor:
    """Hard masks [T, H, W] float32 of the drawing (no grow / feather / invert); `check()` runs every few frames
    (raise from it to stop)."""
    state = parse_state(state)
    sw, sh = float(state["width"]), float(state["height"])
    # empty, not zeros: every frame is written below, and zero-filling a long clip's masks up front (1.5 GB at 1440
    # frames of 512x512) is seconds without a Stop check on a loaded machine
    out = torch.empty((frame_count, height, width), dtype=torch.float32)
    cache: dict = {}
    previous_key, previous = None, None
    for t in range(frame_count):
        if check is not None and t % 16 == 0:
            check()
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


def paint_over(state: Any, base: torch.Tensor, check: Callable[[], None] | None = None) -> torch.Tensor:
    """Paint the drawing's shapes over `base` [T, H, W] (add = 1, eraser = 0); `check()` as in rasterize_state."""
    state = parse_state(state)
    frames, height, width = base.shape
    sw, sh = float(state["width"]), float(state["height"])
    out = base.clone()
    cache: dict = {}
    for t in range(frames):
        if check is not None and t % 16 == 0:
            check()
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


# -- grow / feather -----------------------------------------------------------------------------------------------
# The definition is the module docstring's (grow: grayscale dilation / erosion by the Euclidean disk dx^2 + dy^2 <= g^2,
# outside the frame 0 for the dilation; feather: three box blurs); these functions are its one implementation in the
# pack: H3 Mask Draw's and H3 Edit's grow / feather (pipelines/h3/editing.prepare_source) both run it, and the
# editor's preview in js/mask_logic.js mirrors it with direct loops.
# Method: the disk is a stack of horizontal chords, row dy spanning |dx| <= h(dy) = isqrt(g^2 - dy^2). The maximum
# over any chord comes in two lookups from a sparse table of row maxima over power-of-two windows (log2(2g + 1)
# passes), so a dilation costs O(g) whole-tensor passes instead of O(g^2); chords and rows past the frame's size are
# cut (they only see the zero outside). A binary mask (the drawn case) runs in uint8: the same maxima, a quarter of
# the memory traffic. The box blur is a running sum (float64 prefix sums: O(1) per pixel at any width). Frames go in
# chunks: bounded memory, and `check` runs between chunks and chords so Stop reaches a long grow; on the GPU when the
# masks live there or, with device="auto", when one is available.

_CHUNK_ELEMENTS = {"cpu": 1 << 22, "cuda": 1 << 24}  # pixels per chunk (the sparse table holds ~log2(2g+1) copies)


def _floor_log2(n: int) -> int:
    return n.bit_length() - 1


def _dilate_chunk(x: torch.Tensor, radius: int, check) -> torch.Tensor:
    """Grayscale dilation of [f, H, W] by the disk of `radius` (module definition), same dtype."""
    frames, height, width = x.shape
    rows = min(radius, height - 1)  # |dy| past the frame only sees the zero outside
    halves = [min(math.isqrt(radius * radius - dy * dy), width - 1) for dy in range(rows + 1)]
    pad = halves[0]
    table = [F.pad(x, (pad, pad))]  # table[k][..., c] = max of padded columns c .. c + 2^k - 1
    for k in range(1, _floor_log2(2 * pad + 1) + 1):
        if check is not None:
            check()
        prev, step = table[-1], 1 << (k - 1)
        table.append(torch.maximum(prev[..., :-step], prev[..., step:]))
    out = None
    chord, chord_half = None, None
    for dy, half in enumerate(halves):
        if check is not None:
            check()
        if half != chord_half:  # max over columns j - half .. j + half, as the max of two 2^k windows
            k = _floor_log2(2 * half + 1)
            level = table[k]
            first = pad - half
            second = pad + half - (1 << k) + 1
            chord = torch.maximum(level[..., first:first + width], level[..., second:second + width])
            chord_half = half
        if dy == 0:
            out = chord.clone()
            continue
        upper, lower = out[:, :height - dy], out[:, dy:]
        torch.maximum(upper, chord[:, dy:], out=upper)  # row i sees row i + dy
        torch.maximum(lower, chord[:, :height - dy], out=lower)  # and row i - dy
    return out


def _box_blur_chunk(x: torch.Tensor, radius: int, dim: int) -> torch.Tensor:
    """Mean over the 2 * radius + 1 neighbours along `dim`, edges replicated (float32; sums in float64, exact enough
    at any length)."""
    n = x.shape[dim]
    index = torch.arange(-radius, n + radius, device=x.device).clamp_(0, n - 1)
    sums = x.index_select(dim, index).cumsum(dim, dtype=torch.float64)
    width = 2 * radius + 1
    window = sums.narrow(dim, width - 1, n).clone()  # sum of padded[0 .. j + width - 1]
    window.narrow(dim, 1, n - 1).sub_(sums.narrow(dim, 0, n - 1))  # minus padded[0 .. j - 1]
    return window.div_(width).to(torch.float32)


def _grow_chunk(x: torch.Tensor, grow: int, check) -> torch.Tensor:
    if grow == 0:
        return x.to(torch.float32)
    binary = bool(((x == 0) | (x == 1)).all())
    work = x.to(torch.uint8) if binary else x.to(torch.float32)
    if grow > 0:
        return _dilate_chunk(work, grow, check).to(torch.float32)
    return (1 - _dilate_chunk(1 - work, -grow, check)).to(torch.float32)


def _feather_chunk(x: torch.Tensor, feather: int, check) -> torch.Tensor:
    if feather <= 0:
        return x
    radius = math.ceil(feather / 3)
    for _ in range(3):
        if check is not None:
            check()
        x = _box_blur_chunk(_box_blur_chunk(x, radius, 2), radius, 1)
    return x


def _compute_device(masks: torch.Tensor, device) -> torch.device:
    if device == "auto":
        if masks.device.type != "cpu":
            return masks.device
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return masks.device if device is None else torch.device(device)


def grow_feather_invert(masks: torch.Tensor, grow: int = 0, feather: int = 0, invert: bool = False, *,
                        check: Callable[[], None] | None = None, device: Any = None) -> torch.Tensor:
    """[T, H, W] -> float32 [T, H, W] grown (dilated / eroded by a Euclidean disk), feathered (3 box-blur passes) and
    inverted, per the module rules (definition and method: the comment above). `check()` is called between chunks of
    frames and between chords; raise from it to stop. device: where to compute (None: where `masks` are; "auto":
    there, or CUDA when the masks are on the CPU and CUDA is available). A device the masks were moved to that runs
    out of memory hands the rest back to theirs. The result is on `masks`' device."""
    grow, feather = int(grow), int(feather)
    if masks.ndim != 3:
        raise ValueError(f"masks must be [frames, height, width], got {tuple(masks.shape)}")
    frames, height, width = masks.shape
    if (grow == 0 and feather <= 0) or masks.numel() == 0:
        out = masks.to(torch.float32)
        return (1.0 - out if invert else out).clamp(0, 1).contiguous()
    compute = _compute_device(masks, device)
    out = torch.empty(masks.shape, dtype=torch.float32, device=masks.device)
    start = 0
    while start < frames:
        if check is not None:
            check()
        per_chunk = max(1, _CHUNK_ELEMENTS.get(compute.type, _CHUNK_ELEMENTS["cpu"]) // (height * width))
        part = masks[start:start + per_chunk]
        try:
            done = _feather_chunk(_grow_chunk(part.to(compute), grow, check), feather, check)
        except torch.cuda.OutOfMemoryError:
            if compute == masks.device:
                raise
            compute = masks.device  # the GPU we moved them to is busy (a model on it): finish where they are
            continue
        out[start:start + part.shape[0]] = done.to(out.device)
        start += part.shape[0]
    if invert:
        out = 1.0 - out
    return out.clamp_(0, 1)


def render_state(state: Any, frame_count: int, height: int, width: int, grow: int | None = None,
                 feather: int | None = None, invert: bool | None = None) -> torch.Tensor:
    """The drawing with its grow / feather / invert (the state's own unless given): what the JS preview shows."""
    state = parse_state(state)
    masks = rasterize_state(state, frame_count, height, width)
    return grow_feather_invert(masks, state.get("grow", 0) if grow is None else grow,
                               state.get("feather", 0) if feather is None else feather,
                               bool(state.get("invert", False)) if invert is None else invert)
