"""Decode a file's first audio stream with PyAV: the span a video's frame plan covers (decode.py), a ref2va
reference's whole soundtrack as the reference pipeline reads it, or a plain audio file.

Contract: float32 `[channels, samples]` in -1..1 with its sample rate, or (None, None) without an audio stream; more
than two channels are downmixed to stereo by default (libswresample's matrix), mono stays mono.
"""

from __future__ import annotations

import os
from typing import BinaryIO

import av
import numpy as np
import torch

from .container import describe as _describe, open_container as _open, reason as _reason

from .frame_plan import FramePlan


def _audio_layout(stream, stereo_downmix: bool) -> str:
    channels = stream.channels or 2
    if channels > 2:
        return "stereo" if stereo_downmix else stream.layout.name
    return "stereo" if channels == 2 else "mono"


def _decode_audio(
    source,
    start_time: float | None,
    duration_s: float | None,
    target_rate: int | None,
    stereo_downmix: bool = True,
    keep_padding: bool = False,
):
    """The first audio stream from stream-time `start_time` (None: its own start) for `duration_s` seconds (None: to
    its end), streamed: only the window is kept. Leading silence pads a window that starts before the audio does.
    The track ends at its declared duration (AAC pads its last frame), unless `keep_padding`: then every decoded
    sample is kept, as MiniMax-H3's reference pipeline reads a reference (see decode_reference_audio)."""
    with _open(source) as container:
        if not container.streams.audio:
            return None, None
        stream = container.streams.audio[0]
        rate = int(target_rate or stream.sample_rate)
        resampler = av.AudioResampler(format="fltp", layout=_audio_layout(stream, stereo_downmix), rate=rate)
        declared = None
        # AAC pads its last frame; the stream's declared duration is the real length.
        if stream.duration is not None and stream.time_base and not keep_padding:
            declared = int(round(float(stream.duration * stream.time_base) * rate))
        pieces: list[np.ndarray] = []
        state = {"pos": 0, "begin": None, "end": None, "pad": 0}

        def window(first_time: float) -> None:
            begin = 0 if start_time is None else int(round((start_time - first_time) * rate))
            end = None if duration_s is None else begin + int(round(duration_s * rate))
            if declared and declared > 0 and (end is None or end > declared):
                end = declared
            state.update(begin=max(0, begin), end=end, pad=max(0, -begin))

        def add(chunk: np.ndarray) -> None:
            pos, n = state["pos"], chunk.shape[1]
            lo = max(state["begin"], pos)
            hi = pos + n if state["end"] is None else min(state["end"], pos + n)
            if hi > lo:
                pieces.append(chunk[:, lo - pos : hi - pos])
            state["pos"] = pos + n

        try:
            for frame in container.decode(stream):
                if state["begin"] is None:
                    window(float(frame.time) if frame.time is not None else 0.0)
                for out in resampler.resample(frame):
                    add(out.to_ndarray())
                if state["end"] is not None and state["pos"] >= state["end"]:
                    break
            else:
                if state["begin"] is not None:
                    for out in resampler.resample(None):
                        add(out.to_ndarray())
        except av.FFmpegError as error:
            raise ValueError(f"cannot decode the audio of {_describe(source)}: {_reason(error)}") from error
        if state["begin"] is None:
            return None, None
        channels = len(resampler.layout.channels)
        if state["pad"]:
            pad = state["pad"] if state["end"] is None else min(state["pad"], state["end"] + state["pad"])
            pieces.insert(0, np.zeros((channels, pad), dtype=np.float32))
        if not pieces:
            return torch.zeros((channels, 0), dtype=torch.float32), rate
        waveform = np.concatenate(pieces, axis=1).astype(np.float32, copy=False)
        return torch.from_numpy(np.ascontiguousarray(waveform)), rate


def decode_planned_audio(source, plan: FramePlan, sample_rate: int | None = None, stereo_downmix: bool = True):
    """(float32 [C, S], rate) for the span `plan` covers (the whole track from the first frame when not selecting),
    or (None, None) without an audio stream."""
    return _decode_audio(
        source, plan.start_time, plan.duration if plan.selecting else None, sample_rate, stereo_downmix
    )


def decode_reference_audio(source, plan: FramePlan | None = None, stereo_downmix: bool = True):
    """A ref2va reference's soundtrack -> (float32 [C, S], rate), or (None, None) without an audio stream.

    Read as the MiniMax-H3 reference pipeline reads a video or audio reference (diffusers 0.42.1
    `MiniMaxH3VideoReference.from_file` / `MiniMaxH3AudioReference.from_file`): the whole first audio stream, from
    its own start, at its own sample rate, with every decoded sample (an AAC track's padded last frame included: the
    pipeline conditions on those samples, so cutting the track at its declared duration can drop an audio latent),
    also past the end of the video. Only when `plan` trims time (skip_first_frames, frame_load_cap, max_seconds: the
    user took a section) is the soundtrack that section's. More than two channels are downmixed to stereo (the
    reference pipeline takes mono or stereo only)."""
    if plan is not None and plan.trims_time:
        return decode_planned_audio(source, plan, None, stereo_downmix)
    return _decode_audio(source, None, None, None, stereo_downmix, keep_padding=True)


def decode_audio(source: str | os.PathLike | BinaryIO, sample_rate: int | None = None) -> tuple[torch.Tensor, int]:
    """An audio (or video) file's first audio stream -> (float32 [channels, samples], rate).

    Raises FileNotFoundError for a missing path, ValueError when there is no audio to decode."""
    waveform, rate = _decode_audio(source, None, None, sample_rate)
    if waveform is None:
        raise ValueError(f"no audio stream in {_describe(source)}")
    return waveform, rate
