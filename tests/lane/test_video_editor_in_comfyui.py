"""The full-size video editor (js/mask_dialog.js) inside the real ComfyUI frontend, driven in headless Chromium as a
user would (tests/js/comfyui_video_editor_check.mjs).

On a graph Load Video -> H3 Track Mask -> H3 Mask Draw (its mask input, union) -> H3 Mask Preview the script opens
Mask Draw's editor with the node's button, scrubs, draws a stroke, undoes and redoes, closes; opens Track Mask's editor,
places a positive and a negative click, a box on another frame and a second object's click, closes; saves and reloads
the workflow; and (classic canvas) presses Run. Here we judge it: the dialog fills the window and shows the clip's
frames from the routes; the edits land in the hidden widgets (mask_state; prompts, read by the backend's own parser in
source-video pixels) and survive the reload; the prompt the Run button posts carries the stroke and the clicks and
runs (the tiny SAM2 model: it segments nothing meaningful). Once with the classic canvas, once with the Vue "Nodes
2.0" renderer. Screenshots of the dialog go to H3_EDITOR_SHOTS (a folder outside the repo) when it is set, else to the
test's temporary folder. Needs COMFYUI_DIR, node, chromium and playwright-core (`npm ci`); skipped otherwise.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, our_page_errors
from headless import NEEDS_BROWSER, run_script

from comfyui_h3.backend.media.mask_raster import render_state
from comfyui_h3.backend.media.track_prompts import check_against_video, parse_prompts

pytestmark = [pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI), *NEEDS_BROWSER]

CLIP = "h3_video_editor_clip.mp4"
FRAMES, WIDTH, HEIGHT = 24, 192, 96
SCRUB_TO = 7
STROKE = [[40, 60], [70, 60], [100, 60], [130, 60], [150, 60]]  # video pixels, brush size 12
CLICKS = {"pos": [50, 40], "neg": [70, 50], "frame": 5, "box": [100, 20, 180, 80], "other": [30, 70]}


def _grey(t: int) -> int:
    return 30 + 10 * (t % 20)


@pytest.fixture(scope="module")
def clip(comfy) -> str:
    from comfyui_h3.backend.media.encode import Mp4Writer

    frames = np.empty((FRAMES, HEIGHT, WIDTH, 3), np.uint8)
    for t in range(FRAMES):
        frames[t] = _grey(t)
    with Mp4Writer(str(comfy.input_dir / CLIP), WIDTH, HEIGHT, 24) as writer:
        writer.write_frames(frames)
    return CLIP


def _drive(comfy, clip, tmp_path, vue_nodes: bool, run: bool) -> dict:
    settings = comfy.root / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True, "Comfy.VueNodes.Enabled": vue_nodes}))
    shots = os.environ.get("H3_EDITOR_SHOTS") or str(tmp_path)
    os.makedirs(shots, exist_ok=True)
    config = {"url": comfy.url, "clip": clip, "frame": SCRUB_TO, "stroke": STROKE, "clicks": CLICKS, "run": run,
              "shots": shots}
    result_run = run_script("comfyui_video_editor_check.mjs", json.dumps(config), timeout=180)
    try:
        result = json.loads(result_run.stdout)
    except ValueError:
        pytest.fail(comfy.why(f"no JSON from the browser script (exit {result_run.returncode}):\n"
                              f"{result_run.stderr[-3000:]}"))
    assert result_run.returncode == 0 and "error" not in result, comfy.why(
        f"browser script failed (screenshots: {shots}):\n{result.get('error')}\n{result_run.stderr[-3000:]}")
    assert result["vueNodes"] is vue_nodes
    assert not our_page_errors(result["pageErrors"]), result["pageErrors"]
    return result


def _check(result: dict) -> tuple[str, str]:
    """The checks both renderers share; returns (mask_state, prompts) as the widgets hold them at the end."""
    # Track Mask's prompts widget is kept (saved, sent) but hidden behind a summary and the editor button.
    assert "prompts" in [name for name, _ in result["built"]["trackWidgets"]]
    before = result["before"]
    assert before["promptsHidden"] and before["maskStateHidden"] and not before["jsonShown"]
    assert before["summary"] == "no clicks or boxes"
    assert result["H3_MaskDrawButton"] and result["H3_TrackMaskButton"], "the node's button is covered"

    # Mask Draw's dialog: the window's size, the clip's frames from the routes.
    opened = result["maskOpened"]
    assert opened["node"] == "H3_MaskDraw" and opened["mode"] == "mask"
    assert opened["overlayBox"] == [0, 0, *opened["window"]]
    assert opened["canvasBox"][2] > 0.9 * opened["window"][0] and opened["canvasBox"][3] > 0.5 * opened["window"][1]
    assert opened["frameCount"] == FRAMES and opened["video"]["width"] == WIDTH and opened["video"]["height"] == HEIGHT
    assert "/h3/video_frame?" in opened["src"] and f"video={CLIP}" in opened["src"] and "&frame=0&" in opened["src"]

    # The stroke on the scrubbed frame lands in mask_state and in the node's preview at once.
    drawn = result["drawn"]
    assert drawn["dialog"]["frame"] == SCRUB_TO and f"&frame={SCRUB_TO}&" in drawn["dialog"]["src"]
    state = json.loads(drawn["maskState"])
    assert (state["width"], state["height"]) == (WIDTH, HEIGHT)
    [keyframe] = state["keyframes"]
    assert keyframe["frame"] == SCRUB_TO
    [stroke] = keyframe["shapes"]
    assert stroke["type"] == "brush" and stroke["size"] == 12
    assert stroke["points"][0] == pytest.approx(STROKE[0], abs=0.5)
    assert stroke["points"][-1] == pytest.approx(STROKE[-1], abs=0.5)
    assert drawn["previewState"] == json.dumps(state["keyframes"], separators=(",", ":"))
    masks = render_state(state, FRAMES, HEIGHT, WIDTH)
    assert masks[SCRUB_TO, 60, 100] == 1 and masks[SCRUB_TO, 30, 100] == 0 and masks[SCRUB_TO, 60, 20] == 0
    # undo takes it out of the widget, redo puts it back; closing leaves it, and the node shows the dialog's frame
    assert json.loads(result["undone"]["maskState"])["keyframes"] == []
    assert result["redone"]["maskState"] == drawn["maskState"]
    closed = result["maskClosed"]
    assert closed["maskState"] == drawn["maskState"] and closed["overlays"] == 0 and closed["previewFrame"] == SCRUB_TO

    # Track Mask's dialog: clicks and a box in source-video pixels, read by the backend's parser.
    assert result["trackOpened"]["mode"] == "prompts" and result["trackOpened"]["video"]["width"] == WIDTH
    placed = result["placed"]
    prompts = check_against_video(parse_prompts(placed["prompts"]), FRAMES, WIDTH, HEIGHT)
    one, two = prompts.objects
    assert one.id == 1 and two.id == 2
    assert [(c.frame, c.positive) for c in one.clicks] == [(0, True), (0, False)]
    assert [c.x for c in one.clicks] == pytest.approx([CLICKS["pos"][0], CLICKS["neg"][0]], abs=0.5)
    assert [c.y for c in one.clicks] == pytest.approx([CLICKS["pos"][1], CLICKS["neg"][1]], abs=0.5)
    [box] = one.boxes
    assert box.frame == CLICKS["frame"]
    assert [box.x0, box.y0, box.x1, box.y1] == pytest.approx(CLICKS["box"], abs=0.5)
    [other] = two.clicks
    assert (other.frame, other.positive) == (CLICKS["frame"], True) and [other.x, other.y] == pytest.approx(CLICKS["other"], abs=0.5)
    assert placed["summary"] == "2 objects · 3 clicks (1 negative) · 1 box · frames 0, 5"
    assert result["trackClosed"]["prompts"] == placed["prompts"] and result["trackClosed"]["overlays"] == 0
    assert result["trackClosed"]["maskState"] == drawn["maskState"]  # one editor's edits leave the other's alone

    # Saved and reloaded: both widgets come back as they were, and the editors show them.
    saved = dict((node_type, values) for node_type, values in result["reloaded"])
    assert drawn["maskState"] in saved["H3_MaskDraw"] and placed["prompts"] in saved["H3_TrackMask"]
    after = result["afterReload"]
    assert after["maskState"] == drawn["maskState"] and after["prompts"] == placed["prompts"]
    assert after["previewState"] == drawn["previewState"] and after["summary"] == placed["summary"]
    assert result["reopened"] == {"current": placed["prompts"], "objects": [1, 2]}

    # graphToPrompt carries both.
    output = result["prompt"]["output"]
    assert output[result["prompt"]["drawId"]]["inputs"]["mask_state"] == drawn["maskState"]
    assert output[result["prompt"]["trackId"]]["inputs"]["prompts"] == placed["prompts"]
    return drawn["maskState"], placed["prompts"]


def test_video_editor_in_the_classic_canvas_and_run(comfy, clip, tmp_path):
    result = _drive(comfy, clip, tmp_path, vue_nodes=False, run=True)
    mask_state, prompts = _check(result)
    queued = result["queued"]
    assert queued["status"] == 200 and not queued["reply"]["node_errors"], queued["reply"]
    sent = queued["sent"]
    draw_id, track_id = result["prompt"]["drawId"], result["prompt"]["trackId"]
    assert sent[draw_id]["inputs"]["mask_state"] == mask_state  # the Run button's POST carries the stroke ...
    assert sent[track_id]["inputs"]["prompts"] == prompts  # ... and the clicks
    assert sent[draw_id]["inputs"]["mask"] == [track_id, 0]
    entry = comfy.wait_for_prompt(queued["reply"]["prompt_id"])
    assert entry["status"]["status_str"] == "success", comfy.why(json.dumps(entry["status"])[-4000:])
    server_prompt = entry["prompt"][2]
    assert server_prompt[draw_id]["inputs"]["mask_state"] == mask_state
    assert server_prompt[track_id]["inputs"]["prompts"] == prompts
    preview_id = next(k for k, v in sent.items() if v["class_type"] == "H3_MaskPreview")
    assert entry["outputs"][preview_id]["images"], entry["outputs"]


def test_video_editor_in_the_vue_node_renderer(comfy, clip, tmp_path):
    _check(_drive(comfy, clip, tmp_path, vue_nodes=True, run=False))
