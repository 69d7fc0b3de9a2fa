"""The mask editor (js/mask_canvas.js + js/mask_logic.js) in headless Chromium: a brush stroke drawn with the mouse is
saved in the state JSON and rasterised by Python as the browser's preview shows it. Needs chromium and the npm package
playwright-core (`npm ci` at the repo root); skipped otherwise."""

import json

import pytest
import torch
from headless import NEEDS_BROWSER, run_script

from comfyui_h3.backend.media.mask_raster import render_state

pytestmark = NEEDS_BROWSER


@pytest.mark.slow
def test_brush_stroke_is_saved_and_rasterised_the_same():
    run = run_script("browser_check.mjs")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    state = result["state"]
    assert (state["width"], state["height"]) == (200, 100)
    [keyframe] = state["keyframes"]
    assert keyframe["frame"] == 2
    [stroke] = keyframe["shapes"]
    assert stroke["type"] == "brush" and stroke["size"] == 10
    xs = [p[0] for p in stroke["points"]]
    assert abs(xs[0] - 40) < 2 and abs(xs[-1] - 160) < 2
    assert all(abs(p[1] - 50) < 2 for p in stroke["points"])
    py = render_state(state, 3, 100, 200)
    js = torch.tensor(result["mask"], dtype=torch.float32).reshape(100, 200)
    assert torch.equal(py[2], js)
    assert py[2, 50, 100] == 1 and py[2, 50, 20] == 0 and py[2, 40, 100] == 0
    assert py[2].sum() == pytest.approx(120 * 10 + 3.14159 * 25, rel=0.1)
    assert "keyframes: [2]" in result["label"]
