"""PlannedFrames (backend/media/planned_frames.py): a clip's frames read from its file range by range, equal to the
whole decode, holding about one range in host memory; a SeedVR2 upscale from it equals one from the decoded tensor."""

from __future__ import annotations

import pickle

import pytest
import torch

from comfyui_h3.backend.media.decode import decode_planned_frames, plan_frames
from comfyui_h3.backend.media.planned_frames import CHUNK_FRAMES, PlannedFrames
from comfyui_h3.backend.media.save import write_mp4
from clip_patterns import pattern


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("clips") / "clip.mp4")
    write_mp4(path, pattern(61), 24)
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
