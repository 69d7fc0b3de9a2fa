"""The frame-preview routes (/h3/video_info, /h3/video_frame) through their handlers: every parameter bounded exactly
as H3 Load Video's widget (read from the node's declaration), malformed and out-of-range values refused before any
file is read, a frame served without decoding the clip before it (a seek), and the error -> HTTP status mapping.
The same refusal over HTTP in a real ComfyUI: tests/lane/test_comfyui_media_hardening.py."""

import io
import time

import av
import numpy as np
import pytest
import torch

from comfyui_h3 import routes
from comfyui_h3.backend.media import decode
from comfyui_h3.backend.pipelines.h3.geometry import RequestError
from comfyui_h3.nodes.load_video import H3LoadVideo


def _write_gop_clip(path, frames=40, gop=8, size=(64, 48)):
    """h264 with B-frames and a keyframe every `gop` frames; frame t is a flat grey of level 5 * t."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"g": str(gop), "keyint_min": str(gop), "bf": "2", "sc_threshold": "0", "crf": "10"}
        for t in range(frames):
            image = np.full((size[1], size[0], 3), 5 * t, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    folder = tmp_path / "input"
    folder.mkdir()
    monkeypatch.setenv("COMFYUI_H3_INPUT", str(folder))
    monkeypatch.setenv("COMFYUI_H3_COMFY", "off")
    _write_gop_clip(folder / "clip.mp4")
    routes._PLAN_CACHE.clear()
    return folder


def _bad_values():
    """(name, value) pairs H3 Load Video's widgets refuse, derived from its declaration."""
    declared = H3LoadVideo.INPUT_TYPES()["required"]
    cases = []
    for name in routes.LOADER_OPTIONS:
        kind, spec = declared[name][0], declared[name][1]
        if isinstance(kind, (list, tuple)):
            cases += [(name, "bogus"), (name, str(kind[0]).upper() + "x")]
            continue
        cases += [(name, "abc"), (name, "nan"), (name, "inf"), (name, "-inf"), (name, "1e999")]
        cases += [(name, str(spec["min"] - 1)), (name, str(spec["max"] + 1))]
        if kind == "INT":
            cases.append((name, str(spec["min"] + 0.5)))
        else:
            cases.append((name, "1e9"))
    return cases


def test_route_options_come_from_the_node_declaration():
    declared = H3LoadVideo.INPUT_TYPES()["required"]
    specs = routes.loader_option_specs()
    assert set(specs) == set(routes.LOADER_OPTIONS)
    for name, (kind, spec) in specs.items():
        assert kind == declared[name][0] and spec == declared[name][1]


@pytest.mark.parametrize("name,value", _bad_values())
def test_out_of_range_or_malformed_options_are_refused_before_reading(inputs, name, value):
    started = time.monotonic()
    for handler in (routes.video_info, routes.frame_jpeg):
        # a missing file: the parameter error must come first, before any file is looked at
        with pytest.raises(RequestError, match=name):
            handler({"video": "missing.mp4", name: value})
        with pytest.raises(RequestError, match=name):
            handler({"video": "clip.mp4", name: value})
    assert time.monotonic() - started < 5
    assert not routes._PLAN_CACHE  # nothing was planned


@pytest.mark.parametrize("query", [{"frame": "-1"}, {"frame": "40"}, {"frame": "2.5"}, {"frame": "x"},
                                   {"frame": "1e300"}, {"max_size": "15"}, {"max_size": "2049"},
                                   {"max_size": "nan"}, {"frame": "5", "frame_load_cap": "5"}])
def test_frame_and_size_out_of_range_are_refused(inputs, query):
    with pytest.raises(RequestError):
        routes.frame_jpeg(dict({"video": "clip.mp4"}, **query))


def test_values_at_the_widget_bounds_are_served(inputs):
    declared = H3LoadVideo.INPUT_TYPES()["required"]
    top_rate = declared["force_rate"][1]["max"]
    info = routes.video_info({"video": "clip.mp4", "force_rate": str(top_rate)})
    assert info["fps"] == top_rate and info["frame_count"] == 400  # 40 frames at 24 fps held on a 240-fps grid
    nth = declared["select_every_nth"][1]["max"]
    assert routes.video_info({"video": "clip.mp4", "select_every_nth": str(nth)})["frame_count"] == 1
    assert routes.video_info({"video": "clip.mp4", "force_rate": "24.0", "width": "64.0"})["frame_count"] == 40
    from PIL import Image

    data = routes.frame_jpeg({"video": "clip.mp4", "frame": "39", "max_size": "16"})
    assert Image.open(io.BytesIO(data)).size == (16, 12)


def test_a_frame_is_planned_and_decoded_only_up_to_itself(inputs, monkeypatch):
    from PIL import Image

    def no_walk(*a, **k):
        raise AssertionError("the whole-clip walk ran: the frame should come from a seek")

    monkeypatch.setattr(decode, "_planned_images", no_walk)
    data = routes.frame_jpeg({"video": "clip.mp4", "frame": "29"})
    level = np.asarray(Image.open(io.BytesIO(data)).convert("L")).mean()
    assert abs(level - 5 * 29) < 4
    (plan,) = routes._PLAN_CACHE.values()
    assert plan.frame_count == 30  # planned up to the frame, not the clip
    # With the whole clip's plan cached (the editor asked video_info first), that plan is used.
    routes.video_info({"video": "clip.mp4"})
    routes.frame_jpeg({"video": "clip.mp4", "frame": "3"})
    assert sorted(p.frame_count for p in routes._PLAN_CACHE.values()) == [30, 40]


@pytest.mark.parametrize("options", [{}, {"force_rate": 30, "skip_first_frames": 3, "select_every_nth": 2}])
def test_seeked_frame_equals_the_whole_clip_decode(inputs, options):
    path = str(inputs / "clip.mp4")
    plan = decode.plan_frames(path, **options)
    whole = decode.decode_planned_frames(path, plan)
    for index in range(plan.frame_count):
        assert torch.equal(decode.decode_planned_frame(path, plan, index), whole[index]), index
    with pytest.raises(IndexError):
        decode.decode_planned_frame(path, plan, plan.frame_count)


def test_decode_refuses_non_finite_rates(inputs):
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite"):
            decode.plan_frames(str(inputs / "clip.mp4"), force_rate=bad)
        with pytest.raises(ValueError, match="finite"):
            decode.plan_frames(str(inputs / "clip.mp4"), max_seconds=bad)


def test_error_statuses():
    from comfyui_h3 import comfy_services as services

    assert routes.error_status(RequestError("x")) == 400
    assert routes.error_status(ValueError("x")) == 400
    assert routes.error_status(services.UnsafePathError("x")) == 403
    assert routes.error_status(FileNotFoundError("x")) == 404
