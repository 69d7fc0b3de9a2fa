"""H3 Load Video: decoding real files the tests write (VFR, rotated, odd size, no audio, 5.1 / 48 kHz, mono, 10-bit,
one frame, long + capped, corrupt), 24-fps resampling in sync, resize, the lazy VIDEO and the two nodes. CPU, tiny."""

from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from comfyui_h3.backend.media import decode as decode_module
from comfyui_h3.backend.media.decode import decode_video
from comfyui_h3.backend.media.encode import Mp4Writer
from comfyui_h3.backend.media.resize import apply_resize, h3_canvas_size, plan_resize, resize_frames
from comfyui_h3.video_file import H3FileVideo
from comfyui_h3.video_types import LocalVideoComponents, as_h3_video

W, H = 64, 48
STEP = 5  # source frame i is a flat grey frame of level 16 + STEP * i: its level identifies it after decoding


def _grey(i: int, w: int = W, h: int = H) -> np.ndarray:
    return np.full((h, w, 3), 16 + STEP * i, np.uint8)


def _ids(frames: torch.Tensor) -> list[int]:
    return [int(round((float(m) - 16) / STEP)) for m in frames.float().mean(dim=(1, 2, 3))]


def _burst(total: int, rate: int, at_s: list[float], channels: int = 2) -> np.ndarray:
    """Silence with a 10-ms 1 kHz burst (amplitude 0.8) starting at each time in `at_s`."""
    wave = np.zeros((channels, total), np.float32)
    n = int(0.01 * rate)
    tone = 0.8 * np.sin(2 * np.pi * 1000 * np.arange(n) / rate).astype(np.float32)
    for t in at_s:
        i = int(round(t * rate))
        wave[:, i : i + n] = tone[: max(0, min(n, total - i))]
    return wave


def _onsets(audio: torch.Tensor, rate: int, threshold: float = 0.3, gap_s: float = 0.1) -> list[float]:
    loud = np.flatnonzero(np.abs(audio.numpy()).max(axis=0) > threshold)
    out: list[float] = []
    for i in loud:
        if not out or i / rate - out[-1] > gap_s:
            out.append(i / rate)
    return out


def write_file(path, images, *, fps=24, pts_ms=None, audio=None, sample_rate=32000, layout="stereo",
               audio_codec=None, pix_fmt="yuv420p", rotation=None, codec="libx264"):
    """Write `images` (uint8 HxWx3) with PyAV. pts_ms: per-frame presentation times in ms (a VFR file)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = images[0].shape[1], images[0].shape[0]
        stream.pix_fmt = pix_fmt
        if codec == "libx264":
            stream.options = {"qp": "0", "preset": "ultrafast"}
        if pts_ms is not None:
            stream.time_base = Fraction(1, 1000)
            stream.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        astream = None
        if audio is not None:
            astream = container.add_stream(audio_codec or "aac", rate=sample_rate, layout=layout)
        for i, image in enumerate(images):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format=pix_fmt)
            if pts_ms is not None:
                frame.pts, frame.time_base = pts_ms[i], Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
        if astream is not None:
            fmt = astream.codec_context.format.name
            size = 1024
            for start in range(0, audio.shape[1], size):
                chunk = np.ascontiguousarray(audio[:, start : start + size])
                if fmt == "s16":
                    chunk = (np.clip(chunk, -1, 1) * 32767).astype(np.int16).T.reshape(1, -1)
                frame = av.AudioFrame.from_ndarray(chunk, format=fmt, layout=layout)
                frame.sample_rate, frame.pts, frame.time_base = sample_rate, start, Fraction(1, sample_rate)
                container.mux(astream.encode(frame))
            container.mux(astream.encode(None))
    return str(path)


# -- round trips and 24-fps resampling --------------------------------------------------------------------------------
@pytest.mark.parametrize("fps", [24, 30])
def test_round_trip_keeps_count_size_fps_duration(tmp_path, fps):
    path = str(tmp_path / "clip.mp4")
    count = 36
    with Mp4Writer(path, W, H, fps, audio_sample_rate=32000, preset="ultrafast") as writer:
        writer.write_frames(torch.from_numpy(np.stack([_grey(i) for i in range(count)])))
        writer.write_audio(torch.zeros(2, 32000 * count // fps))
    video = H3FileVideo(path)  # force_rate 0: the file's own rate
    assert not video.decoded  # planned from packet timestamps only
    assert video.get_frame_count() == count and video.get_dimensions() == (W, H)
    assert video.get_frame_rate() == fps and video.get_duration() == pytest.approx(count / fps)
    assert video.source_path == os.path.abspath(path) and video.get_stream_source() == os.path.abspath(path)
    assert _ids(video.frames) == list(range(count)) and video.decoded
    assert abs(video.audio.shape[1] - 32000 * count / fps) <= 1 and video.sample_rate == 32000
    # core-style save (VideoInput.save_to) -> decode again: same count, size, fps, duration
    again = str(tmp_path / "again.mp4")
    video.save_to(again)
    back = H3FileVideo(again)
    assert (back.get_frame_count(), back.get_dimensions(), back.get_frame_rate()) == (count, (W, H), fps)
    assert back.get_duration() == pytest.approx(count / fps) and _ids(back.frames) == list(range(count))


def test_resampling_30_to_24_keeps_audio_in_sync(tmp_path):
    # 45 frames at 30 fps; frames 5, 20 and 33 each have a burst in the audio at their own start time
    flashes = [5, 20, 33]
    audio = _burst(int(1.5 * 32000), 32000, [i / 30 for i in flashes])
    path = str(tmp_path / "30fps.mp4")
    with Mp4Writer(path, W, H, 30, audio_sample_rate=32000, preset="ultrafast") as writer:
        writer.write_frames(torch.from_numpy(np.stack([_grey(i) for i in range(45)])))
        writer.write_audio(torch.from_numpy(audio))
    for skip in (0, 7):
        video = H3FileVideo(path, force_rate=24, skip_first_frames=skip)
        assert video.get_frame_rate() == 24 and video.get_frame_count() == 36 - skip
        ids = _ids(video.frames)
        assert ids == sorted(ids) and video.audio.shape[1] == pytest.approx((36 - skip) / 24 * 32000, abs=1)
        offset = skip / 24  # stream time of output frame 0
        expected = [f / 30 - offset for f in flashes if f / 30 >= offset]
        onsets = _onsets(video.audio, 32000)
        assert len(onsets) == len(expected) == 3 - (skip > 5)
        assert all(abs(a - b) <= 1 / 24 for a, b in zip(onsets, expected)), (onsets, expected)
        seen = [f for f in flashes if f in ids]  # a 30 -> 24 resample drops every fifth frame
        assert len(seen) == 3 - (skip > 5)
        for flash in seen:
            shown = ids.index(flash) / 24  # when the output shows the flash frame
            assert abs(shown - (flash / 30 - offset)) <= 1 / 24, (skip, flash, shown)


def test_vfr_comes_out_constant_rate_and_in_sync(tmp_path):
    # 16 frames with 20 / 60 / 100 ms gaps (about 17 fps on average), PCM audio bursts at frames 3, 9 and 14
    gaps = [20, 60, 100, 40] * 4
    pts = [sum(gaps[:i]) for i in range(16)]
    end_ms = pts[-1] + 40
    flashes = [3, 9, 14]
    audio = _burst(int(end_ms / 1000 * 48000), 48000, [pts[i] / 1000 for i in flashes])
    path = write_file(tmp_path / "vfr.mkv", [_grey(i) for i in range(16)], pts_ms=pts, audio=audio,
                      sample_rate=48000, audio_codec="pcm_s16le")
    video = H3FileVideo(path, force_rate=24)
    assert video.get_frame_rate() == 24
    assert abs(video.get_frame_count() - end_ms / 1000 * 24) <= 1
    ids = _ids(video.frames)
    for k, shown in enumerate(ids):  # output frame k (at k/24 s) shows the source frame on screen then
        t_ms = k / 24 * 1000
        live = max(i for i in range(16) if pts[i] <= t_ms + 1000 / 48)  # within half an output frame
        assert shown in (live, live - 1) or abs(pts[shown] - t_ms) <= 1000 / 48, (k, shown, live)
    onsets = _onsets(video.audio, 48000)
    assert len(onsets) == 3
    for flash, onset in zip(flashes, onsets):
        assert abs(ids.index(flash) / 24 - onset) <= 1 / 24
    # without force_rate a VFR file is put on its average-rate grid: constant rate, same duration
    plain = H3FileVideo(path)
    assert plain.get_duration() == pytest.approx(end_ms / 1000, abs=1.5 / float(plain.get_frame_rate()))


# -- what real files are -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("degrees", [90, -90, 180])
def test_rotation_metadata_is_applied(tmp_path, degrees):
    image = np.zeros((H, W, 3), np.uint8)
    image[:16, :16] = 255  # a white corner block, top left
    path = write_file(tmp_path / "rot.mp4", [image] * 3, rotation=degrees)
    video = H3FileVideo(path, force_rate=0)
    expected = np.rot90(image, int(round(degrees / 90)) % 4)
    assert video.get_dimensions() == (expected.shape[1], expected.shape[0])
    frame = video.frames[0].numpy().astype(int)
    assert np.abs(frame - expected).mean() < 4
    raw = decode_video(path, apply_rotation=False).frames[0].numpy().astype(int)
    assert raw.shape == image.shape and np.abs(raw - image).mean() < 4


def test_odd_size_and_resize_modes(tmp_path):
    path = write_file(tmp_path / "odd.mp4", [_grey(i, 63, 47) for i in range(4)], pix_fmt="yuv444p")
    assert H3FileVideo(path).get_dimensions() == (63, 47)
    assert _ids(H3FileVideo(path, force_rate=0).frames) == [0, 1, 2, 3]
    m32 = H3FileVideo(path, resize="multiple of 32", fit="crop")
    assert m32.get_dimensions() == (64, 32) and tuple(m32.frames.shape) == (m32.get_frame_count(), 32, 64, 3)
    canvas = H3FileVideo(path, resize="H3 canvas", fit="pad", frame_load_cap=1)
    cw, ch = canvas.get_dimensions()
    assert (cw, ch) == h3_canvas_size(63, 47) and cw % 32 == 0 and ch % 32 == 0
    assert tuple(canvas.frames.shape) == (1, ch, cw, 3)
    target = H3FileVideo(path, resize="target size", fit="pad", width=128, height=32, frame_load_cap=1)
    frame = target.frames[0]
    assert tuple(frame.shape) == (32, 128, 3)
    assert int(frame[:, :10].max()) == 0 and int(frame[:, 60].min()) > 0  # black bars left and right


def test_resize_plan_arithmetic():
    assert plan_resize(64, 48, "none") is None
    assert plan_resize(64, 64, "multiple of 32") is None
    crop = plan_resize(1920, 1080, "target size", "crop", 768, 768)
    assert (crop.scaled_w, crop.scaled_h, crop.out_w, crop.out_h) == (1365, 768, 768, 768)
    pad = plan_resize(1920, 1080, "target size", "pad", 768, 768)
    assert (pad.scaled_w, pad.scaled_h) == (768, 432)
    w, h = h3_canvas_size(1920, 1080)
    assert w % 32 == 0 and h % 32 == 0 and abs(w / h - 16 / 9) < 0.05
    w, h = h3_canvas_size(1000, 100)  # 10:1 clamps to 4:1, the fit crops the rest
    assert w / h == pytest.approx(4, rel=0.05)
    with pytest.raises(ValueError, match="resize must be one of"):
        plan_resize(64, 48, "stretch")
    image = np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)
    out = apply_resize(image, plan_resize(64, 48, "target size", "crop", 32, 48))
    assert out.shape == (48, 32, 3) and np.array_equal(out, image[:, 16:48])  # no scaling: a pure centre crop
    frames = resize_frames(torch.from_numpy(np.stack([image] * 2)), plan_resize(64, 48, "target size", "pad", 64, 64))
    assert tuple(frames.shape) == (2, 64, 64, 3) and int(frames[:, :8].max()) == 0


def test_no_audio_mono_and_51_at_48k(tmp_path):
    silent = H3FileVideo(write_file(tmp_path / "silent.mp4", [_grey(i) for i in range(5)]))
    assert silent.audio is None and silent.sample_rate is None and silent.audio_dict() is None
    assert silent.get_frame_count() == 5

    mono = _burst(48000 // 2, 48000, [0.1], channels=1)
    video = H3FileVideo(write_file(tmp_path / "mono.mp4", [_grey(i) for i in range(12)], audio=mono,
                                   sample_rate=48000, layout="mono"))
    assert video.audio.shape[0] == 1 and video.sample_rate == 48000

    surround = np.zeros((6, 48000 // 2), np.float32)
    surround[2] = 0.5 * np.sin(2 * np.pi * 440 * np.arange(48000 // 2) / 48000)  # centre channel only (FL FR FC ...)
    path = write_file(tmp_path / "surround.mp4", [_grey(i) for i in range(12)], audio=surround, sample_rate=48000,
                      layout="5.1")
    kept = H3FileVideo(path)
    assert kept.audio.shape[0] == 2 and kept.sample_rate == 48000
    left, right = kept.audio[0, 2000:20000], kept.audio[1, 2000:20000]
    assert float(left.abs().max()) > 0.2 and torch.allclose(left, right, atol=1e-3)  # centre -> both sides
    assert kept.audio.shape[1] == pytest.approx(0.5 * 48000, abs=1)
    resampled = H3FileVideo(path, audio_sample_rate=32000)
    assert resampled.sample_rate == 32000 and resampled.audio.shape == (2, 16000)
    assert resampled.source_path is None  # its audio differs from the file's


def test_ten_bit_source_reads_as_8_bit_rgb(tmp_path):
    path = write_file(tmp_path / "ten.mp4", [_grey(i) for i in range(6)], pix_fmt="yuv420p10le")
    with av.open(path) as container:
        assert container.streams.video[0].codec_context.pix_fmt == "yuv420p10le"
    video = H3FileVideo(path)
    assert video.frames.dtype == torch.uint8 and _ids(video.frames) == list(range(6))


def test_one_frame_file(tmp_path):
    for fps in (24, 30):
        path = write_file(tmp_path / f"one{fps}.mp4", [_grey(3)], fps=fps)
        video = H3FileVideo(path, force_rate=24)
        assert video.get_frame_count() == 1 and _ids(video.frames) == [3]


class _CountingContainer:
    """Wraps a PyAV input container and counts the packets demuxed from it."""

    def __init__(self, container, counter):
        self._container, self._counter = container, counter

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._container.close()

    def demux(self, *args, **kwargs):
        for packet in self._container.demux(*args, **kwargs):
            self._counter.append(1)
            yield packet

    def __getattr__(self, name):
        return getattr(self._container, name)


def test_long_file_capped_reads_only_what_it_needs(tmp_path, monkeypatch):
    count = 480  # 20 s at 24 fps, 16x16
    path = str(tmp_path / "long.mp4")
    with Mp4Writer(path, 16, 16, 24, audio_sample_rate=32000, preset="ultrafast") as writer:
        for start in range(0, count, 96):
            writer.write_frames(torch.zeros(96, 16, 16, 3, dtype=torch.uint8))
        writer.write_audio(torch.zeros(2, 32000 * count // 24))
    demuxed: list[int] = []
    real_open = decode_module._open
    monkeypatch.setattr(decode_module, "_open", lambda source: _CountingContainer(real_open(source), demuxed))
    video = H3FileVideo(path, max_seconds=1.0)
    assert video.get_frame_count() == 24 and video.get_duration() == pytest.approx(1.0)
    assert len(demuxed) < 4 * 24  # the pts pass stopped about 2 s in, not at 20 s
    assert tuple(video.frames.shape) == (24, 16, 16, 3) and video.audio.shape == (2, 32000)
    capped = H3FileVideo(path, frame_load_cap=10, select_every_nth=2)
    assert capped.get_frame_count() == 10 and capped.get_frame_rate() == 12


def test_corrupt_and_non_video_files_give_clear_errors(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"definitely not a video " * 200)
    with pytest.raises(ValueError, match="cannot read"):
        H3FileVideo(junk)
    good = write_file(tmp_path / "good.mp4", [_grey(i) for i in range(8)])
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(open(good, "rb").read()[:200])
    with pytest.raises(ValueError, match="truncated.mp4"):
        H3FileVideo(truncated)
    with pytest.raises(FileNotFoundError):
        H3FileVideo(tmp_path / "missing.mp4")
    with pytest.raises(ValueError, match="no frames left"):
        H3FileVideo(good, force_rate=0, skip_first_frames=8)


# -- nodes -------------------------------------------------------------------------------------------------------------
def test_load_video_node_outputs_fingerprint_and_safety(tmp_path, monkeypatch):
    from comfyui_h3.comfy_services import UnsafePathError
    from comfyui_h3.nodes.load_video import H3LoadVideo, H3VideoComponents

    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path / "in"))
    os.makedirs(tmp_path / "in" / "clips")
    audio = _burst(32000, 32000, [0.5])
    write_file(tmp_path / "in" / "a.mp4", [_grey(i) for i in range(30)], fps=30, audio=audio)
    (tmp_path / "in" / "notes.txt").write_text("x")
    spec = H3LoadVideo.INPUT_TYPES()["required"]["video"]
    assert spec[0] == ["a.mp4"] and spec[1]["video_upload"] is True

    video, audio_out, fps, frames, width, height, duration = H3LoadVideo().load("a.mp4")  # defaults: 24 fps
    assert isinstance(video, H3FileVideo) and not video.decoded
    assert (fps, frames, width, height) == (24.0, 24, W, H) and duration == pytest.approx(1.0)
    assert audio_out["sample_rate"] == 32000 and tuple(audio_out["waveform"].shape) == (1, 2, 32000)

    images, audio2, fps2 = H3VideoComponents().split(video)
    assert images.dtype == torch.float32 and tuple(images.shape) == (24, H, W, 3) and fps2 == 24.0
    assert audio2["waveform"].shape == audio_out["waveform"].shape
    # a core-style VIDEO (anything with get_components) is accepted too
    core_like = type("CoreVideo", (), {"get_components": lambda self: LocalVideoComponents(
        images=images[:3], frame_rate=Fraction(24), audio=None)})()
    images3, none_audio, fps3 = H3VideoComponents().split(core_like)
    assert tuple(images3.shape) == (3, H, W, 3) and none_audio is None and fps3 == 24.0
    assert as_h3_video(video) is video

    # path inside the input folder; options; outside paths refused
    write_file(tmp_path / "in" / "clips" / "b.mp4", [_grey(i) for i in range(6)])
    out = H3LoadVideo().load("a.mp4", 0.0, 0, 0, 1, 0.0, "none", "crop", 1344, 768, "keep", path="clips/b.mp4")
    assert out[3] == 6 and out[1] is None
    assert H3LoadVideo.VALIDATE_INPUTS(video="a.mp4") is True
    assert H3LoadVideo.VALIDATE_INPUTS(video="clips/b.mp4") is True  # any file in the input folder
    assert H3LoadVideo.VALIDATE_INPUTS(video="../../etc/passwd") is not True
    assert H3LoadVideo.VALIDATE_INPUTS(video="missing.mp4") is not True
    with pytest.raises((UnsafePathError, ValueError)):  # a path is checked when the node runs
        H3LoadVideo().load("a.mp4", path="../../etc/passwd")
    with pytest.raises((UnsafePathError, ValueError)):
        H3LoadVideo().load("../../etc/passwd")

    # re-run only when the file changes
    first = H3LoadVideo.IS_CHANGED(video="a.mp4", force_rate=24.0)
    assert H3LoadVideo.IS_CHANGED(video="a.mp4", force_rate=12.0) == first
    write_file(tmp_path / "in" / "a.mp4", [_grey(i + 1) for i in range(30)], fps=30)
    assert H3LoadVideo.IS_CHANGED(video="a.mp4") != first


def test_chunked_decode_equals_the_whole_decode(tmp_path):
    """iter_planned_frames (Save Video streaming a file-backed VIDEO) gives the frames decode_planned_frames does,
    with held frames (30 -> 24 fps) and a chunk size that does not divide the count."""
    path = write_file(tmp_path / "c.mp4", [_grey(i) for i in range(37)], fps=30)
    plan = decode_module.plan_frames(str(path), force_rate=24, skip_first_frames=2)
    whole = decode_module.decode_planned_frames(str(path), plan)
    chunks = list(decode_module.iter_planned_frames(str(path), plan, chunk_frames=8))
    assert [c.shape[0] for c in chunks[:-1]] == [8] * (len(chunks) - 1)
    assert torch.equal(torch.cat(chunks), whole) and whole.shape[0] == plan.frame_count
    assert len({c.data_ptr() for c in chunks}) == len(chunks)  # fresh tensors: a caller may keep them
