"""`H3Video`: ComfyUI's VIDEO type, holding uint8 frames instead of a float IMAGE batch.

ComfyUI's VIDEO is any object with the VideoInput methods (comfy_api.latest._input.video_types.VideoInput): nodes
call get_components / save_to / get_dimensions / get_duration / get_frame_count / get_frame_rate /
get_stream_source / get_container_format (and, on newer cores, as_trimmed, as_cropped, get_bit_depth,
get_color_space, ...). `H3Video` implements them by duck typing, so this module imports no ComfyUI code at import time;
VideoInput methods it does not implement itself are forwarded, when ComfyUI is importable, to core's
VideoFromComponents built from `get_components()` (materialised only when such a method is actually called).

Contracts:
- frames: torch.uint8 `[T, H, W, 3]` RGB, on any device (a GPU-made clip may stay on its GPU).
  A 15-s 1080p clip is 0.75 GB here against 9 GB as float32 IMAGE; float only appears in get_components().
- audio: float32 `[C, S]` in -1..1 with `sample_rate`, or None. ComfyUI's AUDIO is `{waveform [B, C, S], sample_rate}`.
- frame_rate: Fraction.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from .backend.media.encode import AAC_SAMPLE_RATES, Mp4Writer, as_fraction
from .backend.media.frames import uint8_to_image, video_to_uint8

_MP4_FORMAT_NAME = "mov,mp4,m4a,3gp,3g2,mj2"  # what PyAV reports for an MP4 it reads
_SAVE_CHUNK_FRAMES = 16  # frames per device->host copy while saving
# Tags the MP4 muxer writes by itself; copied from a decoded file they would be stored again as custom tags.
_CONTAINER_TAGS = ("major_brand", "minor_version", "compatible_brands", "encoder")


@dataclass
class LocalVideoComponents:
    """Stand-in for comfy_api's VideoComponents when ComfyUI is not importable (same field names)."""

    images: torch.Tensor
    frame_rate: Fraction
    audio: dict | None = None
    metadata: dict | None = None


def video_components_class():
    """ComfyUI's VideoComponents when ComfyUI is importable, else LocalVideoComponents."""
    for module_name in ("comfy_api.latest._util", "comfy_api.util"):
        try:
            module = __import__(module_name, fromlist=["VideoComponents"])
            return module.VideoComponents
        except Exception:  # not inside ComfyUI, or an older/newer layout
            continue
    return LocalVideoComponents


def _core_class(name: str):
    """comfy_api's VideoInput / VideoFromComponents, or None outside ComfyUI."""
    candidates = {
        "VideoInput": ("comfy_api.latest._input", "comfy_api.input"),
        "VideoFromComponents": ("comfy_api.latest._input_impl", "comfy_api.input_impl"),
    }[name]
    for module_name in candidates:
        try:
            return getattr(__import__(module_name, fromlist=[name]), name)
        except Exception:
            continue
    return None


def _option_value(value: Any) -> str | None:
    """A ComfyUI enum (VideoContainer / VideoCodec, str Enums) or plain string -> lower-case string; None stays."""
    if value is None:
        return None
    return str(getattr(value, "value", value)).lower()


class H3Video:
    """A video held as uint8 frames + optional audio; see the module docstring for the contracts."""

    def __init__(
        self,
        frames: Any,
        frame_rate: Fraction | float,
        audio: Any = None,
        sample_rate: int | None = None,
        metadata: dict | None = None,
        *,
        source_path: str | None = None,
    ):
        if not isinstance(frames, torch.Tensor):
            frames = torch.as_tensor(frames)
        if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
            raise ValueError(
                f"H3Video needs uint8 frames [T >= 1, H, W, 3], got {frames.dtype} {tuple(frames.shape)}"
            )
        self.frames = frames
        self.frame_rate = as_fraction(frame_rate)
        if audio is not None:
            audio = torch.as_tensor(audio)
            if audio.ndim == 3 and audio.shape[0] == 1:
                audio = audio[0]
            if audio.ndim != 2 or not audio.is_floating_point():
                raise ValueError(f"H3Video audio must be float [channels, samples], got {audio.dtype} {tuple(audio.shape)}")
            if not sample_rate or int(sample_rate) <= 0:
                raise ValueError(f"H3Video audio needs a positive sample_rate, got {sample_rate!r}")
            audio = audio.to(torch.float32)
        self.audio = audio
        self.sample_rate = int(sample_rate) if audio is not None else None
        self.metadata = dict(metadata or {})
        self.source_path = source_path  # a file holding exactly these frames + audio (enables stream reuse)

    # -- constructors --------------------------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike, **decode_options: Any) -> "H3Video":
        """Decode a file (backend.media.decode.decode_video options: frame_load_cap, skip_first_frames,
        select_every_nth, force_rate, load_audio, audio_sample_rate)."""
        from .backend.media.decode import decode_video

        decoded = decode_video(path, **decode_options)
        untouched = not any(decode_options.get(k) for k in ("frame_load_cap", "skip_first_frames", "force_rate"))
        untouched = untouched and decode_options.get("select_every_nth", 1) == 1
        untouched = untouched and decode_options.get("load_audio", True) and not decode_options.get("audio_sample_rate")
        return cls(
            decoded.frames,
            decoded.frame_rate,
            decoded.audio,
            decoded.sample_rate,
            decoded.metadata,
            source_path=os.path.abspath(os.fspath(path)) if untouched else None,
        )

    # -- VideoInput: data --------------------------------------------------------------------------------------------
    def audio_dict(self) -> dict | None:
        """ComfyUI AUDIO: {"waveform": float32 [1, C, S] (CPU), "sample_rate": int}, or None."""
        if self.audio is None:
            return None
        return {"waveform": self.audio.detach().cpu()[None], "sample_rate": self.sample_rate}

    def iter_frames(self, chunk_frames: int = _SAVE_CHUNK_FRAMES):
        """uint8 chunks [<= chunk_frames, H, W, 3] in order (a file-backed video decodes them as it goes)."""
        for start in range(0, self.frames.shape[0], chunk_frames):
            yield self.frames[start:start + chunk_frames]

    def get_components(self):
        """images: float32 IMAGE [T, H, W, 3] on the CPU (built now, not cached), audio, frame_rate, metadata."""
        images = uint8_to_image(self.frames.detach().cpu())
        return video_components_class()(
            images=images, frame_rate=self.frame_rate, audio=self.audio_dict(), metadata=dict(self.metadata)
        )

    def get_dimensions(self) -> tuple[int, int]:
        return int(self.frames.shape[2]), int(self.frames.shape[1])

    def get_display_dimensions(self) -> tuple[int, int]:
        return self.get_dimensions()

    def get_frame_count(self) -> int:
        return int(self.frames.shape[0])

    def get_frame_rate(self) -> Fraction:
        return self.frame_rate

    def get_duration(self) -> float:
        return float(self.frames.shape[0] / self.frame_rate)

    def get_bit_depth(self) -> int:
        return 8

    def get_color_space(self) -> str:
        return "sRGB"

    def get_container_format(self) -> str:
        return _MP4_FORMAT_NAME

    def has_pending_frame_edits(self) -> bool:
        return False

    def get_active_trim_window(self) -> tuple[float, float]:
        return 0.0, 0.0

    def get_stream_source(self) -> str | io.BytesIO:
        """The source file when these frames are exactly a file's content, else an MP4 encoded into memory."""
        if self.source_path and os.path.isfile(self.source_path):
            return self.source_path
        buffer = io.BytesIO()
        self.save_to(buffer)
        buffer.seek(0)
        return buffer

    # -- VideoInput: save ----------------------------------------------------------------------------------------------
    def save_to(
        self,
        path: str | os.PathLike | io.BufferedIOBase,
        format: Any = None,
        codec: Any = None,
        metadata: dict | None = None,
        bit_depth: int | None = None,
        crf: float | None = None,
        color_space: str | None = None,
        preset: str | None = None,
        **_unused: Any,
    ) -> None:
        """Encode to MP4 (H.264 CRF `crf` (18), x264 `preset` ("veryfast"), AAC). Never overwrites an existing path.

        Audio is cut to the video's length (ceil(T * sample_rate / fps) samples), as ComfyUI's own writer does; more
        than two channels keep the first two (front left / right). Only mp4 / h264 / 8-bit / sRGB are supported.
        """
        container, video_codec = _option_value(format), _option_value(codec)
        if container not in (None, "auto", "mp4"):
            raise ValueError(f"H3Video.save_to writes MP4 only, got format={container!r}")
        if video_codec not in (None, "auto", "h264", "libx264"):
            raise ValueError(f"H3Video.save_to writes H.264 only, got codec={video_codec!r}")
        if bit_depth not in (None, 8):
            raise ValueError(f"H3Video.save_to writes 8-bit video only, got bit_depth={bit_depth!r}")
        if _option_value(color_space) not in (None, "auto", "srgb"):
            raise ValueError(f"H3Video.save_to writes SDR BT.709 only, got color_space={color_space!r}")

        tags = {k: v for k, v in self.metadata.items() if k not in _CONTAINER_TAGS}
        tags.update(metadata or {})
        audio, stream_rate = self.audio, None
        if audio is not None:
            limit = math.ceil(self.get_frame_count() * self.sample_rate / self.frame_rate)
            audio = audio[:2, :limit].detach().cpu()
            stream_rate = self.sample_rate if self.sample_rate in AAC_SAMPLE_RATES else 48000
        width, height = self.get_dimensions()
        with Mp4Writer(
            path,
            width,
            height,
            self.frame_rate,
            audio_sample_rate=stream_rate,
            audio_channels=2 if audio is None else min(2, audio.shape[0]),
            crf=18 if crf is None else crf,
            preset="veryfast" if preset is None else preset,
            metadata=tags,
        ) as writer:
            if audio is not None:
                writer.write_audio(audio, sample_rate=self.sample_rate)
            for chunk in self.iter_frames(_SAVE_CHUNK_FRAMES):
                writer.write_frames(chunk)

    # -- VideoInput: derived videos (cheap: slices of the uint8 frames) -----------------------------------------------
    def _derived(self, frames: torch.Tensor, audio: torch.Tensor | None) -> "H3Video":
        return H3Video(frames, self.frame_rate, audio, self.sample_rate if audio is not None else None, self.metadata)

    def as_trimmed(
        self, start_time: float | None = None, duration: float | None = None, strict_duration: bool = False
    ) -> "H3Video | None":
        """Frames [round(start * fps), + round(duration * fps)); a negative start counts from the end; duration 0 or
        None runs to the end. None when nothing is left, or when strict_duration and fewer seconds remain."""
        total = self.get_duration()
        start = float(start_time or 0.0)
        if start < 0:
            start = max(total + start, 0.0)
        remaining = total - start
        wanted = float(duration or 0.0)
        if remaining <= 0 or wanted < 0 or (strict_duration and wanted > remaining + 1e-6):
            return None
        span = min(wanted, remaining) if wanted > 0 else remaining
        first = int(round(start * self.frame_rate))
        count = max(1, int(round(span * self.frame_rate)))
        frames = self.frames[first : first + count]
        if frames.shape[0] == 0:
            return None
        audio = None
        if self.audio is not None:
            begin = int(round(start * self.sample_rate))
            audio = self.audio[:, begin : begin + int(round(span * self.sample_rate))]
        return self._derived(frames, audio)

    def as_cropped(self, x: int = 0, y: int = 0, width: int = 0, height: int = 0) -> "H3Video":
        """Crop to the rectangle, clamped to the frame and even-aligned; an empty or full-frame one returns self."""
        full_w, full_h = self.get_dimensions()
        x0, y0 = max(0, min(int(x), full_w)) // 2 * 2, max(0, min(int(y), full_h)) // 2 * 2
        w = min(int(width), full_w - x0) // 2 * 2
        h = min(int(height), full_h - y0) // 2 * 2
        if w <= 0 or h <= 0 or (w, h) == (full_w, full_h):
            return self
        return self._derived(self.frames[:, y0 : y0 + h, x0 : x0 + w].contiguous(), self.audio)

    def __getattr__(self, name: str):
        # Only reached for attributes H3Video lacks. Forward VideoInput methods of the running core (e.g. as_resized)
        # to core's VideoFromComponents; the float components are built when the method is called, not here.
        if name.startswith("_"):
            raise AttributeError(name)
        base, impl = _core_class("VideoInput"), _core_class("VideoFromComponents")
        if base is None or impl is None or not callable(getattr(base, name, None)):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

        def forwarded(*args, **kwargs):
            return getattr(impl(self.get_components()), name)(*args, **kwargs)

        return forwarded

    def __repr__(self) -> str:
        w, h = self.get_dimensions()
        audio = f", audio {tuple(self.audio.shape)} @ {self.sample_rate} Hz" if self.audio is not None else ""
        return f"H3Video({self.get_frame_count()} frames {w}x{h} @ {self.frame_rate} fps{audio})"


def _file_source(video: Any) -> str | None:
    """A path holding exactly `video`'s frames, when core's VideoFromFile says so without decoding anything."""
    if type(video).__name__ != "VideoFromFile" or not hasattr(video, "get_stream_source"):
        return None
    try:
        if getattr(video, "has_pending_frame_edits", lambda: False)():
            return None
        if tuple(getattr(video, "get_active_trim_window", lambda: (0.0, 0.0))()) != (0.0, 0.0):
            return None
        source = video.get_stream_source()
    except Exception:
        return None
    if not isinstance(source, (str, os.PathLike)) or not os.path.isfile(source):
        return None
    from .backend.media.decode import probe_video

    try:
        info = probe_video(source)
        if (info.width, info.height) != tuple(video.get_dimensions()):  # cropped / rotated views decode differently
            return None
    except Exception:
        return None
    return os.fspath(source)


def as_h3_video(video: Any) -> H3Video:
    """Any ComfyUI VIDEO (an object with get_components) -> H3Video (uint8 frames + audio).

    H3Video passes through; core's VideoFromFile without trim / crop edits is decoded straight to uint8 (no float
    IMAGE of the whole clip is ever built); anything else goes through get_components(), its IMAGE converted to
    uint8 in chunks. The first item of a batched AUDIO is used.
    """
    if isinstance(video, H3Video):
        return video
    source = _file_source(video)
    if source is not None:
        return H3Video.from_file(source)
    if not hasattr(video, "get_components"):
        raise TypeError(f"expected a ComfyUI VIDEO (with get_components), got {type(video).__name__}")
    components = video.get_components()
    images = components.images
    if images.dtype != torch.uint8:
        from .backend.finite import check_finite

        check_finite(images, "video's frames")  # the uint8 conversion would turn NaN into black
    frames = images if images.dtype == torch.uint8 else video_to_uint8(images)
    audio = getattr(components, "audio", None)
    waveform = sample_rate = None
    if audio is not None and audio.get("waveform") is not None:
        waveform = audio["waveform"]
        waveform = waveform[0] if waveform.ndim == 3 else waveform
        sample_rate = int(audio["sample_rate"])
    return H3Video(frames, components.frame_rate, waveform, sample_rate, getattr(components, "metadata", None) or {})


def video_to_frames_audio(video: Any) -> tuple[torch.Tensor, Fraction, torch.Tensor | None, int | None]:
    """(uint8 frames [T, H, W, 3], frame_rate, float32 audio [C, S] or None, sample_rate or None) of any VIDEO."""
    h3 = as_h3_video(video)
    return h3.frames, h3.frame_rate, h3.audio, h3.sample_rate

