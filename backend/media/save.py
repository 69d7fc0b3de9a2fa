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


ENCODING_TAG = "comfyui_h3_encoding"  # how a pack-written MP4 was encoded: lets a later save copy it as is


def encoding_tag(codec: str, crf: float, preset: str) -> str:
    return f"{codec} crf={float(crf):g} preset={preset}"


def copy_mp4(source: str, path: str, metadata: dict | None = None, reserved: bool = False) -> str:
    """Copy an MP4's video + audio packets into a new file (no re-encode) with `metadata` added to its tags; published
    complete under `path` only (temp file beside it; `reserved`: `path` is our empty placeholder)."""
    import json
    import os

    import av

    from .encode import _create_temp_beside, _publish, release_placeholder

    temp = _create_temp_beside(os.path.abspath(path))
    try:
        with av.open(source) as src, av.open(temp, mode="w", format="mp4",
                                             options={"movflags": "faststart+use_metadata_tags"}) as dst:
            for key, value in {**src.metadata, **(metadata or {})}.items():
                if key not in ("major_brand", "minor_version", "compatible_brands", "encoder"):
                    dst.metadata[str(key)] = value if isinstance(value, str) else json.dumps(value)
            streams = [s for s in src.streams if s.type in ("video", "audio")]
            mapping = {s.index: dst.add_stream_from_template(s) for s in streams}
            for packet in src.demux(streams):
                if packet.dts is None:  # the demuxer's flush packets
                    continue
                packet.stream = mapping[packet.stream.index]
                dst.mux(packet)
        _publish(temp, os.path.abspath(path), reserved)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        if reserved:
            release_placeholder(path)
        raise
    return os.path.abspath(path)
