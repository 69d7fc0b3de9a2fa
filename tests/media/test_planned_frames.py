"""PlannedFrames (backend/media/planned_frames.py): a clip's frames read from its file range by range, equal to the
whole decode, holding about one range in host memory; a SeedVR2 upscale from it equals one from the decoded tensor."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from comfyui_h3.backend.media.decode import decode_planned_frames, plan_frames
from comfyui_h3.backend.media.planned_frames import CHUNK_FRAMES, PlannedFrames
from comfyui_h3.backend.media.save import write_mp4


def _pattern(frames: int, h: int = 48, w: int = 64, cut: int | None = None) -> torch.Tensor:
    y = torch.arange(h).view(1, h, 1).float()
    x = torch.arange(w).view(1, 1, w).float()
    t = torch.arange(frames).view(-1, 1, 1).float()
    wave = 0.5 + 0.5 * torch.sin(2 * math.pi * (x / 29.0 + y / 17.0) + 0.2 * t)
    rgb = torch.stack([wave, 0.6 * wave, 1 - wave], dim=-1)
    if cut is not None:
        rgb[cut:] = rgb[cut:].flip(-1) * torch.tensor([0.2, 0.9, 0.4])
    return (rgb * 255).round().to(torch.uint8)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("clips") / "clip.mp4")
    write_mp4(path, _pattern(61), 24)
    return path


def test_ranges_in_order_equal_the_whole_decode_and_hold_about_one_range(clip):
    plan = plan_frames(clip)
    whole = decode_planned_frames(clip, plan)
    frames = PlannedFrames(clip, plan)
    assert frames.shape == whole.shape and frames.dtype == torch.uint8 and len(frames) == 61 and frames.dim() == 4
    held = []
    for start, stop in ((0, 17), (13, 30), (26, 43), (39, 56), (44, 61)):  # overlapping batches, starts in order
        assert torch.equal(frames[start:stop], whole[start:stop])
        held.append(frames._window.shape[0])
    assert max(held) <= 17 + CHUNK_FRAMES  # one range and a decode chunk, never the clip
    assert torch.equal(frames[5:9], whole[5:9])  # an earlier range: decoded again from the start, still right
    assert torch.equal(torch.cat(list(frames.chunks(10))), whole)
    copy = pickle.loads(pickle.dumps(frames))  # what a worker receives: the path and the plan
    assert len(pickle.dumps(frames)) < 20000 and torch.equal(copy[20:25], whole[20:25])
    with pytest.raises(TypeError, match="contiguous"):
        frames[::2]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config

    root = make_tiny_seedvr2(tmp_path_factory.mktemp("tiny") / "m", "3b")
    config = seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE,
                            dtype="float32", vae_dtype="float32")
    return config.build_pipeline(0)


@pytest.mark.slow
def test_an_upscale_from_the_file_equals_one_from_the_decoded_frames(pipe, tmp_path):
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    path = str(tmp_path / "cut.mp4")
    write_mp4(path, _pattern(30, 32, 48, cut=17), 24)
    plan = plan_frames(path)
    decoded = decode_planned_frames(path, plan)
    request = dict(scale=1.0, batch_frames=9, overlap=4, seed=1)
    from_file = pipe.run(UpscaleRequest(PlannedFrames(path, plan), **request))
    in_memory = pipe.run(UpscaleRequest(decoded, **request))
    assert from_file.manifest["request"]["shapes"]["scene_cuts"] == [17]  # found in one pass over the file
    assert from_file.batches == in_memory.batches and torch.equal(from_file.frames, in_memory.frames)


def test_the_node_and_the_cli_read_the_file_per_batch(clip, tmp_path):
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_upscale import build_request
    from comfyui_h3.video_file import H3FileVideo
    from comfyui_h3.video_types import video_frame_source

    args = _parser().parse_args(["upscale", "--video", clip, "--out", str(tmp_path / "o.mp4")])
    request = build_request(args)
    assert isinstance(request.frames, PlannedFrames) and request.num_frames == 61
    request.validate()
    video = H3FileVideo(clip)
    frames = video_frame_source(video)[0]
    assert isinstance(frames, PlannedFrames) and not video.decoded
    assert isinstance(video_frame_source(video, from_file=False)[0], torch.Tensor)  # a Ray engine: decoded here
