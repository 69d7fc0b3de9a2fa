"""H3 Mask Draw / H3 Mask Preview and the frame route: rasterisation against hand-computed masks, keyframe
interpolation, grow / feather / invert, external-mask combine, the preview output, path safety, and agreement of the
Python rasteriser with js/mask_logic.js (run under node) on a fixture state."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.media.mask_raster import (grow_feather_invert, parse_state, rasterize_state, render_state,
                                                  shapes_at)
from comfyui_h3.nodes.mask_draw import H3MaskDraw
from comfyui_h3.nodes.mask_preview import H3MaskPreview
from comfyui_h3.video_types import H3Video


FIXTURE = {
    "version": 1, "width": 64, "height": 48, "grow": 0, "feather": 0, "invert": False,
    "keyframes": [
        {"frame": 0, "shapes": [
            {"id": "r", "type": "rect", "x": 4, "y": 4, "w": 10, "h": 8},
            {"id": "e", "type": "ellipse", "cx": 40, "cy": 30, "rx": 9, "ry": 6},
            {"id": "b", "type": "brush", "size": 5, "points": [[5, 40], [30, 35], [60, 44]]},
            {"id": "x", "type": "eraser", "size": 4, "points": [[40, 30], [46, 30]]},
        ]},
        {"frame": 4, "shapes": [
            {"id": "r", "type": "rect", "x": 30, "y": 10, "w": 20, "h": -6},
            {"id": "e", "type": "ellipse", "cx": 20, "cy": 24, "rx": 4, "ry": 12},
        ]},
    ],
}


def _video(frames=5, height=48, width=64):
    return H3Video(torch.full((frames, height, width, 3), 100, dtype=torch.uint8), 24)


def test_rect_and_ellipse_match_hand_computed_masks():
    state = {"width": 8, "height": 4, "keyframes": [{"frame": 0, "shapes": [
        {"id": "a", "type": "rect", "x": 2, "y": 1, "w": 3, "h": 2}]}]}
    want = np.zeros((4, 8), np.float32)
    want[1:3, 2:5] = 1
    assert np.array_equal(rasterize_state(state, 1, 4, 8)[0].numpy(), want)
    # twice the output size: each state unit is 2 pixels
    big = rasterize_state(state, 1, 8, 16)[0].numpy()
    assert np.array_equal(big, np.kron(want, np.ones((2, 2), np.float32)))
    ellipse = {"width": 5, "height": 5, "keyframes": [{"frame": 0, "shapes": [
        {"id": "e", "type": "ellipse", "cx": 2.5, "cy": 2.5, "rx": 1.6, "ry": 1.6}]}]}
    plus = np.zeros((5, 5), np.float32)
    plus[2, 1:4] = plus[1:4, 2] = 1  # centres at distance 0 and 1 are inside, sqrt(2) > 1.6? no: 1.41 < 1.6
    plus[1, 1] = plus[1, 3] = plus[3, 1] = plus[3, 3] = 1
    assert np.array_equal(rasterize_state(ellipse, 1, 5, 5)[0].numpy(), plus)


def test_brush_and_eraser():
    state = {"width": 10, "height": 10, "keyframes": [{"frame": 0, "shapes": [
        {"id": "b", "type": "brush", "size": 2, "points": [[0, 5], [10, 5]]},
        {"id": "x", "type": "eraser", "size": 2, "points": [[5, 5]]}]}]}
    m = rasterize_state(state, 1, 10, 10)[0].numpy()
    want = np.zeros((10, 10), np.float32)
    want[4:6, :] = 1
    want[4:6, 4:6] = 0
    assert np.array_equal(m, want)


def test_keyframes_interpolate_shapes_and_hold_strokes():
    state = parse_state(json.dumps(FIXTURE))
    mid = shapes_at(state, 2)
    assert mid[0] == {"id": "r", "type": "rect", "x": 17.0, "y": 7.0, "w": 15.0, "h": 1.0}
    assert mid[1]["rx"] == pytest.approx(6.5) and mid[1]["cx"] == pytest.approx(30)
    assert [s["type"] for s in mid] == ["rect", "ellipse", "brush", "eraser"]  # strokes held
    assert [s["type"] for s in shapes_at(state, 4)] == ["rect", "ellipse"]
    assert shapes_at(state, 100) == shapes_at(state, 4)
    assert rasterize_state({"width": 4, "height": 4, "keyframes": []}, 3, 4, 4).abs().sum() == 0


def test_grow_feather_invert():
    m = torch.zeros(1, 11, 11)
    m[0, 5, 5] = 1
    grown = grow_feather_invert(m, grow=2)
    yy, xx = torch.meshgrid(torch.arange(11), torch.arange(11), indexing="ij")
    disk = (((yy - 5) ** 2 + (xx - 5) ** 2) <= 4).float()
    assert torch.equal(grown[0], disk)
    assert grow_feather_invert(grown, grow=-1).sum() == 5
    soft = grow_feather_invert(grown, feather=3)
    assert soft.sum().item() == pytest.approx(13, abs=1e-3) and 0 < soft[0, 5, 5] < 1 and soft[0, 5, 8] > 0
    assert torch.equal(grow_feather_invert(m, invert=True), 1 - m)


def test_node_output_and_external_mask_combine():
    node = H3MaskDraw()
    state = json.dumps({"width": 8, "height": 4, "keyframes": [{"frame": 0, "shapes": [
        {"id": "a", "type": "rect", "x": 0, "y": 0, "w": 4, "h": 4},
        {"id": "x", "type": "eraser", "size": 1, "points": [[0.5, 0.5]]}]}]})
    video = _video(3, 4, 8)
    (mask,) = node.draw(video, state)
    assert mask.shape == (3, 4, 8) and mask.dtype == torch.float32
    drawn = mask[0].clone()
    assert drawn.sum() == 15
    external = torch.zeros(1, 4, 8)
    external[0, :, 4:] = 1  # the right half
    (union,) = node.draw(video, state, mask=external, combine="union")
    assert union[2].sum() == 15 + 16
    (inter,) = node.draw(video, state, mask=external, combine="intersect")
    assert inter.sum() == 0
    (sub,) = node.draw(video, state, mask=external, combine="subtract")
    assert torch.equal(sub[0], drawn)
    (rep,) = node.draw(video, state, mask=torch.ones(1, 2, 4), combine="replace")  # resized to 4 x 8
    assert rep[1].sum() == 31  # the eraser cuts the external mask
    (inv,) = node.draw(video, state, invert=True)
    assert torch.equal(inv[0], 1 - drawn)
    assert "not valid JSON" in H3MaskDraw.VALIDATE_INPUTS(mask_state="{oops")


def test_preview_overlays_and_saves_to_temp(tmp_path, monkeypatch):
    monkeypatch.setenv("COMFYUI_H3_TEMP", str(tmp_path))
    monkeypatch.setenv("COMFYUI_H3_COMFY", "off")
    mask = torch.zeros(1, 48, 64)
    mask[:, :, :32] = 1
    out = H3MaskPreview().preview(_video(4), mask, color="red", opacity=0.5)
    (video,) = out["result"]
    assert isinstance(video, H3Video) and video.frames.dtype == torch.uint8 and video.get_frame_count() == 4
    assert video.frames[0, 0, 0].tolist() == [178, 50, 50] and video.frames[0, 0, 40].tolist() == [100, 100, 100]
    image = out["ui"]["images"][0]
    assert image["type"] == "temp" and out["ui"]["animated"] == (True,)
    assert os.path.getsize(tmp_path / image["subfolder"] / image["filename"]) > 0


def test_frame_route_serves_frames_and_refuses_outside_paths(tmp_path, monkeypatch):
    from comfyui_h3 import comfy_services as services
    from comfyui_h3 import routes
    from comfyui_h3.backend.media.save import write_mp4

    inputs = tmp_path / "input"
    inputs.mkdir()
    monkeypatch.setenv("COMFYUI_H3_INPUT", str(inputs))
    monkeypatch.setenv("COMFYUI_H3_COMFY", "off")
    frames = torch.zeros(6, 64, 96, 3, dtype=torch.uint8)
    for t in range(6):
        frames[t, :, :, 0] = 40 * t
    write_mp4(str(inputs / "clip.mp4"), frames, 24)
    (tmp_path / "secret.mp4").write_bytes((inputs / "clip.mp4").read_bytes())
    info = routes.video_info({"video": "clip.mp4"})
    assert info == {"frame_count": 6, "width": 96, "height": 64, "fps": 24.0}
    assert routes.video_info({"video": "clip.mp4", "select_every_nth": "2"})["frame_count"] == 3
    data = routes.frame_jpeg({"video": "clip.mp4", "frame": "5", "max_size": "48"})
    from PIL import Image
    import io

    image = Image.open(io.BytesIO(data))
    assert image.size == (48, 32) and abs(image.getpixel((24, 16))[0] - 200) < 12
    for bad in ("../secret.mp4", str(tmp_path / "secret.mp4"), "a/../../secret.mp4"):
        with pytest.raises(services.UnsafePathError):
            routes.frame_jpeg({"video": bad})
    with pytest.raises(services.UnsafePathError):
        routes.video_info({"video": "clip.mp4", "path": "../secret.mp4"})
    with pytest.raises(FileNotFoundError):
        routes.video_info({"video": "missing.mp4"})
    assert routes.register_routes() is False  # no ComfyUI server in this process


@pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js) is not installed: JS parity not checked")
@pytest.mark.parametrize("settings", [{}, {"grow": 2}, {"grow": -1, "feather": 3}, {"feather": 2, "invert": True}])
def test_python_and_js_rasterise_the_same(tmp_path, settings):
    state = dict(FIXTURE, **settings)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    frames, width, height = 6, 80, 60  # not the state's 64 x 48: scaling is part of the rules
    run = subprocess.run(["node", os.path.join(REPO_DIR, "tests", "js", "render_state.mjs"), str(path), str(frames),
                          str(width), str(height)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    js = torch.tensor(json.loads(run.stdout), dtype=torch.float32).reshape(frames, height, width)
    py = render_state(state, frames, height, width)
    diff = (js - py).abs()
    if diff.max() > 1e-4:  # allowed only on shape edges: every differing pixel has an edge within 1 px
        hard = rasterize_state(state, frames, height, width)
        edge = (torch.nn.functional.max_pool2d(hard[:, None], 3, 1, 1) != -torch.nn.functional.max_pool2d(
            -hard[:, None], 3, 1, 1))[:, 0]
        assert bool(edge[diff > 1e-4].all()), f"Python and JS differ away from edges (max {diff.max()})"
    assert py.sum() > 0


@pytest.mark.parametrize("shape,message", [
    ({"type": "rect", "x": "ten", "y": 0, "w": 5, "h": 5}, r"shape 1 \(rect\): 'x' must be a finite number, got 'ten'"),
    ({"type": "rect", "x": 0, "y": 0, "w": [5], "h": 5}, r"shape 1 \(rect\): 'w' must be a finite number"),
    ({"type": "ellipse", "cx": 1, "cy": None, "rx": 3, "ry": 3}, r"shape 1 \(ellipse\): 'cy' must be a finite"),
    ({"type": "ellipse", "cx": 1, "cy": 1, "rx": True, "ry": 3}, r"shape 1 \(ellipse\): 'rx' must be a finite"),
    ({"type": "brush", "size": "big", "points": [[1, 1]]}, r"shape 1 \(brush\): 'size' must be a finite number >= 0"),
    ({"type": "eraser", "size": -2, "points": [[1, 1]]}, r"shape 1 \(eraser\): 'size' must be a finite number >= 0"),
    ({"type": "brush", "size": 4, "points": [[1, "y"]]}, r"shape 1 \(brush\): point 0 must be an \[x, y\] pair"),
    ({"type": "brush", "size": 4, "points": [[1, 1], [2]]}, r"shape 1 \(brush\): point 1 must be an \[x, y\] pair"),
    ({"type": "brush", "size": 4, "points": "1,2"}, r"shape 1 \(brush\): 'points' must be a list"),
    ({"type": "rect", "id": ["s"], "x": 0, "y": 0, "w": 5, "h": 5}, r"shape 1 \(rect\): 'id' must be a string"),
])
def test_a_shape_field_that_is_not_a_number_names_the_shape_and_the_field(shape, message):
    """Every field of every shape kind is checked where the state is parsed (it used to reach float() / a dict key
    and come back as Python's own conversion message)."""
    ok = {"type": "rect", "id": "s0", "x": 1, "y": 1, "w": 4, "h": 4}
    state = {"version": 1, "width": 64, "height": 40, "keyframes": [{"frame": 3, "shapes": [ok, shape]}]}
    with pytest.raises(ValueError, match=r"mask_state keyframe 0 \(frame 3\) " + message) as info:
        parse_state(json.dumps(state))
    assert "\n" not in str(info.value)
    assert H3MaskDraw.VALIDATE_INPUTS(json.dumps(state)).startswith("H3 Mask Draw: mask_state keyframe 0")
    for bad in ({"frame": "two", "shapes": []}, {"frame": -1, "shapes": []}):
        with pytest.raises(ValueError, match="keyframe 0 needs 'frame' as an integer >= 0"):
            parse_state({"version": 1, "width": 64, "height": 40, "keyframes": [bad]})
    for key, value in (("width", "wide"), ("grow", "2"), ("feather", 1.5), ("invert", "no")):
        with pytest.raises(ValueError, match=f"mask_state {'needs a positive width' if key == 'width' else repr(key)}"):
            parse_state({"version": 1, "width": 64, "height": 40, "keyframes": [], key: value})
