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
        container = av.open(target, mode="r")
    except av.FFmpegError as error:
        raise ValueError(f"cannot read {describe(source)} as a video: {reason(error)}") from error
    fmt = container.format.name
    if fmt.endswith("_pipe") or fmt in STILL_IMAGE_DEMUXERS:  # one rule for every caller: a renamed PNG is no clip
        container.close()
        raise ValueError(f"{describe(source)} is a still image ({fmt.removesuffix('_pipe')}), not a video: give a "
                         "video file (mp4, mov, mkv, webm, ...).")
    return container


# FFmpeg's demuxers for single pictures: the `*_pipe` family (png_pipe, jpeg_pipe, webp_pipe, ...) and image2, which
# reads a picture (or a numbered sequence of them) by its extension.
STILL_IMAGE_DEMUXERS = ("image2", "image2pipe")


def reason(error: "av.FFmpegError") -> str:
    """FFmpeg's cause without its errno number and the path (the message names the file itself), e.g. "invalid data
    found when processing input"."""
    text = (getattr(error, "strerror", None) or str(error)).strip().rstrip(".")
    return (text[:1].lower() + text[1:]) or type(error).__name__
