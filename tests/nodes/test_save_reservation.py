"""A save that cannot happen leaves nothing behind: encoder options are checked before an output name is reserved,
and a writer that fails after the reservation gives the placeholder back."""

import os

import pytest
import torch

from comfyui_h3.backend.media.encode import Mp4Writer, check_encoder_options, next_free_path
from comfyui_h3.backend.media.stream_writer import StreamingVideoSaver


def _files(root):
    return sorted(os.path.relpath(os.path.join(folder, name), root)
                  for folder, _, names in os.walk(root) for name in names)


@pytest.mark.parametrize("options,message", [
    ({"preset": "bogus"}, "preset"),
    ({"crf": 99}, "crf"),
    ({"crf": -1}, "crf"),
    ({"crf": float("nan")}, "crf"),
    ({"crf": "abc"}, "crf"),
    ({"codec": "mpeg1"}, "codec"),
])
def test_save_node_with_a_bad_option_reserves_nothing(tmp_path, monkeypatch, options, message):
    from comfyui_h3.nodes.save_video import H3SaveVideo

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path))
    with pytest.raises(ValueError, match=message):
        H3SaveVideo().save(filename_prefix="H3/h3", images=torch.rand(3, 32, 32, 3), **options)
    assert _files(tmp_path) == []


def test_check_encoder_options_accepts_the_node_choices():
    from comfyui_h3.nodes.save_video import PRESETS

    for preset in PRESETS:
        check_encoder_options("h264", 0, preset)
    check_encoder_options("h264", 51, "veryfast")


@pytest.mark.parametrize("bad", [{"width": 0}, {"preset": "bogus"}, {"crf": 60}, {"odd_size": "wrap"},
                                 {"audio_sample_rate": 12345}])
def test_writer_that_cannot_start_releases_its_placeholder(tmp_path, bad):
    path = next_free_path(tmp_path, "h3")
    assert os.path.getsize(path) == 0
    kwargs = {"width": 32, "height": 32, "fps": 24, "reserved": True, **bad}
    with pytest.raises(ValueError):
        Mp4Writer(path, **kwargs)
    assert _files(tmp_path) == []
    path = next_free_path(tmp_path, "h3")
    with pytest.raises(ValueError):
        StreamingVideoSaver(path, **kwargs)
    assert _files(tmp_path) == []


def test_writer_never_removes_a_file_that_is_not_its_placeholder(tmp_path):
    mine = tmp_path / "user.mp4"
    mine.write_bytes(b"user data")
    with pytest.raises(FileExistsError):
        Mp4Writer(str(mine), 32, 32, 24, reserved=True)
    with pytest.raises(ValueError):
        Mp4Writer(str(mine), 32, 32, 24, preset="bogus", reserved=True)
    assert mine.read_bytes() == b"user data"


def test_extend_request_checks_its_encoder_options():
    import numpy as np

    from comfyui_h3.backend.pipelines.h3.geometry import RequestError
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    request = H3ExtendRequest(prompts=["x"], added_frames=17, window_frames=56, overlap_frames=22,
                              source_frames=np.zeros((124, 64, 64, 3), np.uint8), output_path="/tmp/x.mp4", crf=99)
    with pytest.raises(RequestError, match="crf"):
        request.validate()
