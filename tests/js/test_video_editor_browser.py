"""The full-size video editor (js/mask_dialog.js) on a bare page in headless Chromium, worked with the mouse and the
keyboard (tests/js/video_editor_check.mjs): the dialog fills the window, scrubbing, the brush size as a number and a
cursor ring, a stroke saved in the mask_state JSON, undo / redo, zoom and pan keeping doc coordinates exact, onion
skins of the neighbouring keyframes, tint and opacity, play / pause; in prompts mode clicks + / -, a box, a second
object and removal, written in the Track Mask prompts JSON in source-video pixels. Needs chromium and playwright-core
(`npm ci`); skipped otherwise."""

import json

import pytest
from headless import NEEDS_BROWSER, run_script

pytestmark = NEEDS_BROWSER


@pytest.fixture(scope="module")
def seen():
    run = run_script("video_editor_check.mjs", timeout=120)
    try:
        result = json.loads(run.stdout)
    except ValueError:
        pytest.fail(f"no JSON from the browser script (exit {run.returncode}):\n{run.stderr[-3000:]}")
    assert run.returncode == 0 and "error" not in result, f"{result.get('error')}\n{run.stderr[-3000:]}"
    assert not result["pageErrors"], result["pageErrors"]
    return result


def _doc_under(view: dict, page_xy) -> tuple[float, float]:
    v, box = view["view"], view["canvasBox"]
    return ((page_xy[0] - box[0] - v["ox"]) / v["scale"], (page_xy[1] - box[1] - v["oy"]) / v["scale"])


@pytest.mark.slow
def test_dialog_fills_the_window_and_scrubs(seen):
    opened = seen["maskOpened"]
    assert opened["overlayBox"] == [0, 0, *opened["window"]]
    _, _, width, height = opened["canvasBox"]
    assert width > 0.9 * opened["window"][0] and height > 0.6 * opened["window"][1], opened["canvasBox"]
    assert opened["frameShown"] is True and opened["label"].startswith("frame 0 / 29")
    # a 320 x 180 frame is shown as large as the viewport allows
    assert opened["view"]["scale"] == pytest.approx(min((width - 24) / 320, (height - 24) / 180))
    assert seen["scrubbed"]["frame"] == 5 and seen["scrubbed"]["scrubber"] == "5" and seen["scrubbed"]["frameShown"]


def test_brush_size_number_and_cursor_ring(seen):
    ring = seen["ring"]
    assert ring["size"] == 20 and ring["sizeBox"] == "20"
    assert min(ring["onRing"]) > max(ring["inside"]) + 40, ring  # a light ring drawn at radius size / 2 (doc px)


def test_stroke_lands_in_the_state_and_undo_redo_walk_it(seen):
    state = json.loads(seen["stroke"]["last"])
    assert (state["width"], state["height"]) == (320, 180)
    [keyframe] = state["keyframes"]
    assert keyframe["frame"] == 5
    [stroke] = keyframe["shapes"]
    assert stroke["type"] == "brush" and stroke["size"] == 20
    xs = [p[0] for p in stroke["points"]]
    assert xs[0] == pytest.approx(40, abs=0.5) and xs[-1] == pytest.approx(280, abs=0.5)
    assert all(p[1] == pytest.approx(90, abs=0.5) for p in stroke["points"])
    on, off = seen["strokePixel"]["on"], seen["strokePixel"]["off"]
    assert on[0] > on[1] + 60 and off[0] == off[1] == off[2], seen["strokePixel"]  # red tint on the stroke only
    assert seen["undone"]["last"] == "" and not seen["undone"]["undo"] and seen["undone"]["redo"]  # back to the original
    assert seen["undone"]["label"].endswith("0 shapes")
    assert seen["redone"]["last"] == seen["stroke"]["last"] and not seen["redone"]["redo"]


def test_zoom_and_pan_keep_doc_coordinates_exact(seen):
    before, zoomed, panned = seen["stroke"], seen["zoomed"], seen["panned"]
    assert zoomed["view"]["scale"] > 1.5 * before["view"]["scale"]
    assert zoomed["zoomLabel"] == f"{round(zoomed['view']['scale'] * 100)}%"
    # the point under the wheel stays there (the pointer sat on whole pixels: 80, 45 to within half a pixel)
    x, y = _doc_under(zoomed, zoomed["pointer"])
    x0, y0 = _doc_under(before, zoomed["pointer"])
    assert (x, y) == (pytest.approx(x0, abs=1e-6), pytest.approx(y0, abs=1e-6))
    assert (x, y) == (pytest.approx(80, abs=0.5 / before["view"]["scale"]), pytest.approx(45, abs=0.5 / before["view"]["scale"]))
    assert panned["view"]["scale"] == zoomed["view"]["scale"]
    assert panned["view"]["ox"] - zoomed["view"]["ox"] == pytest.approx(-120, abs=1)
    assert panned["view"]["oy"] - zoomed["view"]["oy"] == pytest.approx(-60, abs=1)
    rect = json.loads(seen["zoomRect"]["last"])["keyframes"][0]["shapes"][1]
    assert rect["type"] == "rect"
    for key, want in zip("xywh", (60, 30, 50, 40)):
        assert rect[key] == pytest.approx(want, abs=0.3), rect


def test_onion_skin_tint_and_play(seen):
    onion, off = seen["onion"], seen["onionOff"]
    assert onion["frame"] == 8
    after = onion["after"]  # the ellipse exists only on keyframe 12: a yellow ghost on frame 8
    assert after[0] > after[2] + 30 and after[1] > after[2] + 30, onion
    assert off["after"] == onion["none"]  # onion off: the bare frame there
    assert onion["before"] != off["before"]  # keyframe 5's ghost over the held stroke
    assert seen["tinted"]["on"] == [0, 255, 0]  # green at full opacity
    assert seen["played"]["frame"] >= 8 and not seen["played"]["playing"]
    assert seen["space"] == {"plays": True, "paused": True, "changes": 1}  # Space played; the undo ran once


def test_a_stroke_started_while_playing_stays_on_its_frame(seen):
    view = seen["playStroke"]
    assert not view["playing"]  # the stroke paused playback
    state = json.loads(view["last"])
    [keyframe] = [kf for kf in state["keyframes"] if kf["frame"] == view["frame"]]
    stroke = keyframe["shapes"][-1]
    assert stroke["type"] == "brush" and stroke["points"][0] == [20, 20]
    assert stroke["points"][-1] == pytest.approx([60, 20], abs=0.5)
    others = [kf for kf in state["keyframes"] if kf["frame"] != view["frame"]]
    assert all(s["points"][0] != [20, 20] for kf in others for s in kf["shapes"] if s["type"] == "brush")
    assert seen["maskClosed"]["closed"] and seen["maskClosed"]["overlay"] == 0


def test_prompt_tools_write_the_contract_json(seen):
    prompts = json.loads(seen["promptsPlaced"]["last"])
    assert prompts["version"] == 1
    one, two = prompts["objects"]
    assert one["id"] == 1 and two["id"] == 2
    assert [(p["frame"], p["positive"]) for p in one["points"]] == [(0, True), (0, False)]
    assert [(p["x"], p["y"]) for p in one["points"]] == [(pytest.approx(100, abs=0.5), pytest.approx(100, abs=0.5)),
                                                          (pytest.approx(150, abs=0.5), pytest.approx(120, abs=0.5))]
    [box] = one["boxes"]  # a bare click with the box tool added nothing
    assert box["frame"] == 3
    for key, want in zip(("x0", "y0", "x1", "y1"), (200, 50, 400, 300)):
        assert box[key] == pytest.approx(want, abs=0.5), box
    [click] = two["points"]  # the click off the frame was not placed
    assert (click["frame"], click["positive"]) == (3, True) and two["boxes"] == []
    assert (click["x"], click["y"]) == (pytest.approx(520, abs=0.5), pytest.approx(200, abs=0.5))
    assert seen["objects"] == ["1", "2"]
    assert "frame 3 / 19" in seen["promptsPlaced"]["label"]
    removed = json.loads(seen["removed"]["last"])["objects"][0]["points"]
    assert [p["positive"] for p in removed] == [True]  # the negative click was the nearest
    assert seen["restored"]["last"] == seen["promptsPlaced"]["last"]  # undo brings it back
    assert seen["onionKept"] is False  # onion on / off is a preference the next dialog keeps
    ghost = seen["promptOnion"]
    assert ghost["box"][0] > ghost["box"][1] + 40, ghost  # frame 3's box, dashed, on frame 0
    assert seen["promptsClosed"]["closed"] and seen["promptsClosed"]["overlay"] == 0


def test_prompts_without_a_video_say_why_and_place_nothing(seen):
    no_video = seen["noVideo"]
    assert no_video["warn"] and no_video["changes"] == 0
    assert "connect an H3 Load Video" in no_video["status"] and "need the video's frames" in no_video["status"]
