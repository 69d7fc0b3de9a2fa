"""The save path: StreamingVideoSaver (chunked, double-buffered, background encoder), codec choices, the Save Video
node's IMAGE + fps input, and the H3 VAE's clip-by-clip decode (equal to the one-shot decode, bit for bit)."""

import os

import av
import numpy as np
import pytest
import torch

from comfyui_h3.backend.media.encode import CODECS, Mp4Writer, available_codecs
from comfyui_h3.backend.media.frames import video_to_uint8
from comfyui_h3.backend.media.stream_writer import HostFrameCollector, StreamingVideoSaver

W, H, FPS, T = 64, 48, 24, 37


def _video(seed=0, frames=T):
    gen = torch.Generator().manual_seed(seed)
    base = torch.linspace(0, 1, W).view(1, 1, W, 1).expand(frames, H, W, 3)
    return (base * 0.8 + 0.1 + torch.rand((frames, H, W, 3), generator=gen) * 0.05).contiguous()


def _decode(path):
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _plain(path, frames, **kwargs):
    with Mp4Writer(path, W, H, FPS, **kwargs) as writer:
        writer.write_frames(frames)


@pytest.mark.parametrize("layout", ["thwc", "bcthw", "uint8"])
def test_streaming_saver_hands_the_encoder_the_exact_frames(tmp_path, layout, monkeypatch):
    """What the saver controls is the uint8 frames it hands the encoder, in order: compare those, not the encoded
    bytes (libx264 is not deterministic run to run on a loaded machine, even with one thread)."""
    video = _video()
    frames = video_to_uint8(video)
    handed = []
    original = Mp4Writer.write_frames

    def record(self, batch):
        handed.append(np.array(batch, copy=True))
        return original(self, batch)

    monkeypatch.setattr(Mp4Writer, "write_frames", record)
    source = {"thwc": video, "bcthw": video.permute(3, 0, 1, 2)[None], "uint8": frames}[layout]
    with StreamingVideoSaver(tmp_path / "stream.mp4", W, H, FPS, chunk_frames=5) as saver:
        saver.write(source[:, :, :11] if layout == "bcthw" else source[:11])  # uneven pieces, several calls
        saver.write(source[:, :, 11:] if layout == "bcthw" else source[11:])
    assert saver.stats["frames"] == T and saver.frames_written == T
    assert all(len(chunk) <= 5 for chunk in handed)
    assert np.array_equal(np.concatenate(handed), frames.numpy())
    assert len(_decode(tmp_path / "stream.mp4")) == T


@pytest.mark.parametrize("layout", ["thwc", "uint8"])
def test_streaming_saver_equals_plain_writer_lossless(tmp_path, layout):
    """With a lossless codec the whole path (chunks, pinned slots, encoder thread) decodes to the exact frames the
    plain writer's file decodes to, and both to the source."""
    if "ffv1" not in available_codecs():
        pytest.skip("this PyAV build has no ffv1 encoder (the exact-frames test above covers the chunking)")
    video = _video()
    frames = video_to_uint8(video)
    _plain(tmp_path / "plain.mkv", frames, codec="ffv1")
    source = {"thwc": video, "uint8": frames}[layout]
    with StreamingVideoSaver(tmp_path / "stream.mkv", W, H, FPS, chunk_frames=5, codec="ffv1") as saver:
        saver.write(source[:11])
        saver.write(source[11:])
    streamed = _decode(tmp_path / "stream.mkv")
    assert np.array_equal(streamed, _decode(tmp_path / "plain.mkv"))
    assert np.array_equal(streamed, frames.numpy())


def test_host_buffers_are_chunk_sized_not_clip_sized(tmp_path):
    chunk = 4
    with StreamingVideoSaver(tmp_path / "a.mp4", W, H, FPS, chunk_frames=chunk, slots=2) as saver:
        saver.write(_video(frames=120))
        assert len(saver._slots) == 2 and all(s.shape == (chunk, H, W, 3) for s in saver._slots)
    assert saver.stats["host_buffer_bytes"] == 2 * chunk * H * W * 3
    assert saver.stats["d2h_bytes"] == 0  # CPU frames: nothing crossed a device boundary


def test_queue_depth_is_bounded(tmp_path, monkeypatch):
    """The caller never runs more than `slots` chunks ahead of the encoder."""
    import threading

    gate, seen, ahead = threading.Event(), [], []
    saver = StreamingVideoSaver(tmp_path / "a.mp4", W, H, FPS, chunk_frames=2, slots=2)
    original = saver._consume_frames

    def slow(frames):
        gate.wait(5)
        seen.append(frames.shape[0])
        original(frames)

    saver._consume_frames = slow
    orig_put = saver._put

    def put(chunk):
        ahead.append(saver.stats["frames"] // 2 - len(seen))
        return orig_put(chunk)

    saver._put = put
    timer = threading.Timer(0.3, gate.set)
    timer.start()
    saver.write(_video(frames=12))
    saver.close()
    assert max(ahead) <= 2 and sum(seen) == 12


def test_encoder_error_surfaces_and_leaves_no_file(tmp_path):
    saver = StreamingVideoSaver(tmp_path / "bad.mp4", W, H, FPS, chunk_frames=4)

    def boom(frames):
        raise OSError("disk full (simulated)")

    saver._consume_frames = boom
    with pytest.raises(RuntimeError, match="disk full") as info:
        saver.write(_video(frames=40))  # blocks on a slot at most 0.1 s before noticing
        saver.close()
    assert isinstance(info.value.__cause__, OSError)
    assert os.listdir(tmp_path) == []  # neither the final name nor the temporary file


def test_abort_removes_temporary_file(tmp_path):
    with pytest.raises(KeyError):
        with StreamingVideoSaver(tmp_path / "x.mp4", W, H, FPS) as saver:
            saver.write(_video(frames=8))
            raise KeyError("stop")
    assert os.listdir(tmp_path) == []


def test_streaming_saver_refuses_to_overwrite(tmp_path):
    (tmp_path / "taken.mp4").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        StreamingVideoSaver(tmp_path / "taken.mp4", W, H, FPS)
    assert (tmp_path / "taken.mp4").read_bytes() == b"mine"


def test_streaming_saver_writes_audio(tmp_path):
    wave = torch.sin(torch.linspace(0, 800, 32000 * 2)).repeat(2, 1) * 0.3
    with StreamingVideoSaver(tmp_path / "a.mp4", W, H, FPS, audio_sample_rate=32000) as saver:
        saver.write(_video(frames=48))
        saver.write_audio(wave, 32000)
    with av.open(str(tmp_path / "a.mp4")) as container:
        assert container.streams.audio[0].rate == 32000 and container.streams.audio[0].channels == 2


def test_host_frame_collector_assembles_the_clip():
    video = _video()
    collector = HostFrameCollector(W, H, total_frames=20, chunk_frames=6)  # fewer than written: the result grows
    collector.write(video[:13])
    collector.write(video[13:])
    assert torch.equal(collector.close(), video_to_uint8(video))


def test_codec_choices_in_this_build(tmp_path):
    names = available_codecs()
    assert names[0] == "h264" and set(names) <= set(CODECS)
    frames = video_to_uint8(_video(frames=6))
    for name in names:
        path = tmp_path / f"clip_{name}{CODECS[name].ext}"
        with StreamingVideoSaver(path, W, H, FPS, codec=name) as saver:
            saver.write(frames)
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == {"h264": "h264", "h265": "hevc", "prores": "prores",
                                                 "ffv1": "ffv1"}[name]
            decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(decoded) == 6
        if name == "ffv1":  # lossless RGB: bit exact
            assert np.array_equal(np.stack(decoded), frames.numpy())


def test_save_node_images_and_fps(tmp_path, monkeypatch):
    from comfyui_h3.nodes.save_video import H3SaveVideo

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path))
    images = _video(frames=30)
    audio = {"waveform": torch.zeros(1, 1, 16000), "sample_rate": 16000}
    ui = H3SaveVideo().save(filename_prefix="imgs/x", crf=18, preset="ultrafast", images=images, fps=12.0,
                            audio=audio, prompt={"1": {"class_type": "X"}})["ui"]
    entry = ui["images"][0]
    path = tmp_path / entry["subfolder"] / entry["filename"]
    with av.open(str(path)) as container:
        assert container.streams.video[0].average_rate == 12
        assert sum(1 for _ in container.decode(video=0)) == 30
        assert "prompt" in container.metadata
    # An RGBA / grey IMAGE saves too; nothing connected is a clear error.
    H3SaveVideo().save(filename_prefix="imgs/x", images=torch.rand(3, H, W, 4))
    with pytest.raises(ValueError, match="video or images"):
        H3SaveVideo().save(filename_prefix="imgs/x")


def test_save_node_codec_widget_is_appended_after_the_old_widgets():
    from comfyui_h3.nodes.save_video import H3SaveVideo

    spec = H3SaveVideo.INPUT_TYPES()
    assert list(spec["required"]) == ["filename_prefix", "crf", "preset"]
    assert list(spec["optional"]) == ["video", "audio", "images", "fps", "codec"]
    assert spec["optional"]["codec"][0] == available_codecs()


def test_h3_vae_decodes_clip_by_clip_like_the_whole_decode(tiny_h3_dir):
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.decode import decode_video, iter_decode_video

    vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").eval()
    for latent_frames in (7, 9, 12):  # whole clips, and a padded tail
        z = torch.randn(1, vae.config.latent_channels, latent_frames, 4, 6, generator=torch.Generator().manual_seed(1))
        chunks = list(iter_decode_video(vae, z, "cpu"))
        assert len(chunks) > 1
        assert torch.equal(torch.cat(chunks), decode_video(vae, z, "cpu"))


def test_clip_decode_is_lazy_so_the_encoder_overlaps_the_next_clip(tiny_h3_dir):
    """The first frames leave iter_decode_video after the first clip is decoded, not after all of them (the old
    eager push decoded every clip before yielding one: "streamed" saving then ran decode-then-save)."""
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.decode import decode_video, iter_decode_video

    vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").eval()
    inner, calls = vae._decode_clip, []
    vae._decode_clip = lambda *a, **k: calls.append(1) or inner(*a, **k)
    z = torch.randn(1, vae.config.latent_channels, 17, 4, 6, generator=torch.Generator().manual_seed(2))
    chunks = iter_decode_video(vae, z, "cpu")
    first = [next(chunks)]
    assert len(calls) == 1
    rest = list(chunks)
    assert len(calls) >= 3
    assert torch.equal(torch.cat(first + rest), decode_video(vae, z, "cpu"))
