"""Write uint8 frames (+ audio) to an MP4 in streamed chunks (the encoder never sees the whole clip at once)."""

from __future__ import annotations

import math

from .encode import Mp4Writer, as_fraction, next_free_path

CHUNK_FRAMES = 16
AUDIO_RATE = 32000  # H3's own rate; AAC stores it natively


def write_mp4(path: str, frames, fps, wave=None, rate: int | None = None, crf: float = 18, preset: str = "veryfast",
              metadata: dict | None = None, reserved: bool = False) -> str:
    """frames uint8 [T, H, W, 3]; wave float32 [C, N] at `rate` (resampled into the stream if needed).
    `reserved`: `path` is an empty placeholder made by next_free_path (else it must not exist)."""
    with Mp4Writer(path, int(frames.shape[2]), int(frames.shape[1]), fps,
                   audio_sample_rate=AUDIO_RATE if wave is not None else None, crf=crf, preset=preset,
                   metadata=metadata, reserved=reserved) as writer:
        for start in range(0, frames.shape[0], CHUNK_FRAMES):
            writer.write_frames(frames[start:start + CHUNK_FRAMES])
        if wave is not None:
            # The soundtrack covers the frames exactly, so the file's duration is the video's.
            keep = math.ceil(int(frames.shape[0]) * int(rate) / as_fraction(fps))
            writer.write_audio(wave[..., :keep], sample_rate=rate)
    return writer.path


def save_new_mp4(out_dir: str, prefix: str, frames, fps, wave=None, rate: int | None = None, crf: float = 18,
                 preset: str = "veryfast", metadata: dict | None = None) -> str:
    """A new `<out_dir>/<prefix>_NNNNN.mp4` (never an existing name); returns its absolute path."""
    path = next_free_path(out_dir, prefix, ".mp4")  # reserved with O_EXCL: concurrent saves never collide
    return write_mp4(path, frames, fps, wave, rate, crf, preset, metadata=metadata, reserved=True)
