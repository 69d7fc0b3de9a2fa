"""Decode a video file with PyAV into uint8 frames, its frame rate and its soundtrack.

Contracts of `DecodedVideo`:
- frames: torch.uint8 `[T, H, W, 3]` RGB on the CPU (colour matrix and range taken from the stream's tags; untagged
  streams read as BT.601 limited range, as ffmpeg does). Container rotation tags are not applied.
- frame_rate: Fraction, the rate of the returned frames (force_rate if given, divided by select_every_nth).
- audio: float32 `[channels, samples]` in -1..1 (first audio stream), or None; sample_rate: int or None.

Frame selection, in this order (the VideoHelperSuite convention):
1. force_rate > 0: put the stream on a `force_rate` grid by holding frames, as the MiniMax-H3 reference does: source
   frame i lands on slot floor(i * force_rate / src_rate + 1/2) and is held until the next frame's slot; the last one
   until slot floor(N * force_rate / src_rate + 1/2). Computed exactly with Fractions (src_rate = the stream's
   average rate), frame indices rather than timestamps (constant-frame-rate assumption).
2. skip_first_frames: drop that many (resampled) frames.
3. select_every_nth: keep every nth of the rest, starting with the first.
4. frame_load_cap > 0: stop after that many frames.
When any of them is active the audio is cut to the same time span: [skip / rate, (skip + kept * nth) / rate).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from fractions import Fraction
from typing import BinaryIO

import av
import numpy as np
import torch
from av.video.reformatter import ColorRange, Colorspace

from .encode import as_fraction

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


def _describe(source) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def _open(source: str | os.PathLike | BinaryIO):
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise FileNotFoundError(f"video file not found: {os.fspath(source)!r}")
        target = os.fspath(source)
    else:
        source.seek(0)
        target = source
    try:
        return av.open(target, mode="r")
    except av.FFmpegError as error:
        raise ValueError(f"cannot read {_describe(source)} as a video: {error}") from error


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


class _FrameBuffer:
    """Growable uint8 [N, H, W, 3] buffer: one allocation in the common case, no list-then-stack double peak."""

    def __init__(self, capacity: int, height: int, width: int):
        self.data = torch.empty((max(1, capacity), height, width, 3), dtype=torch.uint8)
        self.size = 0

    def append(self, image: np.ndarray) -> None:
        if self.size == self.data.shape[0]:
            grown = torch.empty((max(2, self.size * 3 // 2),) + tuple(self.data.shape[1:]), dtype=torch.uint8)
            grown[: self.size].copy_(self.data[: self.size])
            self.data = grown
        self.data[self.size].copy_(torch.from_numpy(image))
        self.size += 1

    def result(self) -> torch.Tensor:
        if self.size == self.data.shape[0]:
            return self.data
        return self.data[: self.size].clone()  # give the spare capacity back


def _to_rgb(frame) -> np.ndarray:
    kwargs = {}
    if not frame.format.is_rgb and not frame.format.has_palette:
        kwargs["src_colorspace"] = _MATRICES.get(int(frame.colorspace), Colorspace.ITU601)
        kwargs["src_color_range"] = (
            ColorRange.JPEG
            if int(frame.color_range) == _AVCOL_RANGE_JPEG or frame.format.name.startswith("yuvj")
            else ColorRange.MPEG
        )
    return frame.to_ndarray(format="rgb24", **kwargs)


def _decode_frames(container, stream, source, rate, force_rate, skip, nth, cap):
    scale = Fraction(force_rate) / rate if force_rate else Fraction(1)
    half = Fraction(1, 2)

    def slot(index: int) -> int:
        return math.floor(index * scale + half) if force_rate else index

    estimate = _estimated_count(container, stream, rate)
    expected = max(0, math.ceil((math.floor(estimate * scale + half) - skip) / nth)) + 2
    if cap:
        expected = min(expected, cap)
    buffer = _FrameBuffer(expected, stream.height, stream.width)
    stream.thread_type = "AUTO"

    index = 0  # source frame index
    try:
        for frame in container.decode(stream):
            first, end = slot(index), slot(index + 1)
            index += 1
            # output positions this frame fills: first .. end-1; keep p >= skip with (p - skip) % nth == 0
            keep = [p for p in range(max(first, skip), end) if (p - skip) % nth == 0]
            if not keep:
                continue
            image = _to_rgb(frame)
            if image.shape[:2] != (stream.height, stream.width):
                raise ValueError(
                    f"frame {index - 1} of {_describe(source)} is {image.shape[1]}x{image.shape[0]}, "
                    f"the stream says {stream.width}x{stream.height} (size changes are not supported)"
                )
            for _ in keep:
                buffer.append(image)
                if cap and buffer.size >= cap:
                    return buffer.result()
    except av.FFmpegError as error:
        raise ValueError(f"cannot decode {_describe(source)} after {index} frames: {error}") from error
    return buffer.result()


def _decode_audio(source, start_s: float | None, duration_s: float | None, target_rate: int | None):
    with _open(source) as container:
        if not container.streams.audio:
            return None, None
        stream = container.streams.audio[0]
        rate = int(target_rate or stream.sample_rate)
        channels = stream.channels or 2
        if channels > 2:
            layout = stream.layout.name  # keep every channel; callers that need stereo downmix themselves
        else:
            layout = "stereo" if channels == 2 else "mono"
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
        chunks = []
        try:
            for frame in container.decode(stream):
                chunks.extend(f.to_ndarray() for f in resampler.resample(frame))
            chunks.extend(f.to_ndarray() for f in resampler.resample(None))
        except av.FFmpegError as error:
            raise ValueError(f"cannot decode the audio of {_describe(source)}: {error}") from error
        if not chunks:
            return None, None
        waveform = np.concatenate(chunks, axis=1).astype(np.float32, copy=False)
        # AAC pads its last frame; the stream's declared duration is the real length.
        if stream.duration is not None and stream.time_base:
            declared = int(round(float(stream.duration * stream.time_base) * rate))
            if 0 < declared < waveform.shape[1]:
                waveform = waveform[:, :declared]
        if start_s is not None:
            begin = int(round(start_s * rate))
            end = waveform.shape[1] if duration_s is None else begin + int(round(duration_s * rate))
            waveform = waveform[:, begin:end]
        return torch.from_numpy(np.ascontiguousarray(waveform)), rate


def decode_video(
    source: str | os.PathLike | BinaryIO,
    frame_load_cap: int = 0,
    skip_first_frames: int = 0,
    select_every_nth: int = 1,
    force_rate: float | Fraction = 0,
    *,
    load_audio: bool = True,
    audio_sample_rate: int | None = None,
) -> DecodedVideo:
    """Decode `source` (a path or a seekable binary file object); see the module docstring for the options.

    `audio_sample_rate` resamples the soundtrack (libswresample); None keeps the file's rate.
    Raises FileNotFoundError for a missing path, ValueError for an unreadable file, a file without a video stream,
    or a selection that leaves no frames.
    """
    frame_load_cap, skip_first_frames, select_every_nth = int(frame_load_cap), int(skip_first_frames), int(
        select_every_nth
    )
    if frame_load_cap < 0 or skip_first_frames < 0:
        raise ValueError(
            f"frame_load_cap and skip_first_frames must be >= 0, got {frame_load_cap} and {skip_first_frames}"
        )
    if select_every_nth < 1:
        raise ValueError(f"select_every_nth must be >= 1, got {select_every_nth}")
    if force_rate and force_rate < 0:
        raise ValueError(f"force_rate must be >= 0 (0 keeps the file's rate), got {force_rate}")
    target = as_fraction(force_rate) if force_rate else None

    with _open(source) as container:
        stream = _video_stream(container, source)
        src_rate = _stream_rate(stream)
        metadata = dict(container.metadata)
        frames = _decode_frames(
            container, stream, source, src_rate, target, skip_first_frames, select_every_nth, frame_load_cap
        )
    if frames.shape[0] == 0:
        raise ValueError(
            f"no frames left in {_describe(source)} after skip_first_frames={skip_first_frames}, "
            f"select_every_nth={select_every_nth}, force_rate={force_rate}"
        )
    base_rate = target or src_rate
    audio = sample_rate = None
    if load_audio:
        selecting = bool(target or skip_first_frames or select_every_nth > 1 or frame_load_cap)
        start = float(skip_first_frames / base_rate) if selecting else None
        span = float(frames.shape[0] * select_every_nth / base_rate) if selecting else None
        audio, sample_rate = _decode_audio(source, start, span, audio_sample_rate)
    return DecodedVideo(
        frames=frames,
        frame_rate=base_rate / select_every_nth,
        audio=audio,
        sample_rate=sample_rate,
        source_frame_rate=src_rate,
        metadata=metadata,
    )


def decode_audio(source: str | os.PathLike | BinaryIO, sample_rate: int | None = None) -> tuple[torch.Tensor, int]:
    """An audio (or video) file's first audio stream -> (float32 [channels, samples], rate).

    Raises FileNotFoundError for a missing path, ValueError when there is no audio to decode."""
    waveform, rate = _decode_audio(source, None, None, sample_rate)
    if waveform is None:
        raise ValueError(f"no audio stream in {_describe(source)}")
    return waveform, rate
