"""Opening a media file with PyAV, with errors that name it (decode.py and audio_decode.py share it)."""

from __future__ import annotations

import os
from typing import BinaryIO

import av


def describe(source) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def open_container(source: str | os.PathLike | BinaryIO):
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
        raise ValueError(f"cannot read {describe(source)} as a video: {error}") from error
