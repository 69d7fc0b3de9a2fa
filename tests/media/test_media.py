"""Media layer: MP4 writer, decoder, uint8 conversion, H3Video (tiny clips; CPU only)."""

from __future__ import annotations

import io
import os
import threading
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from comfyui_h3.backend.media import (
    Mp4Writer,
    as_fraction,
    decode_video,
    hold_counts,
    iter_uint8_chunks,
    next_free_path,
    probe_video,
    uint8_to_image,
    video_to_uint8,
)
from comfyui_h3.video_types import H3Video, LocalVideoComponents, as_h3_video, video_to_frames_audio

T, H, W, FPS, SR = 30, 48, 64, 24, 32000
LEVELS = 8  # frame i is a flat-ish image whose mean level is 16 + LEVELS * i: identifies the source frame


def _smooth_frames(count: int = T, height: int = H, width: int = W) -> torch.Tensor:
    """uint8 [count, H, W, 3]: a gentle diagonal ramp (+-12 levels) around a per-frame grey level."""
    yy, xx = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    ramp = ((xx + yy).float() / (width + height) * 24 - 12)[None, :, :, None]
    base = (16 + LEVELS * torch.arange(count).float())[:, None, None, None]
    tint = torch.tensor([0.0, 6.0, -6.0])[None, None, None, :]
    return (base + ramp + tint).round().clamp(0, 255).to(torch.uint8)


def _tone(samples: int, rate: int = SR) -> torch.Tensor:
    t = torch.arange(samples, dtype=torch.float64) / rate
    return (0.4 * torch.stack([torch.sin(2 * torch.pi * 440 * t), torch.sin(2 * torch.pi * 660 * t)])).float()


def _frame_ids(frames: torch.Tensor) -> list[int]:
    """Which source frame (of _smooth_frames) each decoded frame shows."""
    means = frames.float().mean(dim=(1, 2, 3))
    return [int(round((float(m) - 16) / LEVELS)) for m in means]


def _write(path, frames=None, audio=None, fps=FPS, **kwargs) -> None:
    frames = _smooth_frames() if frames is None else frames
    with Mp4Writer(path, frames.shape[2], frames.shape[1], fps, **kwargs) as writer:
        for chunk in frames.split(7):
            writer.write_frames(chunk)
        if audio is not None:
            writer.write_audio(audio)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> str:
    """The shared round-trip clip: 30 frames 64x48 at 24 fps, 1.25 s of 32 kHz stereo written in three pieces."""
    path = str(tmp_path_factory.mktemp("clip") / "clip.mp4")
    audio = _tone(SR * T // FPS)
    with Mp4Writer(path, W, H, Fraction(FPS), audio_sample_rate=SR, metadata={"prompt": {"1": "x"}}) as writer:
        writer.write_audio(audio[:, :10_000])  # audio before, between and after the video chunks
        for chunk in _smooth_frames().split(7):
            writer.write_frames(chunk)
            if writer.frames_written == 14:
                writer.write_audio(audio[:, 10_000:25_000])
        writer.write_audio(audio[:, 25_000:])
    return path


def _no_temp_files(folder) -> bool:
    return not [name for name in os.listdir(folder) if name.endswith(".tmp")]


# -- Mp4Writer ---------------------------------------------------------------------------------------------------------
def test_round_trip_streams_with_pyav(clip):
    with av.open(clip) as container:
        assert len(container.streams.video) == 1 and len(container.streams.audio) == 1
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert video.codec_context.name == "h264" and video.format.name == "yuv420p"
        assert (video.width, video.height) == (W, H)
        assert video.average_rate == FPS
        assert video.codec_context.colorspace == 1 and video.codec_context.color_range == 1  # BT.709, limited
        assert audio.codec_context.name == "aac" and audio.sample_rate == SR and audio.channels == 2
        assert container.duration / av.time_base == pytest.approx(T / FPS, abs=0.02)
        assert container.metadata["prompt"] == '{"1": "x"}'
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == T
    error = np.abs(np.stack(decoded).astype(np.int16) - _smooth_frames().numpy().astype(np.int16))
    assert error.mean() < 1.0 and error.max() <= 6


def test_round_trip_with_decoder(clip):
    decoded = decode_video(clip)
    assert decoded.frames.dtype == torch.uint8 and tuple(decoded.frames.shape) == (T, H, W, 3)
    assert decoded.frame_rate == Fraction(FPS) and decoded.source_frame_rate == Fraction(FPS)
    assert _frame_ids(decoded.frames) == list(range(T))
    assert decoded.sample_rate == SR and decoded.audio.dtype == torch.float32
    assert tuple(decoded.audio.shape) == (2, SR * T // FPS)  # AAC priming and padding removed
    reference = _tone(SR * T // FPS)
    inner = slice(8192, -2048)  # the AAC encoder settles over its first few frames after the abrupt start
    assert (decoded.audio[:, inner] - reference[:, inner]).abs().max() < 0.05
    assert (decoded.audio - reference).pow(2).mean().sqrt() < 0.1 * reference.pow(2).mean().sqrt()
    info = probe_video(clip)
    assert (info.width, info.height, info.frame_rate, info.frame_count) == (W, H, Fraction(FPS), T)
    assert info.has_audio and info.sample_rate == SR and info.audio_channels == 2


def test_flat_colours_survive_bt709_round_trip(tmp_path):
    colours = [(200, 50, 100), (20, 180, 240), (128, 128, 128), (255, 255, 255), (0, 0, 0), (250, 10, 10)]
    frames = torch.tensor(colours, dtype=torch.uint8)[:, None, None, :].expand(-1, 16, 16, 3).contiguous()
    path = tmp_path / "flat.mp4"
    _write(path, frames, crf=0)
    decoded = decode_video(path).frames.int()
    assert (decoded - frames.int()).abs().max() <= 3


def test_video_only_and_mono_audio(tmp_path):
    _write(tmp_path / "silent.mp4")
    silent = decode_video(tmp_path / "silent.mp4")
    assert silent.audio is None and silent.sample_rate is None
    _write(tmp_path / "mono.mp4", audio=_tone(20_000)[:1], audio_sample_rate=SR)  # mono into a stereo stream
    with av.open(str(tmp_path / "mono.mp4")) as container:
        assert container.streams.audio[0].channels == 2


def test_write_audio_resamples_other_rates(tmp_path):
    path = tmp_path / "resampled.mp4"
    with Mp4Writer(path, W, H, FPS, audio_sample_rate=SR) as writer:
        writer.write_frames(_smooth_frames())
        writer.write_audio(_tone(48_000, rate=48_000), sample_rate=48_000)  # 1 s at 48 kHz
    decoded = decode_video(path)
    assert decoded.sample_rate == SR and abs(decoded.audio.shape[1] - SR) <= 64


def test_never_overwrites(tmp_path):
    path = tmp_path / "taken.mp4"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError) as info:
        _write(path)
    assert info.value.filename == str(path)
    assert path.read_bytes() == b"precious" and _no_temp_files(tmp_path)


def test_file_appearing_while_writing_is_not_clobbered(tmp_path):
    path = tmp_path / "race.mp4"
    writer = Mp4Writer(path, W, H, FPS)
    writer.write_frames(_smooth_frames())
    path.write_bytes(b"someone else")
    with pytest.raises(FileExistsError):
        writer.close()
    assert path.read_bytes() == b"someone else" and _no_temp_files(tmp_path)


def test_exception_leaves_no_file(tmp_path):
    path = tmp_path / "broken.mp4"
    with pytest.raises(RuntimeError, match="boom"):
        with Mp4Writer(path, W, H, FPS, audio_sample_rate=SR) as writer:
            writer.write_frames(_smooth_frames()[:10])
            hidden = [name for name in os.listdir(tmp_path) if name.startswith(".broken.mp4.")]
            assert hidden and not path.exists()  # work in progress lives under a hidden temp name
            raise RuntimeError("boom")
    assert not path.exists() and os.listdir(tmp_path) == []


def test_bad_input_and_empty_video_leave_no_file(tmp_path):
    path = tmp_path / "bad.mp4"
    with pytest.raises(TypeError, match="uint8"):
        with Mp4Writer(path, W, H, FPS) as writer:
            writer.write_frames(torch.zeros(2, H, W, 3))
    with pytest.raises(ValueError, match=r"\[T, 48, 64, 3\]"):
        with Mp4Writer(path, W, H, FPS) as writer:
            writer.write_frames(torch.zeros(2, H, W + 2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="no video frames"):
        with Mp4Writer(path, W, H, FPS):
            pass
    with pytest.raises(ValueError, match="AAC"):
        Mp4Writer(path, W, H, FPS, audio_sample_rate=40_000)
    with pytest.raises(ValueError, match="preset"):
        Mp4Writer(path, W, H, FPS, preset="warp")
    with pytest.raises(ValueError, match="crf"):
        Mp4Writer(path, W, H, FPS, crf=60)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "mode, size", [("pad", (64, 48)), ("crop", (62, 46))]
)
def test_odd_sizes(tmp_path, mode, size):
    frames = _smooth_frames(6, 47, 63)
    path = tmp_path / f"odd_{mode}.mp4"
    with Mp4Writer(path, 63, 47, FPS, odd_size=mode) as writer:
        assert (writer.coded_width, writer.coded_height) == size
        writer.write_frames(frames)
    decoded = decode_video(path).frames
    assert (decoded.shape[2], decoded.shape[1]) == size
    common = (slice(None), slice(0, 46), slice(0, 62))
    assert (decoded[common].int() - frames[common].int()).abs().float().mean() < 1.0


def test_odd_size_error_mode(tmp_path):
    with pytest.raises(ValueError, match="even"):
        Mp4Writer(tmp_path / "x.mp4", 63, 48, FPS, odd_size="error")
    assert os.listdir(tmp_path) == []


def test_write_to_file_object():
    buffer = io.BytesIO()
    with Mp4Writer(buffer, W, H, FPS) as writer:
        writer.write_frames(_smooth_frames()[:5])
    assert decode_video(buffer).frames.shape[0] == 5


# -- next_free_path ----------------------------------------------------------------------------------------------------
def test_next_free_path_counts_and_reserves(tmp_path):
    first = next_free_path(tmp_path, "h3")
    assert os.path.basename(first) == "h3_00001.mp4" and os.path.getsize(first) == 0  # reserved placeholder
    second = next_free_path(tmp_path, "h3")
    assert os.path.basename(second) == "h3_00002.mp4"
    os.remove(first)  # a gap is reused: the first free counter wins
    assert os.path.basename(next_free_path(tmp_path, "h3", reserve=False)) == "h3_00001.mp4"
    assert os.path.basename(next_free_path(tmp_path, "h3", ".wav", digits=3)) == "h3_001.wav"
    sub = next_free_path(tmp_path, "video/run")
    assert sub == str(tmp_path / "video" / "run_00001.mp4")
    with pytest.raises(ValueError, match="escapes"):
        next_free_path(tmp_path, "../outside")


def test_next_free_path_is_race_free(tmp_path):
    results: list[str] = []
    lock = threading.Lock()

    def claim():
        for _ in range(5):
            path = next_free_path(tmp_path, "race")
            with lock:
                results.append(path)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 20 and len(set(results)) == 20


def test_reserved_path_is_replaced_or_released(tmp_path):
    path = next_free_path(tmp_path, "out")
    with pytest.raises(FileExistsError, match="reserved=True"):
        Mp4Writer(path, W, H, FPS)  # a reserved name is still an existing file unless told otherwise
    _write(path, reserved=True)
    assert decode_video(path).frames.shape[0] == T
    released = next_free_path(tmp_path, "out")
    with pytest.raises(RuntimeError):
        with Mp4Writer(released, W, H, FPS, reserved=True) as writer:
            writer.write_frames(_smooth_frames()[:3])
            raise RuntimeError("cancelled")
    assert not os.path.exists(released) and _no_temp_files(tmp_path)


# -- decode options ----------------------------------------------------------------------------------------------------
def _reference_hold(num: int, src: float, target: float) -> list[int]:
    """The MiniMax-H3 reference's hold resample, on frame indices (numpy float, as diffusers writes it)."""
    scale = target / src
    slots = np.floor(np.arange(num) * scale + 0.5).astype(np.int64)
    counts = np.diff(slots, append=int(np.floor(num * scale + 0.5)))
    return np.repeat(np.arange(num), counts).tolist()


@pytest.mark.parametrize("target", [12, 30, 60, 15, 24])
def test_hold_counts_match_reference(target):
    expected = _reference_hold(T, FPS, target)
    assert np.repeat(np.arange(T), hold_counts(T, Fraction(FPS), Fraction(target))).tolist() == expected
    assert _reference_hold(73, 29.97, 24) == np.repeat(
        np.arange(73), hold_counts(73, Fraction(2997, 100), Fraction(24))
    ).tolist()


@pytest.mark.parametrize(
    "options, ids, rate",
    [
        ({"frame_load_cap": 10}, list(range(10)), 24),
        ({"skip_first_frames": 25}, list(range(25, 30)), 24),
        ({"select_every_nth": 4}, list(range(0, 30, 4)), 6),
        ({"skip_first_frames": 3, "select_every_nth": 2, "frame_load_cap": 4}, [3, 5, 7, 9], 12),
        ({"force_rate": 12}, _reference_hold(T, FPS, 12), 12),
        ({"force_rate": 30}, _reference_hold(T, FPS, 30), 30),
        ({"force_rate": 30, "skip_first_frames": 4, "select_every_nth": 3, "frame_load_cap": 5},
         _reference_hold(T, FPS, 30)[4::3][:5], 10),
    ],
)
def test_decode_options(clip, options, ids, rate):
    decoded = decode_video(clip, **options)
    assert _frame_ids(decoded.frames) == ids
    assert decoded.frame_rate == Fraction(rate)
    # the soundtrack covers the same span as the frames
    first = options.get("skip_first_frames", 0) / Fraction(options.get("force_rate") or FPS)
    span = len(ids) * options.get("select_every_nth", 1) / Fraction(options.get("force_rate") or FPS)
    expected = min(round(span * SR), SR * T // FPS - round(first * SR))
    assert abs(decoded.audio.shape[1] - expected) <= 1


def test_decode_errors(tmp_path, clip):
    with pytest.raises(FileNotFoundError):
        decode_video(tmp_path / "missing.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video" * 100)
    with pytest.raises(ValueError, match="cannot read"):
        decode_video(junk)
    audio_only = str(tmp_path / "audio.m4a")
    with av.open(audio_only, "w") as container:
        stream = container.add_stream("aac", rate=SR, layout="stereo")
        frame = av.AudioFrame.from_ndarray(_tone(4096).numpy(), format="fltp", layout="stereo")
        frame.sample_rate = SR
        for packet in list(stream.encode(frame)) + list(stream.encode(None)):
            container.mux(packet)
    with pytest.raises(ValueError, match="no video stream"):
        decode_video(audio_only)
    with pytest.raises(ValueError, match="no frames left"):
        decode_video(clip, skip_first_frames=T)
    with pytest.raises(ValueError, match="select_every_nth"):
        decode_video(clip, select_every_nth=0)


# -- uint8 conversion --------------------------------------------------------------------------------------------------
def _reference_uint8(video: np.ndarray) -> np.ndarray:
    x = np.nan_to_num(video.astype(np.float64), nan=0.0)
    return np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)  # np.round: half to even


def _near_ties() -> torch.Tensor:
    """float32 values at and around every k + 1/2 rounding tie, plus out-of-range ones and NaN."""
    ties = (np.arange(255) + 0.5) / 255.0
    values = [ties.astype(np.float32)]
    for direction in (1.0, -1.0):
        step = ties.astype(np.float32)
        for _ in range(3):
            step = np.nextafter(step, np.float32(direction))
            values.append(step)
    values.append(np.array([-1.0, -0.0, 0.0, 1.0, 1.5, np.inf, -np.inf, np.nan], dtype=np.float32))
    flat = np.concatenate(values)
    flat = np.concatenate([flat, np.zeros((-len(flat)) % 12, np.float32)])
    return torch.from_numpy(flat.reshape(-1, 2, 2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_uint8_matches_float64_reference(dtype):
    video = _near_ties().to(dtype)
    video = torch.cat([video, torch.rand(8, 2, 2, 3, generator=torch.Generator().manual_seed(0)).to(dtype)])
    expected = _reference_uint8(video.float().numpy() if dtype == torch.bfloat16 else video.numpy())
    got = video_to_uint8(video, chunk_frames=5)
    assert got.dtype == torch.uint8 and got.device == video.device
    assert np.array_equal(got.numpy(), expected)


def test_uint8_channels_first_layout_and_chunks():
    video = torch.rand(1, 3, 7, 5, 4, generator=torch.Generator().manual_seed(1)) * 1.2 - 0.1
    frames_last = video[0].permute(1, 2, 3, 0)
    expected = _reference_uint8(frames_last.numpy())
    assert np.array_equal(video_to_uint8(video).numpy(), expected)
    assert np.array_equal(video_to_uint8(frames_last, chunk_frames=2).numpy(), expected)
    assert np.array_equal(video_to_uint8(video, chunk_bytes=1).numpy(), expected)  # one frame per chunk
    chunks = list(iter_uint8_chunks(video, chunk_frames=3))
    assert [c.shape[0] for c in chunks] == [3, 3, 1] and all(c.is_contiguous() for c in chunks)
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\]"):
        video_to_uint8(torch.rand(2, 4, 4, 4))
    with pytest.raises(TypeError, match="floating"):
        video_to_uint8(torch.zeros(2, 4, 4, 3, dtype=torch.uint8))


def test_uint8_to_image():
    frames = torch.arange(256, dtype=torch.uint8).repeat(3).reshape(4, 8, 8, 3)
    image = uint8_to_image(frames, chunk_frames=3)
    assert image.dtype == torch.float32 and image.shape == frames.shape
    assert torch.equal(image, frames.float() / 255.0)
    assert torch.equal(video_to_uint8(image), frames)  # exact inverse


# -- H3Video -----------------------------------------------------------------------------------------------------------
def test_h3video_methods():
    frames, audio = _smooth_frames(), _tone(SR * T // FPS + 777)  # audio a little longer than the video
    video = H3Video(frames, 24.0, audio, SR, {"title": "t"})
    assert video.get_dimensions() == (W, H) and video.get_display_dimensions() == (W, H)
    assert video.get_frame_count() == T and video.get_frame_rate() == Fraction(24)
    assert video.get_duration() == pytest.approx(1.25)
    assert video.get_bit_depth() == 8 and not video.has_pending_frame_edits()
    components = video.get_components()
    assert isinstance(components, LocalVideoComponents)  # ComfyUI is not importable here
    assert components.images.dtype == torch.float32 and tuple(components.images.shape) == (T, H, W, 3)
    assert torch.equal(components.images, frames.float() / 255.0)
    assert components.frame_rate == Fraction(24) and components.metadata == {"title": "t"}
    assert tuple(components.audio["waveform"].shape) == (1, 2, audio.shape[1])
    assert components.audio["sample_rate"] == SR
    with pytest.raises(AttributeError):
        video.as_resized  # forwarded to ComfyUI's VideoFromComponents only when ComfyUI is importable
    with pytest.raises(ValueError, match="uint8"):
        H3Video(frames.float(), FPS)


def test_h3video_trim_and_crop():
    video = H3Video(_smooth_frames(), FPS, _tone(SR * T // FPS), SR)
    part = video.as_trimmed(0.5, 0.25)
    assert _frame_ids(part.frames) == list(range(12, 18)) and part.audio.shape[1] == SR // 4
    assert _frame_ids(video.as_trimmed(-0.25).frames) == list(range(24, 30))
    assert video.as_trimmed(2.0) is None and video.as_trimmed(1.0, 1.0, strict_duration=True) is None
    cropped = video.as_cropped(3, 3, 41, 21)
    assert cropped.get_dimensions() == (40, 20) and torch.equal(cropped.frames, video.frames[:, 2:22, 2:42])
    assert video.as_cropped(0, 0, 0, 0) is video


def test_h3video_save_to_and_stream_source(tmp_path):
    video = H3Video(_smooth_frames(), FPS, _tone(SR * T // FPS + 5000), SR)
    path = tmp_path / "saved.mp4"
    video.save_to(str(path), format="auto", codec="h264", metadata={"workflow": {"nodes": []}})
    decoded = decode_video(path)
    assert _frame_ids(decoded.frames) == list(range(T))
    assert decoded.audio.shape[1] == SR * T // FPS  # cut to the video's length
    assert decoded.metadata["workflow"] == '{"nodes": []}'
    with pytest.raises(FileExistsError):
        video.save_to(str(path))
    with pytest.raises(ValueError, match="MP4"):
        video.save_to(str(tmp_path / "x.webm"), format="webm")
    source = video.get_stream_source()
    assert isinstance(source, io.BytesIO) and decode_video(source).frames.shape[0] == T
    loaded = H3Video.from_file(path)
    assert loaded.get_stream_source() == str(path) and loaded.get_frame_count() == T
    assert H3Video.from_file(path, frame_load_cap=3).source_path is None


def test_as_h3_video_wraps_any_video_like():
    frames = _smooth_frames(5)
    components = LocalVideoComponents(
        images=frames.float() / 255.0,
        frame_rate=Fraction(30000, 1001),
        audio={"waveform": _tone(1000)[None], "sample_rate": 44100},
    )

    class CoreLike:
        def get_components(self):
            return components

    wrapped = as_h3_video(CoreLike())
    assert torch.equal(wrapped.frames, frames) and wrapped.frame_rate == Fraction(30000, 1001)
    assert tuple(wrapped.audio.shape) == (2, 1000) and wrapped.sample_rate == 44100
    assert as_h3_video(wrapped) is wrapped
    got_frames, rate, audio, sample_rate = video_to_frames_audio(CoreLike())
    assert torch.equal(got_frames, frames) and sample_rate == 44100
    with pytest.raises(TypeError, match="VIDEO"):
        as_h3_video(object())


def test_as_fraction():
    assert as_fraction(24) == 24 and as_fraction(24.0) == 24
    assert as_fraction(24000 / 1001) == Fraction(24000, 1001) and as_fraction("30000/1001") == Fraction(30000, 1001)
    with pytest.raises(ValueError):
        as_fraction(0)


@pytest.mark.parametrize("thread_type", ["slice", "frame"])
def test_thread_type_reaches_the_encoder_and_the_video_round_trips(tmp_path, thread_type, monkeypatch):
    seen = []
    real = av.container.OutputContainer.add_stream

    def add_stream(self, *args, **kwargs):  # record the context the writer configured, after it is configured
        stream = real(self, *args, **kwargs)
        seen.append(stream)
        return stream

    monkeypatch.setattr(av.container.OutputContainer, "add_stream", add_stream)
    frames = torch.randint(0, 255, (6, 32, 48, 3), dtype=torch.uint8)
    path = tmp_path / f"{thread_type}.mp4"
    with Mp4Writer(path, 48, 32, 24, crf=0, thread_type=thread_type, threads=2) as writer:
        writer.write_frames(frames)
    assert seen[0].codec_context.thread_type.name == thread_type.upper()
    assert decode_video(path).frames.shape == frames.shape
    with pytest.raises(ValueError, match="thread_type"):
        Mp4Writer(tmp_path / "bad.mp4", 48, 32, 24, thread_type="auto")
    assert not (tmp_path / "bad.mp4").exists()
