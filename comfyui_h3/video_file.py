"""`H3FileVideo`: a VIDEO that holds a file path + load options and decodes on first use.

Built by H3 Load Video. Construction runs only the cheap planning pass (`backend.media.decode.plan_frames`: packet
timestamps, no decoding), so size, frame count, rate and duration are exact before any frame is decoded. The uint8
frames `[T, H, W, 3]` are decoded on the first access to `.frames` (get_components, save_to, as_h3_video consumers...)
and cached; the audio likewise on first access to `.audio`. Everything else is `H3Video`'s (the VideoInput methods).
When no option changes the file's content, `get_stream_source()` hands the file itself to consumers (no re-encode).
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any, Callable

import torch

from .video_types import H3Video, video_to_frames_audio

_UNSET = object()


class H3FileVideo(H3Video):
    def __init__(
        self,
        path: str | os.PathLike,
        *,
        audio_sample_rate: int | None = None,
        stereo_downmix: bool = True,
        progress: Callable[[int, int], None] | None = None,
        **plan_options: Any,
    ):
        """plan_options: backend.media.decode.plan_frames keywords (frame_load_cap, skip_first_frames,
        select_every_nth, force_rate, max_seconds, resize, fit, width, height, apply_rotation)."""
        from .backend.media.decode import plan_frames

        self.path = os.path.abspath(os.fspath(path))
        self.plan = plan_frames(self.path, **plan_options)
        self.frame_rate = self.plan.frame_rate
        self.metadata = dict(self.plan.metadata)
        self._audio_sample_rate = int(audio_sample_rate) if audio_sample_rate else None
        self._stereo_downmix = stereo_downmix
        self._progress = progress
        self._frames: torch.Tensor | None = None
        self._audio: Any = _UNSET
        self._sample_rate: int | None = None
        untouched = not self.plan.selecting and self.plan.rotation == 0 and self.plan.resize is None
        self.source_path = self.path if untouched and not self._audio_sample_rate else None

    # -- lazy data -----------------------------------------------------------------------------------------------------
    @property
    def decoded(self) -> bool:
        return self._frames is not None

    @property
    def frames(self) -> torch.Tensor:
        if self._frames is None:
            from .backend.media.decode import decode_planned_frames

            self._frames = decode_planned_frames(self.path, self.plan, self._progress)
        return self._frames

    def iter_frames(self, chunk_frames: int = 16):
        """Chunks straight from the file while it is not decoded whole (a long clip never sits in memory)."""
        if self._frames is not None:
            yield from super().iter_frames(chunk_frames)
            return
        from .backend.media.decode import iter_planned_frames

        yield from iter_planned_frames(self.path, self.plan, chunk_frames)

    def _load_audio(self) -> None:
        if self._audio is _UNSET:
            from .backend.media.decode import decode_planned_audio

            self._audio, self._sample_rate = decode_planned_audio(
                self.path, self.plan, self._audio_sample_rate, self._stereo_downmix
            )

    def reference_audio(self) -> tuple[torch.Tensor | None, int | None]:
        """(waveform [C, S], rate) as MiniMax-H3's reference pipeline reads a ref2va video reference's soundtrack:
        the whole track unless this clip's selection took a section (backend.media.decode.decode_reference_audio)."""
        from .backend.media.decode import decode_reference_audio

        return decode_reference_audio(self.path, self.plan, self._stereo_downmix)

    @property
    def audio(self) -> torch.Tensor | None:
        self._load_audio()
        return self._audio

    @property
    def sample_rate(self) -> int | None:
        self._load_audio()
        return self._sample_rate

    # -- VideoInput facts without decoding -------------------------------------------------------------------------
    def get_dimensions(self) -> tuple[int, int]:
        return self.plan.width, self.plan.height

    def get_frame_count(self) -> int:
        return self.plan.frame_count

    def get_frame_rate(self) -> Fraction:
        return self.plan.frame_rate

    def get_duration(self) -> float:
        return float(Fraction(self.plan.frame_count) / self.plan.frame_rate)

    def __repr__(self) -> str:
        state = "decoded" if self.decoded else "not decoded yet"
        return (f"H3FileVideo({os.path.basename(self.path)!r}: {self.plan.frame_count} frames "
                f"{self.plan.width}x{self.plan.height} @ {self.plan.frame_rate} fps, {state})")


def video_frame_source(video: Any, from_file: bool = True):
    """(frames, frame_rate, float32 audio [C, S] or None, sample_rate or None) of any VIDEO, where frames is a
    PlannedFrames reading H3 Load Video's file batch by batch (`from_file` and not yet decoded: a long clip never
    sits whole in host memory) or else the uint8 tensor [T, H, W, 3] of video_to_frames_audio."""
    if from_file and isinstance(video, H3FileVideo) and not video.decoded:
        from .backend.media.planned_frames import PlannedFrames

        return PlannedFrames(video.path, video.plan), video.frame_rate, video.audio, video.sample_rate
    frames, rate, audio, sample_rate = video_to_frames_audio(video)
    return frames.cpu(), rate, audio, sample_rate
