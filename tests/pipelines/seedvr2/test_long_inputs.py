"""SeedVR2 on long inputs: an upscale read from its file batch by batch (media/planned_frames.py) equals one from
the decoded frames, and the node and the CLI hand the worker the file, not the clip."""

from __future__ import annotations

import pytest
import torch

from comfyui_h3.backend.media.decode import decode_planned_frames, plan_frames
from comfyui_h3.backend.media.planned_frames import PlannedFrames
from comfyui_h3.backend.media.save import write_mp4
from clip_patterns import pattern


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("clips") / "clip.mp4")
    write_mp4(path, pattern(61), 24)
    return path


@pytest.mark.slow
def test_an_upscale_from_the_file_equals_one_from_the_decoded_frames(pipe, tmp_path):
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    path = str(tmp_path / "cut.mp4")
    write_mp4(path, pattern(30, 32, 48, cut=17), 24)
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
    from comfyui_h3.video_file import video_frame_source

    args = _parser().parse_args(["upscale", "--video", clip, "--out", str(tmp_path / "o.mp4")])
    request = build_request(args)
    assert isinstance(request.frames, PlannedFrames) and request.num_frames == 61
    request.validate()
    video = H3FileVideo(clip)
    frames = video_frame_source(video)[0]
    assert isinstance(frames, PlannedFrames) and not video.decoded
    assert isinstance(video_frame_source(video, from_file=False)[0], torch.Tensor)  # a Ray engine: decoded here
