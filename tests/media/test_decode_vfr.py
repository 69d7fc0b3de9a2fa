"""Variable-frame-rate MP4 with B-frames (backend/media/decode.py): the last frame ends at the stream's end, not after
its packet's duration, which in an MP4 with B-frames is a decode-order gap (a file with a 2-s pause near its end came
out 2 s longer than its audio). Files are made with PyAV: h264 with a fixed 3-B-frame pattern, irregular timestamps."""

from fractions import Fraction

import av
import numpy as np
import pytest

from comfyui_h3.backend.media.decode import _last_frame_end, decode_video, plan_frames

RATE = 32000


def _write_vfr(path, pts_ms: list[int], audio_seconds: float) -> None:
    """Frame i (a flat grey of level 4 * i) shown from pts_ms[i]; AAC stereo of `audio_seconds`."""
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=24)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        video.time_base = video.codec_context.time_base = Fraction(1, 1000)
        video.options = {"x264-params": "bframes=3:b-adapt=0:keyint=12:min-keyint=12:scenecut=0", "threads": "1"}
        audio = out.add_stream("aac", rate=RATE)
        audio.layout = "stereo"
        for i, pts in enumerate(pts_ms):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 4 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, 1000)
            for packet in video.encode(frame):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        samples = int(audio_seconds * RATE)
        wave = (0.2 * np.sin(2 * np.pi * 440 * np.arange(samples) / RATE)).astype(np.float32)
        for start in range(0, samples, 1024):
            frame = av.AudioFrame.from_ndarray(np.stack([wave[start:start + 1024]] * 2), format="fltp",
                                               layout="stereo")
            frame.sample_rate, frame.pts = RATE, start
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode():
            out.mux(packet)


def _timestamps(count: int, pause_at: int, seed: int = 0) -> list[int]:
    """Irregular 25..59 ms steps, with a 2-s pause before frame `pause_at`."""
    steps = np.random.default_rng(seed).integers(25, 60, size=count)
    steps[pause_at - 1] = 2000
    return np.concatenate([[0], np.cumsum(steps)])[:count].tolist()


def _last_shown_packet_duration(path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.duration) for p in container.demux(stream) if p.size]
        time_base = stream.time_base  # PyAV 18 refuses stream attributes once the container is closed
    pts, duration = max(packets)
    return float(duration * time_base)


# A pause 3 or 4 frames before the end lands, in decode order, right after the last-shown frame: its packet
# "duration" becomes the 2-s pause. Other positions are here too: they must not change.
CASES = [(59, 56), (60, 56), (59, 55), (60, 57), (61, 58), (60, 59)]


def test_the_files_have_the_decode_order_gap():
    """The fixture really has the hazard (so the tests below can fail): some last-shown frame's packet lasts 2 s."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        seen = []
        for count, pause_at in CASES:
            path = f"{folder}/v.mp4"
            pts = _timestamps(count, pause_at)
            _write_vfr(path, pts, (pts[-1] + 40) / 1000)
            seen.append(_last_shown_packet_duration(path))
    assert max(seen) > 1.5, seen


@pytest.mark.parametrize("count,pause_at", CASES)
def test_vfr_bframes_video_ends_with_its_audio(tmp_path, count, pause_at):
    path = tmp_path / "vfr.mp4"
    pts = _timestamps(count, pause_at)
    end = (pts[-1] + 40) / 1000  # the last frame shows ~one typical interval
    _write_vfr(path, pts, end)
    clip = decode_video(str(path), force_rate=24, audio_sample_rate=RATE)
    video_seconds = clip.frames.shape[0] / float(clip.frame_rate)
    audio_seconds = clip.audio.shape[1] / clip.sample_rate
    assert abs(video_seconds - audio_seconds) < 0.1, (video_seconds, audio_seconds)
    assert abs(video_seconds - end) < 0.1, (video_seconds, end)
    # the pause holds the frame before it; every frame lands at its timestamp
    for index, ms in enumerate(pts):
        slot = int(np.floor(ms / 1000 * 24 + 0.5))
        if index + 1 < len(pts) and int(np.floor(pts[index + 1] / 1000 * 24 + 0.5)) == slot:
            continue  # shares its slot with the next frame, which wins
        assert abs(int(clip.frames[slot, 0, 0, 0]) - 4 * index) <= 3, (index, slot)
    # at the file's own rate too
    plan = plan_frames(str(path))
    assert abs(plan.frame_count / float(plan.frame_rate) - end) < 0.1


def test_last_frame_end_rules():
    # declared stream end after the frame: used (a long last frame in a screen recording stays long)
    assert _last_frame_end(1000, 30, True, 5000, None, 40) == 5000
    # ... the container's agreeing end too (the earlier of the two)
    assert _last_frame_end(1000, 30, True, 5000, 5020, 40) == 5000
    # ends that disagree: never more than one frame past the last timestamp (the shortest of the median interval,
    # the step into the last frame and, without B-frames, its packet duration)
    assert _last_frame_end(1000, 30, False, 9000, 1500, 40) == 1030
    assert _last_frame_end(1000, 30, True, 9000, 1500, 40) == 1040
    assert _last_frame_end(1000, None, False, 2000, 1042, 1000, last_step=42) == 1042
    assert _last_frame_end(1000, None, False, 2000, 9_000_000, 1000, last_step=42) == 1042
    # declared end missing or before the frame (an MP4 whose sample durations follow lagging dts): packet duration
    # without B-frames, the median interval with them
    assert _last_frame_end(1000, 3000, False, 900, None, 40) == 4000
    assert _last_frame_end(1000, 3000, True, 900, None, 40) == 1040
    assert _last_frame_end(1000, None, False, None, None, 40) == 1040


def _write_gappy_ts(path, pts_ms: list[int], audio_seconds: float, audio_codec: str) -> None:
    """MPEG-TS (no packet durations) with frames mostly 1 s apart: its demuxer estimates the stream's duration from
    that low average rate (a screen recording that only writes frames when something changes)."""
    with av.open(str(path), "w", format="mpegts") as out:
        video = out.add_stream("libx264", rate=24)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        video.time_base = video.codec_context.time_base = Fraction(1, 1000)
        video.options = {"x264-params": "bframes=0:keyint=12", "threads": "1"}
        audio = out.add_stream(audio_codec, rate=RATE if audio_codec == "aac" else 48000)
        audio.layout = "stereo"
        for i, pts in enumerate(pts_ms):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), (8 * i) % 256, np.uint8), format="rgb24")
            frame.pts, frame.time_base = 1000 + pts, Fraction(1, 1000)  # 1 s in: the audio's priming stays >= 0
            for packet in video.encode(frame):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        rate = audio.codec_context.sample_rate
        samples, size = int(audio_seconds * rate), audio.codec_context.frame_size or 1152
        fmt = audio.codec_context.format.name
        for start in range(0, samples, size):
            block = np.zeros((1, 2 * size), np.int16) if fmt == "s16" else np.zeros((2, size), np.float32)
            frame = av.AudioFrame.from_ndarray(block, format=fmt, layout="stereo")
            frame.sample_rate, frame.pts = rate, rate + start
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode():
            out.mux(packet)


@pytest.mark.parametrize("audio_codec", ["aac", "mp2"])
def test_gappy_file_ends_one_frame_after_its_last_timestamp(tmp_path, audio_codec):
    """Frames 1 s apart for 16 s, then 24 fps up to a last frame at 16.375 s, audio to 16.417 s: the demuxer's
    estimated stream end (17.375 s) disagrees with the container's, and used to add a second (417 frames)."""
    path = tmp_path / "gaps.ts"
    pts = list(range(0, 16000, 1000)) + [16042, 16083, 16125, 16167, 16208, 16250, 16292, 16333, 16375]
    _write_gappy_ts(path, pts, 16.417, audio_codec)
    with av.open(str(path)) as container:  # the hazard is really there
        stream = container.streams.video[0]
        assert float(stream.duration * stream.time_base) > 17.3
    plan = plan_frames(str(path), force_rate=24)
    assert plan.frame_count == 394, plan.frame_count  # 16.375 s + one 42-ms frame = 16.417 s at 24 fps
    assert abs(plan.duration - 16.417) < 0.05
