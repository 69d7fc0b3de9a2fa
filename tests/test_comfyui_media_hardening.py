"""Integration lane (a real ComfyUI, see tests/comfyui_lane.py): the frame-preview routes answer an out-of-range
parameter with a 400 at once, and Stop reaches a long H3 Mask Draw grow. Skipped without COMFYUI_DIR; the same logic
is covered on the CPU by tests/test_routes.py and tests/test_mask_grow.py."""

from __future__ import annotations

import time
import urllib.parse
import uuid

import av
import numpy as np
import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)


def _write_clip(path, frames: int, width: int, height: int) -> None:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for t in range(frames):
            image = np.full((height, width, 3), (7 * t) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


@pytest.fixture(scope="module")
def clip(comfy):
    name = "h3_hardening_clip.mp4"
    _write_clip(comfy.input_dir / name, 48, 64, 48)
    return name


_LOADER_BAD = [{"force_rate": "1e9"}, {"force_rate": "nan"}, {"skip_first_frames": "-1"}, {"select_every_nth": "0"},
               {"width": "100000"}, {"resize": "huge"}, {"max_seconds": "inf"}]
_FRAME_BAD = [{"frame": "999999"}, {"frame": "-1"}, {"max_size": "99999"}]


@pytest.mark.parametrize("route,bad", [("/h3/video_frame", bad) for bad in _LOADER_BAD + _FRAME_BAD]
                         + [("/h3/video_info", bad) for bad in _LOADER_BAD])
def test_out_of_range_route_parameter_gets_400_within_a_second(comfy, clip, route, bad):
    query = urllib.parse.urlencode(dict({"video": clip, "frame": "0"}, **bad))
    started = time.monotonic()
    status, body = comfy.request(f"{route}?{query}", timeout=10)
    elapsed = time.monotonic() - started
    assert status == 400, comfy.why(f"{route}?{query} -> {status} {body!r}")
    assert isinstance(body, dict) and next(iter(bad)) in body["error"], body
    assert elapsed < 1.0, f"{route}?{query} took {elapsed:.2f} s"
    assert comfy.request(f"/h3/video_info?video={clip}")[0] == 200  # the server is still fine


def test_good_route_parameters_are_served(comfy, clip):
    status, info = comfy.request(f"/h3/video_info?video={clip}&force_rate=240")
    assert status == 200 and info["frame_count"] == 480 and info["fps"] == 240.0, info
    status, _ = comfy.request(f"/h3/video_frame?video={clip}&force_rate=240&frame=479&max_size=32")
    assert status == 200
