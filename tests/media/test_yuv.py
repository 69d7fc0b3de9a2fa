"""RGB -> YUV 4:2:0 on the frames' device (backend/media/yuv.py) and the encoder path that takes the planes."""

import av
import numpy as np
import pytest
import torch
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from comfyui_h3.backend.media.encode import Mp4Writer
from comfyui_h3.backend.media.stream_writer import StreamingVideoSaver
from comfyui_h3.backend.media.yuv import rgb_to_yuv420p, yuv420p_to_rgb


def _reference_yuv420p(frames: np.ndarray) -> np.ndarray:
    """The BT.709 limited-range rule in float64, written out independently of the module."""
    rgb = frames.astype(np.float64) / 255.0
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y_ = 0.2126 * r + 0.7152 * g + 0.0722 * b
    y = 16 + 219 * y_
    cb = 128 + 224 * (b - y_) / 1.8556
    cr = 128 + 224 * (r - y_) / 1.5748
    t, h, w = y.shape

    def half(p):
        return p.reshape(t, h // 2, 2, w // 2, 2).mean(axis=(2, 4)).reshape(t, -1)

    chroma = np.concatenate([half(cb), half(cr)], axis=1).reshape(t, h // 2, w)
    return np.clip(np.rint(np.concatenate([y, chroma], axis=1)), 0, 255).astype(np.uint8)


def _smooth_frames(t=5, h=48, w=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    frames = []
    for i in range(t):
        phase = torch.rand(3, generator=g) * 6.28
        img = torch.stack([0.5 + 0.45 * torch.sin(3 * xx + 2 * yy + phase[c] + i * 0.3) for c in range(3)], -1)
        frames.append(img)
    return (torch.stack(frames) * 255).round().to(torch.uint8)


def test_conversion_equals_the_float64_rule_on_random_frames():
    frames = torch.randint(0, 256, (3, 32, 48, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    ours = rgb_to_yuv420p(frames).numpy()
    ref = _reference_yuv420p(frames.numpy())
    assert ours.shape == (3, 48, 48) and ours.dtype == np.uint8
    diff = np.abs(ours.astype(int) - ref.astype(int))
    assert diff.max() <= 1  # float32 vs float64 may round a value sitting on .5 the other way
    assert (diff > 0).mean() < 1e-3


def test_extremes_map_to_the_limited_range():
    black_white = torch.tensor([[[0, 0, 0]], [[255, 255, 255]]], dtype=torch.uint8).reshape(2, 1, 1, 3)
    frames = black_white.expand(2, 2, 2, 3).contiguous()
    planes = rgb_to_yuv420p(frames)
    assert planes[0, :2].unique().tolist() == [16] and planes[1, :2].unique().tolist() == [235]
    assert planes[:, 2:].unique().tolist() == [128]  # greys carry no chroma


def test_close_to_swscale_which_the_cpu_path_uses():
    frames = _smooth_frames()
    ours = rgb_to_yuv420p(frames).numpy().astype(int)
    h = frames.shape[1]
    reformatter = VideoReformatter()
    for i, image in enumerate(frames.numpy()):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame = reformatter.reformat(frame, format="yuv420p", src_colorspace=Colorspace.ITU709,
                                     dst_colorspace=Colorspace.ITU709, src_color_range=ColorRange.JPEG,
                                     dst_color_range=ColorRange.MPEG)
        theirs = frame.to_ndarray().astype(int)
        assert np.abs(ours[i, :h] - theirs[:h]).max() <= 1
        assert np.abs(ours[i, h:] - theirs[h:]).max() <= 4  # chroma filters differ (box vs swscale's kernel)


def test_round_trip_recovers_flat_blocks():
    frames = _smooth_frames(t=2, h=16, w=16)
    blocks = frames.reshape(2, 8, 2, 8, 2, 3)[:, :, :1, :, :1].expand(2, 8, 2, 8, 2, 3).reshape(2, 16, 16, 3)
    back = yuv420p_to_rgb(rgb_to_yuv420p(blocks.contiguous())) * 255
    assert (back - blocks.float()).abs().max() <= 2.5  # the limited range's coarser steps


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="even"):
        rgb_to_yuv420p(torch.zeros(1, 3, 4, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        rgb_to_yuv420p(torch.zeros(1, 4, 4, 3))


def _decode_rgb(path):
    with av.open(path) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255.0 ** 2 / max(mse, 1e-12))


def test_writer_takes_planes_and_the_file_decodes_to_the_frames(tmp_path):
    frames = _smooth_frames(t=6)
    path = str(tmp_path / "planes.mp4")
    with Mp4Writer(path, 64, 48, 24, crf=10) as writer:
        assert writer.takes_yuv420p
        writer.write_yuv420p(rgb_to_yuv420p(frames))
    back = _decode_rgb(path)
    assert back.shape == (6, 48, 64, 3)
    assert _psnr(back, frames.numpy()) > 35  # lossy codec: a quality floor, never bytes


def test_writer_refuses_planes_when_it_must_pad(tmp_path):
    with Mp4Writer(str(tmp_path / "odd.mp4"), 63, 48, 24) as writer:
        assert not writer.takes_yuv420p
        with pytest.raises(ValueError, match="even size"):
            writer.write_yuv420p(np.zeros((1, 72, 63), np.uint8))
        writer.write_frames(np.zeros((1, 48, 63, 3), np.uint8))
    with Mp4Writer(str(tmp_path / "shape.mp4"), 64, 48, 24) as writer:
        with pytest.raises(ValueError, match=r"\[T, 72, 64\]"):
            writer.write_yuv420p(np.zeros((1, 48, 64), np.uint8))
        writer.write_frames(np.zeros((1, 48, 64, 3), np.uint8))


class _PlanesOnTheCpu(StreamingVideoSaver):
    """The GPU path's conversion, forced on CPU tensors (the same code runs; only the device differs)."""

    def _wants_yuv420p(self, device):
        return self._writer.takes_yuv420p


def test_streaming_saver_converts_on_the_device_and_moves_half_the_bytes(tmp_path):
    frames = _smooth_frames(t=7)
    rgb_path, yuv_path = str(tmp_path / "rgb.mp4"), str(tmp_path / "yuv.mp4")
    with StreamingVideoSaver(rgb_path, 64, 48, 24, chunk_frames=3, crf=10) as saver:
        saver.write(frames)
    with _PlanesOnTheCpu(yuv_path, 64, 48, 24, chunk_frames=3, crf=10) as saver:
        saver.write(frames)
        assert saver.yuv420p
        assert saver.stats["host_buffer_bytes"] == 2 * 3 * 48 * 64 * 3 // 2
    a, b = _decode_rgb(rgb_path), _decode_rgb(yuv_path)
    assert a.shape == b.shape == (7, 48, 64, 3)
    assert _psnr(b, frames.numpy()) > 35 and _psnr(a, frames.numpy()) > 35


def test_gpu_yuv_is_off_for_cpu_frames_and_when_asked(tmp_path):
    with StreamingVideoSaver(str(tmp_path / "a.mp4"), 64, 48, 24, device="cpu") as saver:
        assert not saver.yuv420p  # swscale converts CPU frames
        saver.write(_smooth_frames(t=1))
