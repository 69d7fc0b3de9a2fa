"""What a ComfyUI user meets first, in a real ComfyUI (the integration lane: tests/comfyui_lane.py; skipped without
COMFYUI_DIR): the shipped workflows' sample inputs are in a fresh input folder; out-of-range widget values are refused
at queue time, never run."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, TEMPLATES, WORKFLOWS
from headless import NEEDS_BROWSER, run_script

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)


def test_sample_inputs_appear_in_a_fresh_input_folder(comfy):
    from comfyui_h3.install_samples import SAMPLE_DIR, SAMPLE_FILES

    for name in SAMPLE_FILES:  # the fixture's input folder starts empty: the pack copied them when it loaded
        path = comfy.input_dir / name
        assert path.is_file(), comfy.why(f"{name} is not in ComfyUI's input folder {comfy.input_dir}")
        assert path.read_bytes() == (Path(SAMPLE_DIR) / name).read_bytes(), name
        assert f"copied the sample input {name}" in comfy.log(200000), comfy.why("no log line for the copy")


def _queue(comfy, prompt: dict):
    return comfy.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})


def _node(prompt: dict, class_type: str) -> str:
    return next(node_id for node_id, node in prompt.items() if node["class_type"] == class_type)


@pytest.mark.parametrize("name,value,error", [
    ("grow", -100000, "value_smaller_than_min"),  # once allocated ~20 GB and took ComfyUI down
    ("grow", 5000, "value_bigger_than_max"),
    ("feather", 5000, "value_bigger_than_max"),
    ("feather", -1, "value_smaller_than_min"),
    ("combine", "xor", "value_not_in_list"),
])
def test_out_of_range_mask_draw_values_get_a_400(comfy, name, value, error):
    prompt = json.loads((WORKFLOWS / "h3_object_removal.api.json").read_text())
    draw = _node(prompt, "H3_MaskDraw")
    bad = copy.deepcopy(prompt)
    bad[draw]["inputs"][name] = value
    status, reply = _queue(comfy, bad)
    assert status == 400, (status, reply)
    errors = reply["node_errors"][draw]["errors"]
    assert [(e["type"], e["extra_info"]["input_name"]) for e in errors] == [(error, name)], errors
    status, queue = comfy.request("/queue")
    assert status == 200 and not queue["queue_running"] and not queue["queue_pending"]


def needs_browser(test):
    for mark in NEEDS_BROWSER:
        test = mark(test)
    return test


def _browser(comfy, tmp_path, checks: dict) -> dict:
    """Run tests/js/comfyui_hardening_check.mjs with these checks ({name: config}) against `comfy`; what it saw."""
    # A returning user: no first-run template browser over the canvas.
    settings = comfy.root / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    screenshot = tmp_path / "failure.png"
    config = {"url": comfy.url, "checks": list(checks), "screenshot": str(screenshot), **checks}
    run = run_script("comfyui_hardening_check.mjs", json.dumps(config), timeout=300)
    try:
        result = json.loads(run.stdout)
    except ValueError:
        pytest.fail(comfy.why(f"no JSON from the browser script (exit {run.returncode}):\n{run.stderr[-3000:]}"))
    assert run.returncode == 0 and "error" not in result, comfy.why(
        f"browser script failed (screenshot: {screenshot}):\n{result.get('error')}\n{run.stderr[-3000:]}")
    assert not result["pageErrors"], result["pageErrors"]
    return result


@needs_browser
def test_mask_draw_says_in_the_node_why_it_shows_no_frames(comfy, tmp_path):
    seen = _browser(comfy, tmp_path, {"maskStatus": {"workflow": str(TEMPLATES / "h3_object_removal.json")}})
    status = seen["maskStatus"]
    assert status["withFrames"]["frameCount"] == 130 and not status["withFrames"]["visible"], status
    missing = status["missingFile"]
    assert missing["visible"] and missing["text"].startswith("No frames to show:") and "no_such_clip.mp4" in missing["text"]
    unlinked = status["unlinked"]
    assert unlinked["visible"] and "connect an H3 Load Video" in unlinked["text"], unlinked
    assert all(view["fits"] for view in status.values()), "the editor spills out of its node"


@needs_browser
def test_the_template_browser_opens_every_template(comfy, tmp_path):
    """ComfyUI lists the pack's UI workflows (example_workflows/*.json) in its template browser: every card has its
    thumbnail, no API-format twin is listed, and each opens with all its nodes known and no error."""
    from comfyui_lane import LINK_NAME

    shipped = {path.stem: path for path in TEMPLATES.glob("*.json")}
    status, listed = comfy.request("/workflow_templates")
    assert status == 200 and sorted(listed[LINK_NAME]) == sorted(shipped), listed
    seen = _browser(comfy, tmp_path, {"templates": {"pack": LINK_NAME}})["templates"]
    assert sorted(card["name"] for card in seen["cards"]) == sorted(shipped)
    for card in seen["cards"]:
        assert card["thumbnail"] == {"width": 350, "height": 350, "complete": True}, card
    assert sorted(seen["opened"]) == sorted(shipped)
    for name, view in seen["opened"].items():
        nodes = json.loads(shipped[name].read_text())["nodes"]
        assert view["types"] == sorted(n["type"] for n in nodes), (name, view)
        assert not view["unknown"] and not view["withErrors"], (name, view)
        assert not view["dialogs"] and not view["errors"], (name, view)
