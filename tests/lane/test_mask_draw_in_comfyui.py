"""H3 Mask Draw (js/mask_draw.js) inside the real ComfyUI frontend, driven in headless Chromium as a user would.

A ComfyUI with this pack (the integration lane's server: tests/comfyui_lane.py) gets a small clip in its input folder;
tests/js/comfyui_mask_draw_check.mjs opens the page, loads example_workflows/h3_object_removal.json, points its H3 Load Video
at the clip, caps and uncaps the loader's frames, scrubs the editor's timeline, draws a rectangle with the mouse, sets
the node's grow and (classic canvas) presses Run. Here we judge what it saw: the editor in the node with the clip's frames, the
drawing in the hidden mask_state widget and the grow in the node's widget, the API prompt and the run, all rasterised
by Python exactly as the browser showed them. Once with the classic canvas, once with the Vue "Nodes 2.0" renderer.
Needs COMFYUI_DIR, node, chromium and playwright-core (`npm ci`); skipped otherwise.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, TEMPLATES, our_page_errors, probe_mp4
from headless import NEEDS_BROWSER, run_script

from comfyui_h3.backend.media.mask_raster import render_state

pytestmark = [pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI), *NEEDS_BROWSER]

CLIP = "h3_mask_draw_clip.mp4"
FRAMES, WIDTH, HEIGHT = 124, 192, 96  # H3 Edit wants >= 124 frames; the workflow's drawing is 192 x 96
SCRUB_TO = 7
RECT = (110, 20, 170, 80)  # x0, y0, x1, y1 in video pixels, clear of the workflow's own box
GROW = 3
WORKFLOW = TEMPLATES / "h3_object_removal.json"


def _grey(t: int) -> int:
    return 30 + 10 * (t % 20)  # neighbouring frames differ clearly, even through JPEG


def _write_clip(path) -> None:
    from comfyui_h3.backend.media.encode import Mp4Writer

    frames = np.empty((FRAMES, HEIGHT, WIDTH, 3), np.uint8)
    for t in range(FRAMES):
        frames[t] = _grey(t)
    with Mp4Writer(str(path), WIDTH, HEIGHT, 24) as writer:
        writer.write_frames(frames)


def _canvas(view: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(tinted, grey) of the editor canvas: where the red mask overlay is, and the frame's grey level elsewhere."""
    size = (view["canvas"]["height"], view["canvas"]["width"])
    red = torch.tensor(view["canvas"]["red"], dtype=torch.float32).reshape(size)
    green = torch.tensor(view["canvas"]["green"], dtype=torch.float32).reshape(size)
    tinted = red - green > 70  # the overlay: red = 0.45 g + 140, green = 0.45 g; bare frame: red = green = g
    return tinted, green[~tinted]


def _shows_frame(view: dict, t: int, state) -> None:
    assert view["frame"] == t and view["imageFrame"] == t, view["label"]
    assert "/h3/video_frame?" in view["imageSrc"] and f"video={CLIP}" in view["imageSrc"], view["imageSrc"]
    assert f"&frame={t}&" in view["imageSrc"], view["imageSrc"]
    tinted, grey = _canvas(view)
    assert (view["canvas"]["width"], view["canvas"]["height"]) == (WIDTH, HEIGHT)
    assert abs(grey.median().item() - _grey(t)) <= 3, (t, grey.median().item())
    assert torch.equal(tinted, render_state(state, FRAMES, HEIGHT, WIDTH)[t] > 0.5), f"overlay of frame {t}"


def _prompt_settles(comfy, prompt_id: str) -> dict:
    entry = comfy.wait_for_prompt(prompt_id)
    events = [event for event, _ in entry["status"]["messages"]]
    assert entry["status"]["status_str"] == "success", comfy.why(json.dumps(entry["status"])[-4000:])
    assert "execution_success" in events
    return entry


def _preview_agrees(comfy, outputs: dict, state: str) -> None:
    """H3 Mask Preview's video (the mask the backend made from the browser's state, tinted red) shows the drawing,
    up to the h264 chroma blur at the edges."""
    import av

    [preview] = outputs["images"]
    with av.open(io.BytesIO(comfy.view(preview))) as container:
        for t, frame in enumerate(container.decode(video=0)):
            if t == SCRUB_TO:
                rgb = torch.from_numpy(frame.to_ndarray(format="rgb24")).float()
                break
    tinted = rgb[..., 0] - rgb[..., 1] > 60
    mask = render_state(state, FRAMES, HEIGHT, WIDTH)[SCRUB_TO][None, None]
    inner = -torch.nn.functional.max_pool2d(-mask, 5, 1, 2)[0, 0] > 0.5  # eroded by 2 px
    outer = torch.nn.functional.max_pool2d(mask, 5, 1, 2)[0, 0] > 0.5  # dilated by 2 px
    assert tinted[inner].all() and not tinted[~outer].any(), "mask preview disagrees with the drawing"


@pytest.fixture(scope="module")
def workflow(comfy) -> dict:
    """The shipped UI workflow, with the clip in the server's input folder."""
    _write_clip(comfy.input_dir / CLIP)
    return json.loads(WORKFLOW.read_text())


def _drive(comfy, tmp_path, vue_nodes: bool, steps: int | None) -> dict:
    """Run the browser script against `comfy` (with the Vue "Nodes 2.0" renderer or the classic canvas) and return
    what it saw."""
    # A returning user: no first-run template browser over the canvas.
    settings = comfy.root / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True, "Comfy.VueNodes.Enabled": vue_nodes}))
    screenshot = tmp_path / "failure.png"
    config = {"url": comfy.url, "workflow": str(WORKFLOW), "clip": CLIP, "frames": FRAMES, "frame": SCRUB_TO,
              "rect": RECT, "grow": GROW, "steps": steps, "screenshot": str(screenshot)}
    run = run_script("comfyui_mask_draw_check.mjs", json.dumps(config), timeout=120)
    try:
        result = json.loads(run.stdout)
    except ValueError:
        pytest.fail(comfy.why(f"no JSON from the browser script (exit {run.returncode}):\n{run.stderr[-3000:]}"))
    assert run.returncode == 0 and "error" not in result, comfy.why(
        f"browser script failed (screenshot: {screenshot}):\n{result.get('error')}\n{run.stderr[-3000:]}")
    assert result["vueNodes"] is vue_nodes
    assert not our_page_errors(result["pageErrors"]), result["pageErrors"]
    return result


def _check_editor_and_drawing(result: dict, workflow: dict) -> str:
    """The checks both renderers share; returns the drawn state (JSON)."""
    saved_state = next(n for n in workflow["nodes"] if n["type"] == "H3_MaskDraw")["widgets_values"][0]

    # The node got our editor; mask_state is kept (it is what is saved) but not shown.
    assert result["loaded"]["hasEditor"], result["loaded"]
    assert ["mask_editor", "h3_mask_editor"] in result["loaded"]["widgets"]
    first = result["first"]
    assert first["stateHidden"] and not first["stateShown"] and first["editorMounted"]
    assert first["editorBottom"] <= first["nodeBottom"] + 1, "the editor spills out of its node"
    # Loading the clip leaves the loaded drawing as it was (byte for byte: the workflow is not marked modified).
    assert first["maskState"] == saved_state

    # Frames come from the routes, with the clip's frame count on the timeline; the scrubber changes frame.
    assert first["frameCount"] == FRAMES and first["scrubber"] == {"value": "0", "max": str(FRAMES - 1)}
    assert f"frame 0 / {FRAMES - 1}" in first["label"]
    assert any("/h3/video_info?" in u and f"video={CLIP}" in u for u in result["routeCalls"]), result["routeCalls"]
    _shows_frame(first, 0, saved_state)
    assert result["capped"] == {"frameCount": 30, "max": "29"}  # the timeline follows the loader's frame_load_cap
    scrubbed = result["scrubbed"]
    assert scrubbed["scrubber"]["value"] == str(SCRUB_TO) and f"frame {SCRUB_TO} / " in scrubbed["label"]
    _shows_frame(scrubbed, SCRUB_TO, saved_state)

    # The mouse drew a rectangle on that frame's new keyframe, and neither it nor a slider drag moved the node.
    assert result["hitTest"] == ["h3-mask-canvas"] * 2, result["hitTest"]
    assert result["graphUnmoved"], "drawing dragged the node or panned the canvas"
    drawn = result["drawn"]
    state = json.loads(drawn["maskState"])
    assert [kf["frame"] for kf in state["keyframes"]] == [0, SCRUB_TO, 129]
    held, rect = next(kf["shapes"] for kf in state["keyframes"] if kf["frame"] == SCRUB_TO)
    assert held["id"] == "obj" and held["type"] == "rect"  # the workflow's box, copied as it is on that frame
    x0, y0, x1, y1 = RECT
    assert rect["type"] == "rect" and rect["id"] != "obj"
    for got, want in zip((rect["x"], rect["y"], rect["w"], rect["h"]), (x0, y0, x1 - x0, y1 - y0)):
        assert abs(got - want) < 1.5, rect
    # Grow / feather / invert are the node's widgets only; the preview (and the saved state's copy) follows them.
    assert result["settingsInEditor"] == 0
    assert result["growWidget"] == {"widget": GROW, "preview": GROW} and state["grow"] == GROW
    assert not drawn["stateShown"] and drawn["editorBottom"] <= drawn["nodeBottom"] + 1

    # Python's rasteriser agrees with the browser's, and with what the canvas shows.
    _shows_frame(drawn, SCRUB_TO, state)
    masks = render_state(state, FRAMES, HEIGHT, WIDTH)
    for t, js in result["jsMasks"].items():
        assert torch.equal(masks[int(t)], torch.tensor(js, dtype=torch.float32).reshape(HEIGHT, WIDTH)), t

    # graphToPrompt and the saved workflow carry exactly that state.
    prompt = result["prompt"]
    assert prompt["inputs"]["mask_state"] == drawn["maskState"] and prompt["inputs"]["grow"] == GROW
    assert prompt["widgetsValues"][0] == drawn["maskState"]
    return drawn["maskState"]


def test_mask_draw_and_run_in_the_classic_canvas(comfy, workflow, tmp_path):
    result = _drive(comfy, tmp_path, vue_nodes=False, steps=2)
    state = _check_editor_and_drawing(result, workflow)

    # The Run button's POST carried the state, and the run (tiny model) succeeds with that mask.
    draw_id = result["prompt"]["nodeId"]
    queued = result["queued"]
    assert queued["status"] == 200 and not queued["reply"]["node_errors"], queued["reply"]
    assert queued["sent"][draw_id]["inputs"]["mask_state"] == state
    entry = _prompt_settles(comfy, queued["reply"]["prompt_id"])
    assert entry["prompt"][2][draw_id]["inputs"]["mask_state"] == state
    node_id = {n["type"]: str(n["id"]) for n in workflow["nodes"]}
    _preview_agrees(comfy, entry["outputs"][node_id["H3_MaskPreview"]], state)
    [video] = entry["outputs"][node_id["H3_SaveVideo"]]["images"]
    info = probe_mp4(str(comfy.output_dir / video["subfolder"] / video["filename"]))
    assert info["frames"] == FRAMES, info


def test_mask_draw_in_the_vue_node_renderer(comfy, workflow, tmp_path):
    """The same in ComfyUI's optional "Nodes 2.0" renderer, where widgets are DOM fields and the node drags from any
    pointerdown inside it (no run: the backend does not care how the drawing was made)."""
    _check_editor_and_drawing(_drive(comfy, tmp_path, vue_nodes=True, steps=None), workflow)
