"""Where a long result's frames go while they are made, as soon as they are final: `FileSink` (the fast save path:
uint8 on the device, pinned double buffers, an encoder thread, published complete under its reserved name) and
`MemorySink` (frames on the host, for callers that want tensors). Used by H3 extension and SeedVR2 upscale."""

from __future__ import annotations

import math

import torch


def audio_under(wave: torch.Tensor, frames: int, sample_rate: int, fps) -> torch.Tensor:
    """The samples of `wave` [C, S] that play under the first `frames` frames at `fps` (an int or a Fraction; rounded
    up to a whole sample): a soundtrack cut to the video kept (a stopped run's partial, a locked waveform)."""
    return wave[:, :math.ceil(frames * sample_rate / fps)]


class MemorySink:
    def __init__(self):
        self.frames: list[torch.Tensor] = []
        self.audio: list[torch.Tensor] = []

    def write(self, frames: torch.Tensor) -> None:
        self.frames.append(frames.cpu())

    def write_audio(self, wave: torch.Tensor, sample_rate: int) -> None:
        self.audio.append(wave.cpu())

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        self.frames, self.audio = [], []

    def result(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        frames = torch.cat(self.frames) if self.frames else None
        audio = torch.cat(self.audio, dim=1) if self.audio else None
        return frames, audio


class FileSink:
    """The request's reserved output file, written by media.stream_writer.StreamingVideoSaver."""

    def __init__(self, path: str, width: int, height: int, fps, device, sample_rate: int | None, crf: int,
                 preset: str, metadata: dict):
        import os
        import socket

        from ..errors import RequestError
        from .save import ENCODING_TAG, encoding_tag
        from .stream_writer import StreamingVideoSaver

        if not os.path.isfile(path):  # the caller reserved it; absent here = another machine (a Ray rank 0)
            raise RequestError(f"The output file {path} is not visible to rank 0 on {socket.gethostname()}: rank 0 "
                               "writes it, so it must run on the machine that asked for it (with a Ray cluster, "
                               "start Ray's head there).")
        tags = {**metadata, ENCODING_TAG: encoding_tag("h264", crf, preset)}  # a matching save copies the file
        self.saver = StreamingVideoSaver(path, width, height, fps, device=device, reserved=True, crf=crf,
                                         preset=preset, audio_sample_rate=sample_rate, metadata=tags)
        self.path = path

    def write(self, frames: torch.Tensor) -> None:
        self.saver.write(frames)

    def write_audio(self, wave: torch.Tensor, sample_rate: int) -> None:
        self.saver.write_audio(wave, sample_rate)

    def check(self) -> None:
        """Raise the writer's failure (a full disk) now, between batches."""
        self.saver.check()

    def close(self) -> None:
        self.saver.close()

    def abort(self) -> None:
        self.saver.abort()
