"""Streamed MP4 writer (H.264 + AAC, PyAV) that never overwrites and never leaves a half-written file behind.

Output: MP4 (movflags faststart + use_metadata_tags), H.264 (libx264, yuv420p, BT.709 limited range, tagged as such;
CRF 18 and preset "veryfast" by default; x264's preset decides B-frames), optional AAC audio (default 128 kbit/s).

File safety:
- The final path must not exist (FileExistsError naming it), unless it is an empty placeholder reserved by
  `next_free_path(..., reserve=True)` and the writer is told so with `reserved=True`.
- Everything is written to a hidden temporary file in the same folder (`.<name>.<random>.tmp`); `close()` publishes it
  under the final name atomically without clobbering (hard link + unlink, or replace of our own empty placeholder).
- An exception inside the `with` block, or any error while closing, deletes the temporary file (and our placeholder):
  the final name never holds a partial video.

Other codecs (`codec=`, see `CODECS` / `available_codecs()`): "h265" (libx265, yuv420p, MP4, tagged hvc1 so Apple
players open it), "prores" (prores_ks 422 HQ, yuv422p10le, MOV; for editors), "ffv1" (FFV1, RGB (bgr0), MKV;
bit-exact lossless RGB, for pipelines). CRF and preset apply to the x264 / x265 codecs only. Only MP4 H.264 / H.265
play in a browser (ComfyUI's preview).

Odd sizes: yuv420p needs even width and height. `odd_size="pad"` (default) repeats the last column / row, so the file
is up to one pixel wider / taller than the frames (`coded_width`, `coded_height` say what was written);
`"crop"` drops the last column / row; `"error"` raises ValueError.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
from fractions import Fraction
from dataclasses import dataclass
from typing import Any, BinaryIO, Mapping

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

_LAYOUTS = {1: "mono", 2: "stereo"}
# AVCOL_* code points (ISO/IEC 23091-2): BT.709 primaries / transfer / matrix.
_BT709 = 1
_ODD_SIZE_MODES = ("pad", "crop", "error")
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")
# Sample rates AAC (MPEG-4 audio sampling frequency index) can signal.



@dataclass(frozen=True)
class Codec:
    """One output choice: the FFmpeg encoder, the pixel format it gets, the container and its file extension."""

    encoder: str
    pix_fmt: str
    container: str
    ext: str
    rate_control: bool  # takes crf + preset (x264 / x265)
    yuv: bool  # BT.709 limited-range YCbCr (chroma subsampled: even sizes); else RGB, any size
    options: tuple = ()
    codec_tag: str | None = None


CODECS = {
    "h264": Codec("libx264", "yuv420p", "mp4", ".mp4", True, True),
    "h265": Codec("libx265", "yuv420p", "mp4", ".mp4", True, True, (("x265-params", "log-level=error"),), "hvc1"),
    "prores": Codec("prores_ks", "yuv422p10le", "mov", ".mov", False, True, (("profile", "3"),)),
    "ffv1": Codec("ffv1", "bgr0", "matroska", ".mkv", False, False, (("level", "3"),)),
}


def available_codecs() -> list[str]:
    """The keys of CODECS whose encoder this PyAV / FFmpeg build has (h264 first)."""
    have = av.codecs_available
    return [name for name, codec in CODECS.items() if codec.encoder in have]


AAC_SAMPLE_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)


def as_fraction(rate: Fraction | float | int | str) -> Fraction:
    """A frame rate as an exact Fraction: 24 -> 24, 23.976... (float of 24000/1001) -> 24000/1001, "30000/1001"."""
    if isinstance(rate, Fraction):
        value = rate
    elif isinstance(rate, int):
        value = Fraction(rate)
    elif isinstance(rate, str):
        value = Fraction(rate.strip())
    else:
        value = Fraction(float(rate)).limit_denominator(1001)
    if value <= 0:
        raise ValueError(f"frame rate must be positive, got {rate!r}")
    return value


def check_encoder_options(codec: str = "h264", crf: float = 18, preset: str = "veryfast") -> None:
    """ValueError naming the bad value when `codec`, `crf` or `preset` cannot be encoded. Callers run this before they
    reserve an output name, so a bad option never leaves a placeholder behind."""
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {sorted(CODECS)}, got {codec!r}")
    if CODECS[codec].encoder not in av.codecs_available:
        raise ValueError(f"this PyAV build has no {CODECS[codec].encoder} encoder; available: {available_codecs()}")
    if preset not in X264_PRESETS:
        raise ValueError(f"preset must be one of {X264_PRESETS}, got {preset!r}")
    try:
        crf_ok = 0 <= float(crf) <= 51  # NaN compares False: refused too
    except (TypeError, ValueError):
        crf_ok = False
    if not crf_ok:
        raise ValueError(f"crf must be a number in 0..51 (0 = lossless luma, 18 ~ visually lossless), got {crf!r}")


def _exists_error(path: str, hint: str = "") -> FileExistsError:
    return FileExistsError(errno.EEXIST, f"refusing to overwrite an existing file{hint}", path)


def reserve_path(path: str) -> str:
    """Claim `path` as an empty placeholder (O_CREAT|O_EXCL): FileExistsError if anything is there. A writer given
    `reserved=True` publishes onto it; `release_placeholder` removes it when nothing was published."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    return path


def release_placeholder(path: str) -> None:
    """Remove `path` if it is still an empty placeholder (never a published file)."""
    try:
        if os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass


def next_free_path(
    directory: str | os.PathLike,
    prefix: str,
    ext: str = ".mp4",
    *,
    digits: int = 5,
    reserve: bool = True,
) -> str:
    """First `<directory>/<prefix>_<counter>.<ext>` (counter from 1, zero-padded to `digits`) that does not exist.

    `prefix` may contain sub-folders ("video/h3"); they are created, but may not leave `directory`.
    With `reserve=True` (default) the name is claimed with O_CREAT|O_EXCL as an empty placeholder file, so two
    concurrent savers never get the same name; pass the path to `Mp4Writer(..., reserved=True)`, which replaces the
    placeholder on success and removes it on failure. With `reserve=False` nothing is created (racy; for previews).
    """
    if not prefix or os.path.isabs(prefix):
        raise ValueError(f"prefix must be a non-empty relative name, got {prefix!r}")
    if ext and not ext.startswith("."):
        ext = "." + ext
    root = os.path.abspath(os.fspath(directory))
    target = os.path.abspath(os.path.join(root, prefix))
    if os.path.commonpath([root, target]) != root or target == root:
        raise ValueError(f"prefix {prefix!r} escapes the output directory {root!r}")
    folder, stem = os.path.split(target)
    os.makedirs(folder, exist_ok=True)
    taken = set(os.listdir(folder))
    counter = 0
    while True:
        counter += 1
        name = f"{stem}_{counter:0{digits}d}{ext}"
        if name in taken:
            continue
        path = os.path.join(folder, name)
        if not reserve:
            if not os.path.lexists(path):
                return path
            continue
        try:
            return reserve_path(path)
        except FileExistsError:
            continue


def _publish(temp_path: str, final_path: str, reserved: bool) -> None:
    """Move the finished temp file to its final name without ever clobbering someone else's file."""
    if reserved:
        try:
            size = os.stat(final_path).st_size
        except FileNotFoundError:
            size = None  # the placeholder vanished: publish as if unreserved
        if size is not None:
            if size != 0:
                raise _exists_error(final_path, " (its reserved placeholder was written by someone else)")
            os.replace(temp_path, final_path)
            return
    try:
        os.link(temp_path, final_path)  # atomic, fails if the name exists
    except FileExistsError:
        raise _exists_error(final_path) from None
    except OSError:
        # No hard links on this file system: claim the name exclusively, then replace our own empty claim.
        reserve_path(final_path)  # FileExistsError if taken
        os.replace(temp_path, final_path)
        return
    os.unlink(temp_path)


def _create_temp_beside(final_path: str) -> str:
    """Create `.<name>.<random>.tmp` next to `final_path` (O_EXCL, usual umask-based permissions) and return it."""
    folder, name = os.path.split(final_path)
    while True:
        temp_path = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return temp_path


def check_target(final: str, reserved: bool) -> None:
    """The no-clobber rule for a final path: a reserved one must be next_free_path's empty placeholder, any other
    must not exist. Raises FileExistsError naming the path."""
    if reserved:
        if not os.path.isfile(final) or os.path.getsize(final) != 0:
            raise _exists_error(final, " (reserved=True expects the empty placeholder from next_free_path)")
    elif os.path.lexists(final):
        raise _exists_error(final, " (did you reserve it with next_free_path? then pass reserved=True)")


def takes_yuv420p(codec: str, width: int, height: int) -> bool:
    """Whether an Mp4Writer with these settings accepts `write_yuv420p` (a yuv420p codec at an even size)."""
    return CODECS[codec].pix_fmt == "yuv420p" and int(width) % 2 == 0 and int(height) % 2 == 0


def _to_numpy(array: Any) -> np.ndarray:
    if hasattr(array, "detach") and hasattr(array, "cpu"):  # torch.Tensor, without importing torch here
        array = array.detach().cpu().numpy()
    return np.asarray(array)


class Mp4Writer:
    """Streamed H.264/AAC MP4 writer. Use as a context manager.

    >>> with Mp4Writer(path, 1344, 768, 24, audio_sample_rate=32000) as writer:
    ...     for chunk in chunks:                 # uint8 [t, H, W, 3] tensors or arrays, any number of calls
    ...         writer.write_frames(chunk)
    ...     writer.write_audio(waveform)         # float32 [C, S] in -1..1, any time, any number of calls

    `path` may also be a seekable binary file object (e.g. io.BytesIO): then it is written directly (no temp file, no
    faststart, no overwrite check). `metadata` values that are not strings are stored as JSON (ComfyUI convention:
    "prompt" and "workflow" keys let the ComfyUI frontend reload the workflow from the file).
    """

    def __init__(
        self,
        path: str | os.PathLike | BinaryIO,
        width: int,
        height: int,
        fps: Fraction | float,
        audio_sample_rate: int | None = None,
        audio_channels: int = 2,
        crf: float = 18,
        preset: str = "veryfast",
        *,
        metadata: Mapping[str, Any] | None = None,
        odd_size: str = "pad",
        audio_bitrate: int = 128_000,
        reserved: bool = False,
        codec: str = "h264",
        threads: int | None = None,
        thread_type: str | None = None,
    ):
        self._reserved = bool(reserved)
        self._file_object = not isinstance(path, (str, os.PathLike))
        self.path: str | BinaryIO = path if self._file_object else os.path.abspath(os.fspath(path))
        self.temp_path: str | None = None
        self._container = None
        self.closed = False
        try:  # a writer that cannot start gives its reserved placeholder back, whatever the reason
            self._setup(width, height, fps, audio_sample_rate, audio_channels, crf, preset, metadata, odd_size,
                        audio_bitrate, codec, threads, thread_type)
        except BaseException:
            self._abort()
            raise

    def _setup(self, width, height, fps, audio_sample_rate, audio_channels, crf, preset, metadata, odd_size,
               audio_bitrate, codec, threads=None, thread_type=None) -> None:
        width, height = int(width), int(height)
        check_encoder_options(codec, crf, preset)
        self.codec = CODECS[codec]
        if not self.codec.yuv:
            odd_size = "keep"
        if width <= 0 or height <= 0:
            raise ValueError(f"width and height must be positive, got {width}x{height}")
        if odd_size not in _ODD_SIZE_MODES + ("keep",):
            raise ValueError(f"odd_size must be one of {_ODD_SIZE_MODES}, got {odd_size!r}")
        if (width % 2 or height % 2) and odd_size == "error":
            raise ValueError(f"H.264 yuv420p needs an even width and height, got {width}x{height}")
        if odd_size == "crop" and (width < 2 or height < 2):
            raise ValueError(f"cannot crop {width}x{height} to an even size")
        if audio_sample_rate is not None and int(audio_sample_rate) not in AAC_SAMPLE_RATES:
            raise ValueError(
                f"AAC cannot store {audio_sample_rate} Hz; use one of {AAC_SAMPLE_RATES} "
                "(write_audio(waveform, sample_rate=...) resamples into the stream's rate)"
            )
        if audio_channels not in _LAYOUTS:
            raise ValueError(f"audio_channels must be 1 or 2, got {audio_channels}")

        self.width, self.height = width, height
        self.odd_size = odd_size
        round_even = {"pad": lambda n: n + n % 2, "crop": lambda n: n - n % 2, "keep": lambda n: n}[odd_size]
        self.coded_width, self.coded_height = round_even(width), round_even(height)
        self.fps = as_fraction(fps)
        self.audio_sample_rate = int(audio_sample_rate) if audio_sample_rate is not None else None
        self.audio_channels = audio_channels
        self.frames_written = 0
        self.audio_samples_written = 0
        self._movflags = self.codec.container in ("mp4", "mov")
        self._audio_stream = None
        self._resamplers: dict[int, av.AudioResampler] = {}
        self._reformatter = VideoReformatter()
        self._threads = None if threads is None else int(threads)
        if self._threads is not None and self._threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = the encoder's own choice), got {threads}")
        # "slice": threads split each frame (PyAV's default: a frame is done soon after it arrives); "frame": threads
        # take whole frames (more throughput, frames in flight); None: PyAV's default
        if thread_type not in (None, "slice", "frame"):
            raise ValueError(f"thread_type must be 'slice', 'frame' or None, got {thread_type!r}")
        self._thread_type = thread_type
        self._open(metadata, crf, preset, audio_bitrate)

    # -- setup ---------------------------------------------------------------------------------------------------------
    def _open(self, metadata, crf, preset, audio_bitrate) -> None:
        if self._file_object:
            target, options = self.path, {"movflags": "use_metadata_tags"} if self._movflags else {}
        else:
            final = self.path
            check_target(final, self._reserved)
            self.temp_path = _create_temp_beside(final)
            target = self.temp_path
            options = {"movflags": "faststart+use_metadata_tags"} if self._movflags else {}

        self._container = av.open(target, mode="w", format=self.codec.container, options=options)
        for key, value in (metadata or {}).items():
            self._container.metadata[str(key)] = value if isinstance(value, str) else json.dumps(value)

        codec_options = dict(self.codec.options)
        if self.codec.rate_control:
            codec_options.update(crf=str(crf), preset=str(preset))
        stream = self._container.add_stream(self.codec.encoder, rate=self.fps, options=codec_options)
        stream.width, stream.height = self.coded_width, self.coded_height
        stream.pix_fmt = self.codec.pix_fmt
        if self.codec.codec_tag:
            stream.codec_tag = self.codec.codec_tag
        context = stream.codec_context
        context.time_base = 1 / self.fps
        if self._threads:
            context.thread_count = self._threads
        if self._thread_type:
            context.thread_type = self._thread_type.upper()
        if self.codec.yuv:
            context.color_primaries = context.color_trc = context.colorspace = _BT709
            context.color_range = ColorRange.MPEG
        self._video_stream = stream

        if self.audio_sample_rate is not None:
            audio = self._container.add_stream(
                "aac", rate=self.audio_sample_rate, layout=_LAYOUTS[self.audio_channels]
            )
            audio.codec_context.bit_rate = int(audio_bitrate)
            self._audio_stream = audio

    # -- writing -------------------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("Mp4Writer is closed")

    def _mux(self, packets) -> None:
        for packet in packets:
            self._container.mux(packet)

    def write_frames(self, frames: Any) -> None:
        """Encode uint8 RGB frames [T, H, W, 3] (or one [H, W, 3]); a CUDA tensor is copied to the host first."""
        self._check_open()
        array = _to_numpy(frames)
        if array.dtype != np.uint8:
            raise TypeError(
                f"write_frames expects uint8 frames, got dtype {array.dtype} "
                "(convert float video with backend.media.frames.video_to_uint8)"
            )
        if array.ndim == 3:
            array = array[None]
        if array.ndim != 4 or array.shape[1:] != (self.height, self.width, 3):
            raise ValueError(
                f"write_frames expects uint8 [T, {self.height}, {self.width}, 3], got shape {tuple(array.shape)}"
            )
        pad_h, pad_w = self.coded_height - self.height, self.coded_width - self.width
        for image in array:
            if pad_h > 0 or pad_w > 0:
                image = np.pad(image, ((0, max(pad_h, 0)), (0, max(pad_w, 0)), (0, 0)), mode="edge")
            elif pad_h < 0 or pad_w < 0:
                image = image[: self.coded_height, : self.coded_width]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            if self.codec.yuv:
                frame = self._reformatter.reformat(
                    frame,
                    format=self.codec.pix_fmt,
                    src_colorspace=Colorspace.ITU709,
                    dst_colorspace=Colorspace.ITU709,
                    src_color_range=ColorRange.JPEG,
                    dst_color_range=ColorRange.MPEG,
                )
            else:
                frame = self._reformatter.reformat(frame, format=self.codec.pix_fmt)
            self._encode_frame(frame)

    @property
    def takes_yuv420p(self) -> bool:
        """True when `write_yuv420p` applies: a yuv420p codec at an even size (nothing to pad or crop)."""
        return self.codec.pix_fmt == "yuv420p" and (self.coded_width, self.coded_height) == (self.width, self.height)

    def write_yuv420p(self, planes: Any) -> None:
        """Encode frames already converted to BT.709 limited-range YUV 4:2:0 (backend/media/yuv.py's layout: uint8
        [T, H * 3 // 2, W], or one [H * 3 // 2, W]); no CPU colour conversion. Only when `takes_yuv420p`."""
        self._check_open()
        if not self.takes_yuv420p:
            raise ValueError(f"write_yuv420p needs a yuv420p codec at an even size, not {self.codec.encoder} "
                             f"{self.codec.pix_fmt} at {self.width}x{self.height}")
        array = _to_numpy(planes)
        if array.ndim == 2:
            array = array[None]
        if array.dtype != np.uint8 or array.ndim != 3 or array.shape[1:] != (self.height * 3 // 2, self.width):
            raise ValueError(f"write_yuv420p expects uint8 [T, {self.height * 3 // 2}, {self.width}], "
                             f"got {array.dtype} {tuple(array.shape)}")
        for image in array:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="yuv420p")
            frame.color_range = ColorRange.MPEG
            frame.colorspace = Colorspace.ITU709
            self._encode_frame(frame)

    def _encode_frame(self, frame) -> None:
        frame.pts = self.frames_written
        frame.time_base = self._video_stream.codec_context.time_base
        self._mux(self._video_stream.encode(frame))
        self.frames_written += 1

    def write_audio(self, waveform: Any, sample_rate: int | None = None) -> None:
        """Encode float audio [C, S] (or ComfyUI's [1, C, S]) in -1..1; values outside are clipped.

        Mono input into a stereo stream is duplicated, stereo into mono is averaged. `sample_rate` (default: the
        stream's) other than the stream's is resampled with libswresample.
        """
        self._check_open()
        if self._audio_stream is None:
            raise ValueError("this Mp4Writer has no audio stream: pass audio_sample_rate to enable audio")
        array = _to_numpy(waveform)
        if array.ndim == 3 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 2 or array.shape[0] not in _LAYOUTS:
            raise ValueError(f"write_audio expects a [channels (1 or 2), samples] waveform, got {tuple(array.shape)}")
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"write_audio expects float samples in -1..1, got dtype {array.dtype}")
        if array.shape[1] == 0:
            return
        array = np.clip(array.astype(np.float32, copy=False), -1.0, 1.0)
        if array.shape[0] != self.audio_channels:
            array = np.repeat(array, 2, axis=0) if self.audio_channels == 2 else array.mean(axis=0, keepdims=True)
        rate = self.audio_sample_rate if sample_rate is None else int(sample_rate)
        if rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")

        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(array), format="fltp", layout=_LAYOUTS[self.audio_channels]
        )
        frame.sample_rate = rate
        if rate == self.audio_sample_rate:
            self._encode_audio([frame])
        else:
            self._encode_audio(self._resampler(rate).resample(frame))

    def _resampler(self, rate: int) -> av.AudioResampler:
        if rate not in self._resamplers:
            self._resamplers[rate] = av.AudioResampler(
                format="fltp", layout=_LAYOUTS[self.audio_channels], rate=self.audio_sample_rate
            )
        return self._resamplers[rate]

    def _encode_audio(self, frames) -> None:
        for frame in frames:
            frame.pts = self.audio_samples_written
            frame.time_base = Fraction(1, self.audio_sample_rate)
            self._mux(self._audio_stream.encode(frame))
            self.audio_samples_written += frame.samples

    # -- finishing -----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush the encoders, finish the file and publish it under its final name. Idempotent."""
        if self.closed:
            return
        try:
            if self.frames_written == 0:
                raise ValueError(f"no video frames were written to {self.path!r}")
            for resampler in self._resamplers.values():
                self._encode_audio(resampler.resample(None))
            self._mux(self._video_stream.encode(None))
            if self._audio_stream is not None:
                self._mux(self._audio_stream.encode(None))
            container, self._container = self._container, None
            container.close()
            if not self._file_object:
                _publish(self.temp_path, self.path, self._reserved)
                self.temp_path = None
        except BaseException:
            self._abort()
            raise
        self.closed = True

    def abort(self) -> None:
        """Stop without publishing: the temporary file (and a reserved placeholder) are removed."""
        if not self.closed:
            self._abort()

    def _abort(self) -> None:
        self.closed = True
        container, self._container = self._container, None
        if container is not None:
            try:
                container.close()
            except Exception:
                pass
        if self._file_object:
            return
        if self.temp_path is not None:
            _remove_quietly(self.temp_path)
            self.temp_path = None
        if self._reserved:
            release_placeholder(self.path)

    def __enter__(self) -> "Mp4Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
