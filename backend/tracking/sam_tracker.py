"""One tracking run: uint8 frames + click / box prompts and / or a text prompt -> a mask on every frame.

Contract: frames uint8 ``[T, H, W, 3]`` RGB (any device); the result is float32 ``[T, H, W]`` of 0 / 1 on the CPU,
the union of every object found, at the frames' own size.

How the transformers models are driven (no segmentation here: transformers' processors and models do it all):

- Frames enter an inference session in chunks of :data:`FRAME_CHUNK` (the processor resizes and normalises them
  on the model's device), so a long clip never exists as one float tensor.
- Clicks and boxes (SAM2, or SAM3's tracker): for every prompted frame, each object's clicks (label 1, negative 0)
  and box go through ``processor.add_inputs_to_inference_session`` in source-frame pixels (the processor scales
  them to the model's square input), then the model runs once on that frame for all of them, making it a
  conditioning frame of each. Then
  ``propagate_in_video_iterator`` runs forward from the earliest prompted frame to the last frame and backward
  (``reverse=True``) from the latest frame on which an object is first prompted down to frame 0. Each object takes
  its mask on frame t from the forward pass when it has a prompt at or before t, else from the backward pass: every
  object is tracked away from its own prompts in both directions, and every frame is covered.
- Text (SAM3): each prompt (lines or ';'-separated phrases) is added with ``processor.add_text_prompt`` and
  ``Sam3VideoModel`` detects and tracks every instance forward from frame 0 (its detector runs on every frame).
- Masks come back through the processors' own post-processing (``post_process_masks`` / ``postprocess_outputs``),
  which resizes them to the frame size and thresholds the logits at 0.

Memory: the session keeps, per object, only what the tracker reads again (:func:`_trim`, after every model call):
its prompted (conditioning) frames, and the outputs of the frames within :func:`memory_reach` of the frame being
tracked, on the side the pass comes from (the memory bank's ``num_maskmem - 1`` frames and the object-pointer window's
``max_object_pointers_in_encoder - 1``), plus, in the forward pass, that window above the backward pass's start, which
the backward pass reads first. The full-size mask every output carries (``high_res_masks``, read only by the call that
made it) is dropped. So an object holds a fixed number of frames whatever the clip's length, and the number of
objects is bounded where the prompts are parsed (backend/media/track_prompts.py: limits). Masks are resized to the
frame size :data:`POSTPROCESS_OBJECTS` objects at a time, so that temporary does not grow with the objects either.

Stop and progress: `check()` runs before every model call (a forward pre-hook on the model, so it also reaches the
frames SAM3 buffers before yielding them), before every object's mask decode inside a call (a pre-hook on each
``mask_decoder``: one call runs every object of a frame in turn), between objects while prompts are added and between
chunks of frames; `progress(done, total)` after each frame. An exception from `check` leaves the run; the model is
unchanged and stays usable (a session lives for one run).
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable, Optional

import torch

from ..media.track_prompts import TrackObject, TrackPrompts, check_against_video, parse_prompts, require_something
from .sam_models import TrackModel

FRAME_CHUNK = 16
POSTPROCESS_OBJECTS = 8  # objects whose masks are resized to the frame size at once


class _Progress:
    def __init__(self, total: int, callback: Optional[Callable[[int, int], None]]):
        self.total, self.done, self.callback = total, 0, callback

    def tick(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        if self.callback is not None:
            self.callback(self.done, self.total)


def text_prompts(text: str) -> list[str]:
    """The text widget -> SAM3 prompts: one per line or ';'-separated phrase, blanks dropped."""
    return [part.strip() for part in re.split(r"[;\n]", text or "") if part.strip()]


def click_passes(prompts: TrackPrompts, frame_count: int) -> tuple[int, int]:
    """(forward start, backward start) of the click passes: forward from the earliest prompted frame, backward from
    the latest frame on which an object gets its first prompt (module docstring)."""
    firsts = [obj.frames()[0] for obj in prompts.objects]
    return min(firsts), max(firsts)


def _click_model_calls(prompts: TrackPrompts, frame_count: int) -> int:
    forward, backward = click_passes(prompts, frame_count)
    return len(prompts.frames()) + (frame_count - forward) + (backward + 1 if backward > 0 else 0)


def track_masks(track_model: TrackModel, frames: torch.Tensor, prompts, text: str = "",
                check: Optional[Callable[[], None]] = None,
                progress: Optional[Callable[[int, int], None]] = None) -> torch.Tensor:
    """float32 [T, H, W] 0 / 1 on the CPU: the union of the objects the prompts and the text find (module
    docstring). `prompts`: a :class:`TrackPrompts` or the widget's JSON. RequestError for prompts that do not fit
    the video or the model."""
    if not isinstance(frames, torch.Tensor) or frames.dtype != torch.uint8 or frames.ndim != 4 \
            or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must be uint8 [T >= 1, H, W, 3], got "
                         f"{getattr(frames, 'dtype', type(frames).__name__)} {tuple(getattr(frames, 'shape', ()))}")
    count, height, width = (int(v) for v in frames.shape[:3])
    prompts = check_against_video(parse_prompts(prompts), count, width, height)
    require_something(prompts, text, track_model.reads_text, track_model.name)
    phrases = text_prompts(text)
    total = 0
    if not prompts.empty:
        total += count + _click_model_calls(prompts, count)
    if phrases:
        total += 2 * count
    meter = _Progress(total, progress)
    union = torch.zeros((count, height, width), dtype=torch.bool)
    if not prompts.empty:
        model, processor = track_model.click_model()
        _track_clicks(model, processor, track_model, frames, prompts, union, check, meter)
    if phrases:
        model, processor = track_model.text_model()
        _track_text(model, processor, track_model, frames, phrases, union, check, meter)
    return union.to(torch.float32)


@contextlib.contextmanager
def _per_call(model, check, meter: _Progress):
    """`check()` before and a progress tick after every call of `model` (each call is one frame)."""
    def before(_module, _args):
        if check is not None:
            check()

    def after(_module, _args, _output):
        meter.tick()

    decoders = [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] == "mask_decoder"]
    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    handles += [decoder.register_forward_pre_hook(before) for decoder in decoders]  # between objects of a frame
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _open_session(processor, track_model: TrackModel, frames: torch.Tensor, check, meter: _Progress):
    """An inference session holding every frame, preprocessed by the processor in chunks on the model's device."""
    count, height, width = (int(v) for v in frames.shape[:3])
    device = track_model.device
    session = processor.init_video_session(inference_device=device, dtype=track_model.dtype)
    session.video_height, session.video_width = height, width
    for start in range(0, count, FRAME_CHUNK):
        if check is not None:
            check()
        chunk = frames[start:start + FRAME_CHUNK].permute(0, 3, 1, 2).contiguous()  # [t, 3, H, W]
        pixels = processor.video_processor(videos=[chunk], device=device, input_data_format="channels_first",
                                           return_tensors="pt").pixel_values_videos[0]
        for offset in range(pixels.shape[0]):
            session.add_new_frame(pixels[offset], frame_idx=start + offset)
        meter.tick(pixels.shape[0])
    return session


def _prompt_inputs(obj: TrackObject, frame: int) -> dict:
    """One object's clicks and box on one frame as the processor takes them (source-frame pixels; nesting [image,
    object, point, xy])."""
    inputs = {}
    clicks = obj.clicks_on(frame)
    if clicks:
        inputs["input_points"] = [[[[c.x, c.y] for c in clicks]]]
        inputs["input_labels"] = [[[1 if c.positive else 0 for c in clicks]]]
    box = obj.box_on(frame)
    if box is not None:
        inputs["input_boxes"] = [[[box.x0, box.y0, box.x1, box.y1]]]
    return inputs


def memory_reach(model) -> int:
    """How many frames back (in a pass's direction) the tracker reads a tracked frame's outputs: its memory bank
    (``num_maskmem - 1`` frames) or its object pointers (``max_object_pointers_in_encoder - 1``), the longer."""
    config = model.config
    return max(int(getattr(config, "num_maskmem", 7)), int(getattr(config, "max_object_pointers_in_encoder", 16))) - 1


def _trim(session, frame: int, keep: Callable[[int], bool]) -> None:
    """After the call on `frame`: drop its outputs' full-size masks and every tracked (non-conditioning) frame's
    outputs outside `keep` (module docstring: memory). Conditioning frames stay."""
    for outputs in session.output_dict_per_obj.values():
        for kind in ("cond_frame_outputs", "non_cond_frame_outputs"):
            stored = outputs[kind].get(frame)
            if stored is not None:
                stored.pop("high_res_masks", None)
        tracked = outputs["non_cond_frame_outputs"]
        for old in [f for f in tracked if not keep(f)]:
            del tracked[old]


def _track_clicks(model, processor, track_model: TrackModel, frames, prompts: TrackPrompts, union, check,
                  meter: _Progress) -> None:
    count, height, width = (int(v) for v in frames.shape[:3])
    first = {obj.id: obj.frames()[0] for obj in prompts.objects}
    session = _open_session(processor, track_model, frames, check, meter)
    sizes = [[height, width]]

    def take(output, keep) -> None:
        ids = list(output.object_ids)
        rows = [i for i, oid in enumerate(ids) if keep(oid)]
        if not rows:
            return
        for start in range(0, len(rows), POSTPROCESS_OBJECTS):
            part = output.pred_masks[rows[start:start + POSTPROCESS_OBJECTS]]
            masks = processor.post_process_masks([part], original_sizes=sizes, binarize=True)[0]
            union[output.frame_idx] |= masks.any(dim=0)[0].to("cpu")

    forward, backward = click_passes(prompts, count)
    reach = memory_reach(model)
    with _per_call(model, check, meter), torch.inference_mode():
        for frame in prompts.frames():
            ids = []
            for obj in prompts.objects:
                inputs = _prompt_inputs(obj, frame)
                if inputs:
                    if check is not None:
                        check()
                    processor.add_inputs_to_inference_session(session, frame_idx=frame, obj_ids=obj.id, **inputs)
                    ids.append(obj.id)
            # Each call above names only its own object as new; the model runs once for all of them, so each is a
            # conditioning frame (run after one of them alone, the others would first be tracked onto this frame
            # and their clicks then taken as a correction of that track).
            session.obj_with_new_inputs = ids
            model(inference_session=session, frame_idx=frame)
            _trim(session, frame, lambda f: True)
        for output in model.propagate_in_video_iterator(session, start_frame_idx=forward):
            t = output.frame_idx
            take(output, lambda oid: first[oid] <= t)
            # keep the window behind t, and the one above `backward` that the backward pass reads first
            _trim(session, t, lambda f: f >= t - reach or (0 < backward < f <= backward + reach))
        if backward > 0:
            for output in model.propagate_in_video_iterator(session, start_frame_idx=backward, reverse=True):
                t = output.frame_idx
                take(output, lambda oid: first[oid] > t)
                _trim(session, t, lambda f: f <= t + reach)


def _track_text(model, processor, track_model: TrackModel, frames, phrases: list[str], union, check,
                meter: _Progress) -> None:
    session = _open_session(processor, track_model, frames, check, meter)
    processor.add_text_prompt(session, phrases)
    with _per_call(model, check, meter), torch.inference_mode():
        for output in model.propagate_in_video_iterator(session, start_frame_idx=0):
            masks = processor.postprocess_outputs(session, output)["masks"]
            if masks.shape[0]:
                union[output.frame_idx] |= masks.any(dim=0).to("cpu")
