"""The click / box prompts of H3 Track Mask: the `prompts` widget's JSON, parsed and checked.

JSON, version 1 (written by the mask editor, js/; contract: one entry per tracked object)::

    {
      "version": 1,
      "objects": [
        {"id": 1,                                                        # a positive int, unique
         "points": [{"frame": 0, "x": 120.5, "y": 80.0, "positive": true}, ...],   # clicks; false = negative click
         "boxes":  [{"frame": 0, "x0": 10, "y0": 20, "x1": 200, "y1": 160}, ...]}  # at most one per frame
      ]
    }

- frame: 0-based index into the video's frames. x, y, x0..y1: pixels of the source frame (x right, y down, origin at
  the frame's top-left corner; floats allowed). The tracker converts them to the model's coordinates.
- "" or no objects: no click prompts (valid only with a text prompt on a SAM3 model: :func:`require_something`).
- `positive` defaults to true; keys not listed here are ignored (the editor may keep its own there).

Limits (stated here once; the parser refuses more, so VALIDATE_INPUTS stops such a prompt before it is queued):

- :data:`MAX_CLICKS_PER_FRAME` clicks per object on one frame: SAM2 was trained with one click and up to 7
  correction clicks on a frame (its training config's ``num_correction_pt_per_frame`` 7); put further clicks on
  another frame.
- one box per object per frame: SAM2's prompt encoder takes one box per object (its two corners lead the clicks).
- :data:`MAX_PROMPTED_FRAMES` frames with a prompt per object: each is a conditioning frame, which the tracker keeps
  for the whole run and attends to on every frame (SAM2's ``max_cond_frame_num`` -1: all of them); 16 is SAM2's
  object-pointer window (``max_object_pointers_in_encoder``).
- :data:`MAX_OBJECTS` objects per node: SAM2 tracks every object on its own (one memory attention and mask decode
  per object and frame, its own memory bank), so time and memory grow with the count. Each object holds about 47
  frames of memory (its prompted frames and a window either side of the frame being tracked; see
  backend/tracking/sam_tracker.py), at the released 1024-px size about 1.2 MB per frame in bf16: 32 objects hold
  ~1.8 GB beside the model. Track more in a second H3 Track Mask and combine the masks (its `mask` input).

Every error is a :class:`RequestError` whose one-line message names the object / frame / value and what to change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import RequestError

PROMPTS_VERSION = 1
MAX_OBJECTS = 32  # per node (module docstring: limits)
MAX_CLICKS_PER_FRAME = 8  # per object and frame
MAX_PROMPTED_FRAMES = 16  # per object


@dataclass(frozen=True)
class Click:
    frame: int
    x: float
    y: float
    positive: bool = True


@dataclass(frozen=True)
class Box:
    frame: int
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True)
class TrackObject:
    id: int
    clicks: tuple[Click, ...] = ()
    boxes: tuple[Box, ...] = ()

    def frames(self) -> list[int]:
        """The frames this object has a click or box on, sorted."""
        return sorted({c.frame for c in self.clicks} | {b.frame for b in self.boxes})

    def clicks_on(self, frame: int) -> list[Click]:
        return [c for c in self.clicks if c.frame == frame]

    def box_on(self, frame: int) -> Box | None:
        return next((b for b in self.boxes if b.frame == frame), None)


@dataclass(frozen=True)
class TrackPrompts:
    objects: tuple[TrackObject, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.objects

    def frames(self) -> list[int]:
        """Every frame that holds a prompt, sorted."""
        return sorted({f for obj in self.objects for f in obj.frames()})


def _frame(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise RequestError(f"prompts: {where} needs a frame index (an integer >= 0), got {value!r}.")
    return int(value)


def _coord(item: dict, key: str, where: str) -> float:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"prompts: {where} needs a finite number for {key!r}, got {value!r}.")
    return float(value)


def _list(obj: dict, key: str, oid: int) -> list:
    value = obj.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"prompts: object {oid}'s {key!r} must be a list, got {type(value).__name__}.")
    return value


def parse_prompts(text: Any) -> TrackPrompts:
    """The prompts from the widget's JSON string (or an already-decoded dict). '' -> no prompts."""
    if isinstance(text, TrackPrompts):
        return text
    if isinstance(text, dict):
        data = text
    else:
        if text is None:
            return TrackPrompts()
        if not isinstance(text, str):
            raise RequestError(f"prompts must be a JSON string, got {type(text).__name__}.")
        if not text.strip():
            return TrackPrompts()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RequestError(f"prompts is not valid JSON ({exc}); place clicks with the mask editor or clear "
                               f"the widget.") from None
    if not isinstance(data, dict):
        raise RequestError(f"prompts must be a JSON object with 'version' and 'objects', got "
                           f"{type(data).__name__}.")
    version = data.get("version", PROMPTS_VERSION)
    if version != PROMPTS_VERSION:
        raise RequestError(f"prompts version {version!r} is not supported (this pack reads version "
                           f"{PROMPTS_VERSION}); update comfyui-h3 or re-place the clicks.")
    raw_objects = data.get("objects", [])
    if raw_objects is None:
        raw_objects = []
    if not isinstance(raw_objects, list):
        raise RequestError(f"prompts.objects must be a list, got {type(raw_objects).__name__}.")
    if len(raw_objects) > MAX_OBJECTS:
        raise RequestError(f"prompts hold {len(raw_objects)} objects; H3 Track Mask tracks at most {MAX_OBJECTS} "
                           f"(each is tracked on its own, so time and memory grow with them): track the rest in a "
                           f"second H3 Track Mask and combine the masks through its `mask` input.")
    objects, seen = [], set()
    for index, obj in enumerate(raw_objects):
        if not isinstance(obj, dict):
            raise RequestError(f"prompts.objects[{index}] must be an object with an id, got {obj!r}.")
        oid = obj.get("id")
        if isinstance(oid, bool) or not isinstance(oid, int) or oid < 1:
            raise RequestError(f"prompts.objects[{index}] needs a positive integer id, got {oid!r}.")
        if oid in seen:
            raise RequestError(f"prompts: object id {oid} appears twice; each object needs its own id.")
        seen.add(oid)
        clicks = []
        for item in _list(obj, "points", oid):
            if not isinstance(item, dict):
                raise RequestError(f"prompts: object {oid} has a click that is not an object: {item!r}.")
            where = f"object {oid}'s click"
            frame = _frame(item.get("frame"), where)
            positive = item.get("positive", True)
            if not isinstance(positive, bool):
                raise RequestError(f"prompts: {where} on frame {frame} needs 'positive' true or false, got "
                                   f"{positive!r}.")
            clicks.append(Click(frame, _coord(item, "x", where), _coord(item, "y", where), positive))
        boxes, box_frames = [], set()
        for item in _list(obj, "boxes", oid):
            if not isinstance(item, dict):
                raise RequestError(f"prompts: object {oid} has a box that is not an object: {item!r}.")
            where = f"object {oid}'s box"
            frame = _frame(item.get("frame"), where)
            where = f"object {oid}'s box on frame {frame}"
            x0, y0, x1, y1 = (_coord(item, k, where) for k in ("x0", "y0", "x1", "y1"))
            if x1 <= x0 or y1 <= y0:
                axis = "x1 (%g) <= x0 (%g)" % (x1, x0) if x1 <= x0 else "y1 (%g) <= y0 (%g)" % (y1, y0)
                raise RequestError(f"prompts: {where} has {axis}: a box runs from its top-left (x0, y0) to its "
                                   f"bottom-right (x1, y1) corner and cannot be empty.")
            if frame in box_frames:
                raise RequestError(f"prompts: object {oid} has two boxes on frame {frame}; keep one box per "
                                   f"object per frame.")
            box_frames.add(frame)
            boxes.append(Box(frame, x0, y0, x1, y1))
        if not clicks and not boxes:
            raise RequestError(f"prompts: object {oid} has no clicks and no box; give it one or remove it.")
        _check_limits(oid, clicks, boxes)
        objects.append(TrackObject(oid, tuple(clicks), tuple(boxes)))
    return TrackPrompts(tuple(objects))


def _check_limits(oid: int, clicks: list, boxes: list) -> None:
    per_frame: dict[int, int] = {}
    for c in clicks:
        per_frame[c.frame] = per_frame.get(c.frame, 0) + 1
    crowded = next((f for f in sorted(per_frame) if per_frame[f] > MAX_CLICKS_PER_FRAME), None)
    if crowded is not None:
        raise RequestError(f"prompts: object {oid} has {per_frame[crowded]} clicks on frame {crowded}; SAM2 takes at "
                           f"most {MAX_CLICKS_PER_FRAME} per object and frame (one click and 7 corrections, as it "
                           f"was trained): remove some or place them on another frame.")
    frames = {c.frame for c in clicks} | {b.frame for b in boxes}
    if len(frames) > MAX_PROMPTED_FRAMES:
        raise RequestError(f"prompts: object {oid} is prompted on {len(frames)} frames; the tracker keeps and attends "
                           f"to every prompted frame of an object, at most {MAX_PROMPTED_FRAMES}: clear the clicks "
                           f"of some frames (it tracks between them by itself).")


def check_against_video(prompts: TrackPrompts, frame_count: int, width: int, height: int) -> TrackPrompts:
    """The prompts checked against the video they are placed on: every frame inside the clip, every click inside the
    frame. Boxes reaching past the frame's edge are cut to it (a box wholly outside is an error). Returns the prompts
    with the boxes cut."""
    objects = []
    for obj in prompts.objects:
        for click in obj.clicks:
            _check_frame(click.frame, frame_count, f"object {obj.id}'s click")
            if not (0 <= click.x <= width and 0 <= click.y <= height):
                raise RequestError(f"prompts: object {obj.id}'s click ({click.x:g}, {click.y:g}) on frame "
                                   f"{click.frame} is outside the {width}x{height} frame; place it on the video.")
        boxes = []
        for box in obj.boxes:
            _check_frame(box.frame, frame_count, f"object {obj.id}'s box")
            cut = Box(box.frame, max(box.x0, 0.0), max(box.y0, 0.0), min(box.x1, float(width)),
                      min(box.y1, float(height)))
            if cut.x1 <= cut.x0 or cut.y1 <= cut.y0:
                raise RequestError(f"prompts: object {obj.id}'s box on frame {box.frame} ({box.x0:g}, {box.y0:g}) - "
                                   f"({box.x1:g}, {box.y1:g}) lies outside the {width}x{height} frame.")
            boxes.append(cut)
        objects.append(TrackObject(obj.id, obj.clicks, tuple(boxes)))
    return TrackPrompts(tuple(objects))


def _check_frame(frame: int, frame_count: int, where: str) -> None:
    if frame >= frame_count:
        raise RequestError(f"prompts: {where} is on frame {frame}, past the video's last frame ({frame_count - 1}); "
                           f"re-place it on the video as loaded now.")


def require_something(prompts: TrackPrompts, text: str, text_capable: bool, model_name: str) -> None:
    """A text prompt needs a model that reads text; something must be given to track."""
    text = (text or "").strip()
    if text and not text_capable:
        raise RequestError(f"a text prompt needs a SAM3 model, and {model_name} is a SAM2 model: clear `text` and "
                           f"place clicks, or pick a SAM3 model.")
    if prompts.empty and not text:
        hint = "or type a text prompt" if text_capable else "(SAM2 models take no text: clicks or boxes)"
        raise RequestError(f"nothing to track: place clicks or a box on the video with the mask editor {hint}.")
