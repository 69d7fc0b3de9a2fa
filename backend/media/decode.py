"""Decode a video file with PyAV into uint8 frames, its frame rate and its soundtrack (the audio itself is read by
audio_decode.py).

Contracts of `DecodedVideo`:
- frames: torch.uint8 `[T, H, W, 3]` RGB on the CPU (colour matrix and range taken from the stream's tags; untagged
  streams read as BT.601 limited range, as ffmpeg does; 10/12-bit and 4:2:2/4:4:4 sources are converted to rgb24).
  The display matrix (phone "rotate" metadata) is applied by default, so frames come out upright: a 1920x1080 stream
  tagged 90 degrees decodes to 1080x1920 frames. An optional `ResizePlan` (resize.py) is applied frame by frame.
- frame_rate: Fraction, the rate of the returned frames (the grid rate divided by select_every_nth): always constant.
- audio: float32 `[channels, samples]` in -1..1 (first audio stream), or None; sample_rate: int or None. More than two
  channels (5.1, 7.1) are downmixed to stereo by default (libswresample's matrix); mono stays mono. The audio is
  aligned to the first output frame (leading silence is added when the audio starts later than the video).

Frames are placed on a constant-rate grid by their timestamps (pts), not their indices, so variable-frame-rate files
come out constant-rate and in sync. The grid rate is `force_rate` when given, else the stream's average rate.
A demux-only pass (no decoding) reads every packet's pts first: that fixes the output frame count, size and duration
before any frame is decoded (`plan_frames`), and lets the decode pass convert only the frames it keeps.

Frame selection, in this order (the VideoHelperSuite convention):
1. Grid: source frame i with presentation time t_i (seconds after the first frame) lands on slot
   floor(t_i * rate + 1/2) and is held until the next frame's slot; the last one until the stream's declared end,
   never more than one frame past its timestamp where the declared ends disagree (`_last_frame_end`).
   For a constant-rate file t_i = i / src_rate, which is the MiniMax-H3 reference's hold resample (`hold_counts`).
   A slot that two frames both start in keeps the later frame (frames faster than the grid are dropped).
2. skip_first_frames: drop that many (grid) frames.
3. select_every_nth: keep every nth of the rest, starting with the first.
4. frame_load_cap > 0 and max_seconds > 0: stop after that many frames / that many seconds of output. Decoding (and
   the pts pass) stop there too, so a 2-hour file capped at 10 s reads little more than 10 s of it.
When any of them is active the audio is cut to the same time span: [skip / rate, (skip + kept * nth) / rate).
A ref2va reference's soundtrack is read differently, as the MiniMax-H3 reference pipeline reads it (whole, every
decoded sample): `decode_reference_audio` / `decode_reference_video`.

Memory: frames are decoded straight into one preallocated uint8 buffer of the planned size (after resizing); audio is
kept only inside the window it needs.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import BinaryIO, Callable, Iterator

import av
import numpy as np
import torch
from av.video.reformatter import ColorRange, Colorspace

from .audio_decode import decode_audio, decode_planned_audio, decode_reference_audio  # noqa: F401 - public here too
from .container import describe as _describe, open_container as _open, reason as _reason
from .encode import as_fraction
from .frame_plan import FramePlan
from .resize import apply_resize, plan_resize

log = logging.getLogger(__name__)

# AVColorSpace code -> swscale matrix for the YUV -> RGB conversion.
_MATRICES = {
    1: Colorspace.ITU709,
    4: Colorspace.FCC,
    5: Colorspace.ITU601,
    6: Colorspace.SMPTE170M,
    7: Colorspace.SMPTE240M,
    9: Colorspace.BT2020,
    10: Colorspace.BT2020,
}
_AVCOL_RANGE_JPEG = 2


@dataclass
class DecodedVideo:
    frames: torch.Tensor
    frame_rate: Fraction
    audio: torch.Tensor | None = None
    sample_rate: int | None = None
    source_frame_rate: Fraction | None = None
    metadata: dict = field(default_factory=dict)


@dataclass
class VideoInfo:
    width: int
    height: int
    frame_rate: Fraction
    frame_count: int  # from the container when it says, else estimated from duration (0 if unknown)
    duration: float  # seconds (0.0 if unknown)
    has_audio: bool
    sample_rate: int | None
    audio_channels: int | None


def _video_stream(container, source):
    if not container.streams.video:
        raise ValueError(f"{_describe(source)} has no video stream")
    return container.streams.video[0]


def _stream_rate(stream) -> Fraction:
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate:
            return Fraction(rate)
    raise ValueError("the video stream does not declare a frame rate")


def _estimated_count(container, stream, rate: Fraction) -> int:
    if stream.frames:
        return int(stream.frames)
    if stream.duration is not None and stream.time_base:
        return int(round(float(stream.duration * stream.time_base * rate)))
    if container.duration:
        return int(round(container.duration / av.time_base * float(rate)))
    return 0


def probe_video(source: str | os.PathLike | BinaryIO) -> VideoInfo:
    """Read stream parameters without decoding any frames."""
    with _open(source) as container:
        stream = _video_stream(container, source)
        rate = _stream_rate(stream)
        audio = container.streams.audio[0] if container.streams.audio else None
        count = _estimated_count(container, stream, rate)
        if container.duration:
            duration = container.duration / av.time_base
        else:
            duration = float(count / rate) if count else 0.0
        return VideoInfo(
            width=stream.width,
            height=stream.height,
            frame_rate=rate,
            frame_count=count,
            duration=float(duration),
            has_audio=audio is not None,
            sample_rate=int(audio.sample_rate) if audio is not None else None,
            audio_channels=int(audio.channels) if audio is not None else None,
        )


def hold_counts(num_frames: int, src_rate: Fraction, target_rate: Fraction) -> list[int]:
    """How many target-grid slots each source frame fills (the reference's hold resample; sums to the end slot)."""
    scale = Fraction(target_rate) / Fraction(src_rate)
    slots = [math.floor(i * scale + Fraction(1, 2)) for i in range(num_frames + 1)]
    return [b - a for a, b in zip(slots, slots[1:])]


# -- plan: which source frame fills each output frame (demux only, no decoding) ----------------------------------------
def _slot(offset_ticks: int, tb: Fraction, rate: Fraction) -> int:
    """floor(offset_ticks * tb * rate + 1/2), in integers."""
    num = offset_ticks * tb.numerator * rate.numerator
    den = tb.denominator * rate.denominator
    return (2 * num + den) // (2 * den)


def _last_frame_end(last: int, packet_duration: int | None, reordered: bool, declared_end: int | None,
                    container_end: int | None, interval: int, last_step: int | None = None,
                    audio_end: int | None = None) -> int:
    """Stream time (ticks) at which the last frame (pts `last`) stops showing.

    One frame here is the shortest trustworthy spacing near the end: the typical (median) interval, the step into
    the last frame, and its packet duration, the latter only without B-frames (with them, packet durations follow
    decode order, an MP4's sample durations, and the last-shown frame's can be a gap between two others).
    - The declared ends after the frame (the stream's start + duration, the container's end, the soundtrack's end)
      when they agree to within one frame: the earliest (a long last frame in a screen recording stays long).
    - When they disagree (an MPEG-TS demuxer's stream duration estimated from a gappy file's low average rate, a
      container end pulled out by the audio or by a wrapped timestamp), the earliest, but never later than one
      frame past the last timestamp: such a file must not gain a second.
    - With no declared end after the frame: one frame past it."""
    trusted = packet_duration if packet_duration and not reordered else None
    one_frame = min(step for step in (interval, last_step, trusted) if step and step > 0)
    ends = [end for end in (declared_end, container_end, audio_end) if end is not None and end > last]
    if not ends:
        return last + (trusted or one_frame)
    earliest = min(ends)
    if max(ends) - earliest <= one_frame:
        return earliest
    return min(earliest, last + one_frame)


def _audio_end(container, tb: Fraction) -> int | None:
    """The first audio stream's declared end (start + duration) in video ticks `tb`, when it declares both."""
    if not container.streams.audio:
        return None
    audio = container.streams.audio[0]
    if audio.start_time is None or not audio.duration or not audio.time_base:
        return None
    return math.floor((audio.start_time + audio.duration) * Fraction(audio.time_base) / tb)


def _check_options(frame_load_cap, skip_first_frames, select_every_nth, force_rate, max_seconds):
    if frame_load_cap < 0 or skip_first_frames < 0:
        raise ValueError(
            f"frame_load_cap and skip_first_frames must be >= 0, got {frame_load_cap} and {skip_first_frames}"
        )
    if select_every_nth < 1:
        raise ValueError(f"select_every_nth must be >= 1, got {select_every_nth}")
    for name, value in (("force_rate", force_rate), ("max_seconds", max_seconds)):
        if value and not math.isfinite(float(value)):
            raise ValueError(f"{name} must be a finite number, got {value}")
    if force_rate and force_rate < 0:
        raise ValueError(f"force_rate must be >= 0 (0 keeps the file's rate), got {force_rate}")
    if max_seconds and max_seconds < 0:
        raise ValueError(f"max_seconds must be >= 0 (0 means no limit), got {max_seconds}")


def plan_frames(
    source: str | os.PathLike | BinaryIO,
    frame_load_cap: int = 0,
    skip_first_frames: int = 0,
    select_every_nth: int = 1,
    force_rate: float | Fraction = 0,
    max_seconds: float = 0,
    *,
    resize: str = "none",
    fit: str = "crop",
    width: int = 0,
    height: int = 0,
    apply_rotation: bool = True,
) -> FramePlan:
    """Read packet timestamps (and decode the first frame for its rotation) and plan the output; see the module
    docstring. Raises FileNotFoundError / ValueError like `decode_video`."""
    cap, skip, nth = int(frame_load_cap), int(skip_first_frames), int(select_every_nth)
    _check_options(cap, skip, nth, force_rate, max_seconds)
    with _open(source) as container:
        stream = _video_stream(container, source)
        src_rate = _stream_rate(stream)
        grid = as_fraction(force_rate) if force_rate else src_rate
        limit = cap or None
        if max_seconds:
            by_time = max(1, math.floor(float(max_seconds) * float(grid) / nth + 1e-6))
            limit = by_time if limit is None else min(limit, by_time)
        tb = Fraction(stream.time_base) if stream.time_base else Fraction(1, 90000)
        # the last grid position anyone needs, and a stream time past which no packet can matter (B-frame reorder
        # spans far less than two seconds)
        last_needed = None if limit is None else skip + (limit - 1) * nth
        stop_ticks = None if last_needed is None else int((Fraction(last_needed + 1) / grid + 2) / tb)

        rotation, first_size = 0, None
        times: list[int] = []
        durations: dict[int, int] = {}
        t_min = None
        reordered = stopped = False  # B-frames seen (pts out of decode order); demux stopped before the end
        highest = 0
        try:
            for packet in container.demux(stream):
                if packet.size == 0 or packet.is_discard:
                    continue
                pts = packet.pts if packet.pts is not None else packet.dts
                if pts is None:
                    pts = (times[-1] + max(1, round(1 / (src_rate * tb)))) if times else 0
                reordered = reordered or (bool(times) and pts < highest)
                highest = pts if not times else max(highest, pts)
                times.append(pts)
                if packet.duration:
                    durations[pts] = packet.duration
                t_min = pts if t_min is None else min(t_min, pts)
                if first_size is None:
                    for frame in packet.decode():
                        first_size = (frame.width, frame.height)
                        rotation = frame.rotation if apply_rotation else 0
                        break
                order = packet.dts if packet.dts is not None else pts
                if stop_ticks is not None and order - t_min > stop_ticks:
                    stopped = True
                    break
        except av.FFmpegError as error:
            raise ValueError(f"cannot read {_describe(source)}: {_reason(error)}") from error
        if not times:
            raise ValueError(f"{_describe(source)} has no video frames")
        declared_end = container_end = None
        if stream.duration:
            declared_end = (stream.start_time if stream.start_time is not None else t_min) + stream.duration
        if container.duration:
            start = container.start_time or 0
            container_end = math.floor(Fraction(start + container.duration, av.time_base) / tb)
        audio_end = _audio_end(container, tb)
        metadata = dict(container.metadata)
        has_audio = bool(container.streams.audio)
        coded = (stream.width or first_size[0], stream.height or first_size[1]) if first_size else (stream.width,
                                                                                                 stream.height)
    times = sorted(set(times))
    t0 = times[0]
    last = times[-1]
    steps = sorted(b - a for a, b in zip(times, times[1:]))
    interval = steps[len(steps) // 2] if steps else max(1, round(1 / (src_rate * tb)))
    end = _last_frame_end(last, durations.get(last), reordered, None if stopped else declared_end,
                          None if stopped else container_end, interval, last - times[-2] if len(times) > 1 else None,
                          None if stopped else audio_end)
    slots = [_slot(t - t0, tb, grid) for t in times] + [_slot(end - t0, tb, grid)]

    sources: list[int] = []
    for index in range(len(times)):
        first, stop = max(slots[index], skip), slots[index + 1]
        if first >= stop:
            continue
        # kept positions p >= skip with (p - skip) % nth == 0
        p = first + (-(first - skip)) % nth
        while p < stop:
            if last_needed is not None and p > last_needed:
                break
            sources.append(index)
            p += nth
        if limit is not None and len(sources) >= limit:
            del sources[limit:]
            break
    if not sources:
        raise ValueError(
            f"no frames left in {_describe(source)} after skip_first_frames={skip}, select_every_nth={nth}, "
            f"force_rate={force_rate} (the file has {len(times)} frames, {float((end - t0) * tb):.3f} s)"
        )
    quarter = int(round(rotation / 90)) % 4
    coded_w, coded_h = int(coded[0]), int(coded[1])
    upright_w, upright_h = (coded_h, coded_w) if quarter % 2 else (coded_w, coded_h)
    resize_plan = plan_resize(upright_w, upright_h, resize, fit, width, height)
    out_w, out_h = (resize_plan.out_w, resize_plan.out_h) if resize_plan else (upright_w, upright_h)
    return FramePlan(
        sources=sources,
        pts_index={t: i for i, t in enumerate(times)},
        frame_rate=grid / nth,
        grid_rate=grid,
        source_frame_rate=src_rate,
        width=out_w,
        height=out_h,
        coded_width=coded_w,
        coded_height=coded_h,
        rotation=quarter,
        resize=resize_plan,
        start_time=float(t0 * tb + Fraction(skip) / grid),
        duration=float(Fraction(len(sources) * nth) / grid),
        select_every_nth=nth,
        selecting=bool(force_rate or skip or nth > 1 or cap or max_seconds),
        trims_time=bool(skip or cap or max_seconds),
        metadata=metadata,
        has_audio=has_audio,
    )


def _to_rgb(frame, width: int, height: int) -> np.ndarray:
    kwargs = {}
    if not frame.format.is_rgb and not frame.format.has_palette:
        kwargs["src_colorspace"] = _MATRICES.get(int(frame.colorspace), Colorspace.ITU601)
        kwargs["src_color_range"] = (
            ColorRange.JPEG
            if int(frame.color_range) == _AVCOL_RANGE_JPEG or frame.format.name.startswith("yuvj")
            else ColorRange.MPEG
        )
    if (frame.width, frame.height) != (width, height):  # a mid-stream size change: scale to the stream's size
        kwargs.update(width=width, height=height)
    return frame.to_ndarray(format="rgb24", **kwargs)


def _frame_image(frame, plan: FramePlan) -> torch.Tensor:
    image = _to_rgb(frame, plan.coded_width, plan.coded_height)
    if plan.rotation:
        image = np.rot90(image, plan.rotation)
    image = apply_resize(np.ascontiguousarray(image), plan.resize)
    return torch.from_numpy(np.ascontiguousarray(image))


def _planned_images(
    source: str | os.PathLike | BinaryIO,
    plan: FramePlan,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """(output index, uint8 image [H, W, 3]) for every frame `plan` names, in order; a held frame is yielded once
    per index it fills (the same tensor).

    A source frame the decoder drops (a corrupt packet) is replaced by the next one it returns; frames missing at the
    end (a truncated file) hold the last decoded one, with a warning, so the planned count and audio sync stand.
    `progress(done, total)` is called after each stored frame (it may raise to cancel)."""
    total = plan.frame_count
    done = 0
    expected = 0  # index of the next source frame in presentation order
    image = None
    with _open(source) as container:
        stream = _video_stream(container, source)
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                index = plan.pts_index.get(frame.pts) if frame.pts is not None else None
                if index is None or index < expected:
                    index = expected
                expected = index + 1
                if plan.sources[done] > index:
                    continue
                image = _frame_image(frame, plan)
                while done < total and plan.sources[done] <= index:
                    yield done, image
                    done += 1
                    if progress is not None:
                        progress(done, total)
                if done >= total:
                    break
        except av.FFmpegError as error:
            if done == 0:
                raise ValueError(f"cannot decode {_describe(source)}: {_reason(error)}") from error
            log.warning("decoding %s stopped after %d of %d frames: %s", _describe(source), done, total, error)
    if done == 0:
        raise ValueError(f"cannot decode any frame of {_describe(source)}")
    if done < total:
        log.warning("%s: only %d of %d planned frames decoded; holding the last one", _describe(source), done, total)
        for index in range(done, total):
            yield index, image


def iter_planned_frames(
    source: str | os.PathLike | BinaryIO,
    plan: FramePlan,
    chunk_frames: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[torch.Tensor]:
    """The frames `plan` names as uint8 chunks `[<= chunk_frames, H, W, 3]`, in order (a long clip never whole);
    each chunk is a fresh tensor the caller may keep. Dropped / missing frames: see _planned_images."""
    size = min(chunk_frames, plan.frame_count)
    buffer = torch.empty((size, plan.height, plan.width, 3), dtype=torch.uint8)
    filled = 0
    for _, image in _planned_images(source, plan, progress):
        buffer[filled].copy_(image)
        filled += 1
        if filled == size:
            yield buffer
            buffer = torch.empty_like(buffer)
            filled = 0
    if filled:
        yield buffer[:filled]


def decode_planned_frame(source: str | os.PathLike | BinaryIO, plan: FramePlan, index: int) -> torch.Tensor:
    """Output frame `index` of `plan` as uint8 `[H, W, 3]`, decoded from the keyframe at or before it (one seek), so a
    late frame costs one group of pictures, not the whole clip before it. Equal to `decode_planned_frames(...)[index]`:
    when the seek does not land on the frame's own timestamp (no pts, a dropped frame, an inexact seek) it decodes
    from the start as the whole-clip walk does."""
    if not 0 <= index < plan.frame_count:
        raise IndexError(f"frame {index} is outside the plan's {plan.frame_count} frames")
    target = plan.sources[index]
    pts = list(plan.pts_index)[target]  # pts_index is in presentation order
    with _open(source) as container:
        stream = _video_stream(container, source)
        try:
            container.seek(pts, stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                found = plan.pts_index.get(frame.pts) if frame.pts is not None else None
                if found is None or found > target:
                    break
                if found == target:
                    return _frame_image(frame, plan)
        except av.FFmpegError as error:
            log.debug("seek to frame %d of %s failed (%s); decoding from the start", index, _describe(source), error)
    one = replace(plan, sources=[target])
    return next(_planned_images(source, one))[1]


def decode_planned_frames(
    source: str | os.PathLike | BinaryIO,
    plan: FramePlan,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Decode the frames `plan` names into one uint8 `[plan.frame_count, H, W, 3]` buffer (each frame copied once)."""
    buffer = torch.empty((plan.frame_count, plan.height, plan.width, 3), dtype=torch.uint8)
    for index, image in _planned_images(source, plan, progress):
        buffer[index].copy_(image)
    return buffer


def decode_reference_video(source: str | os.PathLike | BinaryIO) -> DecodedVideo:
    """A ref2va video reference read from a file: every frame at the file's own rate, upright (as decode_video), and
    its soundtrack as the reference pipeline reads it (decode_reference_audio)."""
    clip = decode_video(source, load_audio=False)
    clip.audio, clip.sample_rate = decode_reference_audio(source)
    return clip


def decode_video(
    source: str | os.PathLike | BinaryIO,
    frame_load_cap: int = 0,
    skip_first_frames: int = 0,
    select_every_nth: int = 1,
    force_rate: float | Fraction = 0,
    *,
    max_seconds: float = 0,
    load_audio: bool = True,
    audio_sample_rate: int | None = None,
    stereo_downmix: bool = True,
    apply_rotation: bool = True,
    resize: str = "none",
    fit: str = "crop",
    width: int = 0,
    height: int = 0,
) -> DecodedVideo:
    """Decode `source` (a path or a seekable binary file object); see the module docstring for the options.

    `audio_sample_rate` resamples the soundtrack (libswresample); None keeps the file's rate. `resize` / `fit` /
    `width` / `height`: see resize.plan_resize. Raises FileNotFoundError for a missing path, ValueError for an
    unreadable file, a file without a video stream, or a selection that leaves no frames.
    """
    plan = plan_frames(
        source, frame_load_cap, skip_first_frames, select_every_nth, force_rate, max_seconds,
        resize=resize, fit=fit, width=width, height=height, apply_rotation=apply_rotation,
    )
    frames = decode_planned_frames(source, plan)
    audio = sample_rate = None
    if load_audio:
        audio, sample_rate = decode_planned_audio(source, plan, audio_sample_rate, stereo_downmix)
    return DecodedVideo(
        frames=frames,
        frame_rate=plan.frame_rate,
        audio=audio,
        sample_rate=sample_rate,
        source_frame_rate=plan.source_frame_rate,
        metadata=plan.metadata,
    )
