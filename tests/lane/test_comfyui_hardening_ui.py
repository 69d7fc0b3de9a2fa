"""What a ComfyUI user meets first, in a real ComfyUI (the integration lane: tests/comfyui_lane.py; skipped without
COMFYUI_DIR): the shipped workflows' sample inputs are in a fresh input folder; out-of-range widget values are refused
at queue time, never run, and each refusal is reported once, on its input; the template browser lists the shipped
templates in a newcomer's order and opens every one; the Mask Draw editor says why it shows no frames."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, TEMPLATES, WORKFLOWS, frontend_model_lookup
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


@pytest.mark.parametrize("workflow,class_type,name,value,message", [
    ("h3_text_to_video", "H3_Sample", "prompt", "  ", "prompt is empty"),  # was reported 4 times
    ("h3_object_removal", "H3_MaskDraw", "mask_state", "{oops", "not valid JSON"),  # was reported 6 times
    ("h3_object_removal", "H3_LoadVideo", "video", "no_such_clip.mp4", "Video not found"),  # was reported twice
    ("h3_object_removal", "H3_Edit", "prompt", "", "prompt is empty"),
])
def test_a_validation_error_is_reported_once_on_its_input(comfy, workflow, class_type, name, value, message):
    prompt = json.loads((WORKFLOWS / f"{workflow}.api.json").read_text())
    # Only the Save Video output: with a valid Mask Preview beside it, ComfyUI would queue the prompt and run that.
    prompt = {k: v for k, v in prompt.items() if v["class_type"] != "H3_MaskPreview"}
    node = _node(prompt, class_type)
    prompt[node]["inputs"][name] = value
    status, reply = _queue(comfy, prompt)
    assert status == 400, (status, reply)
    errors = reply["node_errors"][node]["errors"]
    assert len(errors) == 1 and errors[0]["extra_info"]["input_name"] == name, errors
    assert message in errors[0]["details"], errors


def needs_browser(test):
    for mark in NEEDS_BROWSER:
        test = mark(test)
    return test


def _registry_lookup(error: str) -> bool:
    """A blocked request to the node registry (the frontend asks it about a workflow's missing nodes)."""
    return "'https://api.comfy.org/" in error and "Content Security Policy" in error


def _browser(comfy, tmp_path, checks: dict, unknown_types: set | frozenset = frozenset(), timeout: int = 300) -> dict:
    """Run tests/js/comfyui_hardening_check.mjs with these checks ({name: config}) against `comfy`; what it saw.
    `unknown_types`: node types this ComfyUI lacks on purpose: a workflow with them makes the frontend look its nodes
    and packs up in the node registry (api.comfy.org/comfy-nodes/<type>/node, /nodes?node_id=...), which the lane's
    CSP blocks; those failed look-ups, and only those, are expected then."""
    # A returning user: no first-run template browser over the canvas.
    settings = comfy.root / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    screenshot = tmp_path / "failure.png"
    config = {"url": comfy.url, "checks": list(checks), "screenshot": str(screenshot), **checks}
    run = run_script("comfyui_hardening_check.mjs", json.dumps(config), timeout=timeout)
    try:
        result = json.loads(run.stdout)
    except ValueError:
        pytest.fail(comfy.why(f"no JSON from the browser script (exit {run.returncode}):\n{run.stderr[-3000:]}"))
    assert run.returncode == 0 and "error" not in result, comfy.why(
        f"browser script failed (screenshot: {screenshot}):\n{result.get('error')}\n{run.stderr[-3000:]}")
    errors = [e for e in result["pageErrors"]
              if not (unknown_types and _registry_lookup(e)) and not frontend_model_lookup(e)]
    assert not errors, errors
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

    from comfyui_h3.native_workflows import NATIVE_WORKFLOWS

    shipped = {path.stem: path for path in TEMPLATES.glob("*.json")}
    status, listed = comfy.request("/workflow_templates")
    assert status == 200 and sorted(listed[LINK_NAME]) == sorted(shipped), listed
    known = set(comfy.request("/object_info")[1])
    absent = {t for types in NATIVE_WORKFLOWS.values() for t in types} - known  # ComfyUI's own H3 nodes: 0.30+
    seen = _browser(comfy, tmp_path, {"templates": {"pack": LINK_NAME}}, absent)["templates"]
    assert sorted(card["name"] for card in seen["cards"]) == sorted(shipped)
    for card in seen["cards"]:
        assert card["thumbnail"] == {"width": 350, "height": 350, "complete": True}, card
    assert sorted(seen["opened"]) == sorted(shipped)
    for name, view in seen["opened"].items():
        nodes = json.loads(shipped[name].read_text())["nodes"]
        assert view["types"] == sorted(n["type"] for n in nodes), (name, view)
        # ComfyUI's own MiniMax-H3 nodes (0.30+) are unknown to an older lane ComfyUI: exactly those, nothing else
        missing = set(NATIVE_WORKFLOWS.get(name, ())) - known
        assert set(view["unknown"]) == missing, (name, view)
        # a node may be marked only for what this server lacks: its node type, or (frontend 1.58) a model file the
        # workflow names that is not in the lane's model folders (the native workflows' Comfy-Org single files)
        lacking = [node for node in view["absentValues"]
                   if not node["values"] or not all(str(value).endswith(MODEL_FILES) for _, value in node["values"])]
        assert not view["withErrors"] or missing or not lacking, (name, view["absentValues"])
        # the missing-nodes dialog, and the registry look-ups it makes (blocked in the lane), for exactly those
        assert (not view["dialogs"] or missing), (name, view["dialogs"], view["dialogHtml"])
        assert not [e for e in view["errors"]
                    if not (missing and _registry_lookup(e)) and not frontend_model_lookup(e)], (name, view)


@needs_browser
def test_the_template_browser_lists_the_cards_in_order(comfy, tmp_path):
    """The pack's cards in a newcomer's order (comfyui_h3/templates.py: text to video first, the native interop last),
    not ComfyUI's glob order: the listing the server answers (the pack's middleware) and the cards the browser shows."""
    from comfyui_lane import LINK_NAME

    from comfyui_h3.templates import CARDS

    declared = [card.name for card in CARDS]
    assert comfy.request("/workflow_templates")[1][LINK_NAME] == declared
    cards = _browser(comfy, tmp_path, {"templateOrder": {"pack": LINK_NAME}})["templateOrder"]
    assert [card["name"] for card in cards] == declared, cards


MODEL_FILES = (".safetensors", ".pt", ".pth", ".ckpt", ".gguf")  # a combo value naming a model file


def _overlapping(boxes: list) -> list:
    """Pairs of (name, [x, y, w, h]) boxes that overlap."""
    out = []
    for i, (a, (ax, ay, aw, ah)) in enumerate(boxes):
        for b, (bx, by, bw, bh) in boxes[i + 1:]:
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((a, b))
    return out


@needs_browser
@pytest.mark.parametrize("vue_nodes", [False, True], ids=["canvas", "vue-nodes"])
def test_shipped_workflows_lay_out_without_overlaps(comfy, tmp_path, vue_nodes):
    """At the sizes the real frontend gives the nodes (title bars included; the Vue renderer's own elements), no node
    of a shipped workflow covers another; and each is saved as big as its content asks, so the frontend does not
    grow it over its neighbours (it did: Load Video / Load Image over the Model Loader's executor and ray_address)."""
    from comfyui_h3.native_workflows import NATIVE_WORKFLOWS

    known = set(comfy.request("/object_info")[1])  # a ComfyUI without the native H3 nodes draws them as placeholders
    files = [f for f in sorted(TEMPLATES.glob("*.json")) if not set(NATIVE_WORKFLOWS.get(f.stem, ())) - known]
    # "playing": each output video node also shown as after a run, playing the shipped sample clip (Defect: H3 Save
    # Video's player drew past its node on frontend 1.58)
    seen = _browser(comfy, tmp_path, {"layout": {"workflows": [str(f) for f in files], "vueNodes": vue_nodes,
                                                 "playing": "h3_demo_source.mp4"}}, timeout=600)
    for path in files:
        nodes = seen["layout"][str(path)]
        key = "dom" if vue_nodes else "box"
        assert all(n[key] for n in nodes), (path.name, nodes)
        assert not _overlapping([(n["type"], n[key]) for n in nodes]), (path.name, [(n["type"], n[key]) for n in nodes])
        if not vue_nodes:
            # ids as strings: the saved JSON has ints, frontend 1.58 reports strings
            saved = {str(n["id"]): n["size"] for n in json.loads(path.read_text())["nodes"]}
            for n in nodes:
                assert saved[str(n["id"])][1] >= n["wants"][1] - 1, (path.name, n["type"], saved[str(n["id"])],
                                                                     n["wants"])
        played = seen["layout"].get(f"{path}#playing")
        if played is not None:
            # the Vue renderer draws the player from the message at once (the canvas one: after a real run, checked
            # in test_edit_shows_what_it_resolved_in_the_node)
            assert played["players"] or not vue_nodes, (path.name, "no player shown")
            assert all(p["fits"] for p in played["players"]), (path.name, played["players"])
            boxes = [(n["type"], n[key]) for n in played["boxes"]]
            assert not _overlapping(boxes), (path.name, "playing", boxes)


@needs_browser
def test_edit_shows_what_it_resolved_in_the_node(comfy, tmp_path):
    """H3 Edit's summary (the preset's grow / feather / audio, the edit size) appears in the node after a run (the
    tiny model, 1 step), inside the room the layout keeps for it."""
    seen = _browser(comfy, tmp_path, {"editSummary": {"workflow": str(TEMPLATES / "h3_object_removal.json"),
                                                      "steps": 1}})["editSummary"]
    assert seen["value"].startswith("preset removal: grow 40 px, feather 16 px, audio "), seen["value"]
    assert seen["onPage"], "the summary is not shown on the page"
    sizes = {n["type"]: n["size"] for n in seen["before"]}
    assert [n["size"] for n in seen["after"] if n["type"] == "H3_Edit"] == [sizes["H3_Edit"]], "H3 Edit grew"
    assert not _overlapping([(n["type"], n["box"]) for n in seen["after"]]), seen["after"]
    # H3 Save Video plays the result inside its node (the player drew past it on frontend 1.58)
    assert "H3_SaveVideo" in [p["type"] for p in seen["players"]], seen["players"]
    assert all(p["fits"] for p in seen["players"]), [p for p in seen["players"] if not p["fits"]]
