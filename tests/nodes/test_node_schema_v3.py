"""The nodes as ComfyUI V3 nodes (comfyui_h3/node_schema_v3.py): built from each node's one declaration, serving the
same node IDs, inputs, widget order, ranges, choices, defaults, tooltips, outputs and validation as the V1 classes.

The CPU tests cover the choice of API and the validation-argument rule without a ComfyUI; the lane tests (COMFYUI_DIR)
build every node with the real `comfy_api.latest`, compare it with its declaration, and run a prompt on a server that
serves the V1 classes (COMFYUI_H3_NODE_API=v1) next to the default V3 one."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
import uuid

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, combo_choices
from repo_paths import REPO



def test_v1_is_chosen_without_comfy_api_or_when_asked(monkeypatch):
    from comfyui_h3 import node_schema_v3

    monkeypatch.delenv("COMFYUI_H3_NODE_API", raising=False)
    monkeypatch.setitem(sys.modules, "comfy_api", None)  # no ComfyUI here (an older one has no comfy_api either)
    assert node_schema_v3.v3_io() is None
    latest = types.ModuleType("comfy_api.latest")
    latest.io = types.SimpleNamespace(ComfyNode=object, Schema=object, Custom=object, Combo=object, Hidden=object)
    latest.ComfyExtension = object
    monkeypatch.setitem(sys.modules, "comfy_api", types.ModuleType("comfy_api"))
    monkeypatch.setitem(sys.modules, "comfy_api.latest", latest)
    assert node_schema_v3.v3_io() == (latest.io, object)
    monkeypatch.setenv("COMFYUI_H3_NODE_API", "v1")
    assert node_schema_v3.v3_io() is None
    latest.io = types.SimpleNamespace(ComfyNode=object)  # a partial V3 API (an early 0.3.x): V1
    monkeypatch.delenv("COMFYUI_H3_NODE_API")
    assert node_schema_v3.v3_io() is None


def test_v3_validation_names_the_same_inputs_as_the_declaration():
    """ComfyUI leaves the range / choice check of the inputs a validation function names to that function
    (inspect.getfullargspec), so the V3 node's must name exactly the declaration's, and return what it returns."""
    from comfyui_h3.node_schema_v3 import _same_arguments
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    checked = 0
    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        for v1_name in ("VALIDATE_INPUTS", "IS_CHANGED"):
            if not hasattr(cls, v1_name):
                continue
            v1 = getattr(cls, v1_name)
            v3 = type("V3", (), {"f": classmethod(_same_arguments(v1))}).f
            assert inspect.getfullargspec(v3) == inspect.getfullargspec(v1), (node_id, v1_name)
            checked += 1
    assert checked >= 8
    loader = NODE_CLASS_MAPPINGS["H3_ModelLoader"]
    v3 = type("V3", (), {"f": classmethod(_same_arguments(loader.VALIDATE_INPUTS))}).f
    assert v3(device="cpu") == loader.VALIDATE_INPUTS(device="cpu") is True
    assert v3(device="gpu9") == loader.VALIDATE_INPUTS(device="gpu9") != True  # noqa: E712 - a message


_CHECK = textwrap.dedent("""
    import asyncio, importlib.util, inspect, json, sys
    sys.path.insert(0, ".")
    spec = importlib.util.spec_from_file_location("custom_nodes.comfyui-h3", sys.argv[1] + "/__init__.py",
                                                  submodule_search_locations=[sys.argv[1]])
    pack = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pack
    spec.loader.exec_module(pack)
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS as V1
    report = {"v1_mappings": sorted(pack.NODE_CLASS_MAPPINGS or []), "entrypoint": hasattr(pack, "comfy_entrypoint"),
              "nodes": {}}
    if report["entrypoint"]:
        for node in asyncio.run(pack.comfy_entrypoint().get_node_list()):
            info = node.GET_NODE_INFO_V1()
            v1 = V1[info["name"]]
            args = {}
            for v3_name, v1_name in (("validate_inputs", "VALIDATE_INPUTS"), ("fingerprint_inputs", "IS_CHANGED")):
                if hasattr(v1, v1_name):
                    args[v1_name] = [inspect.getfullargspec(getattr(node, v3_name)).args,
                                     inspect.getfullargspec(getattr(v1, v1_name)).args]
            report["nodes"][info["name"]] = {"info": info, "declared": v1.INPUT_TYPES(), "args": args,
                                             "v1": {"RETURN_TYPES": list(v1.RETURN_TYPES),
                                                    "RETURN_NAMES": list(getattr(v1, "RETURN_NAMES", None)
                                                                         or v1.RETURN_TYPES),
                                                    "OUTPUT_NODE": bool(getattr(v1, "OUTPUT_NODE", False)),
                                                    "CATEGORY": v1.CATEGORY, "DESCRIPTION": v1.DESCRIPTION},
                                             "base": [c.__name__ for c in type.mro(node)]}
    print("REPORT " + json.dumps(report, default=str))
""")


def _pack_as_comfyui_loads_it(**env) -> dict:
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    run = subprocess.run([python, "-c", _CHECK, str(REPO)], cwd=COMFYUI_DIR, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, **env))
    assert run.returncode == 0, run.stderr[-4000:]
    line = [x for x in run.stdout.splitlines() if x.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


def _served(spec: list) -> tuple:
    """An input as /object_info serves it, combos as their choice list and V3's explicit defaults dropped
    (a single-line string, a single-choice combo), so V1 and V3 specs compare."""
    options = dict(spec[1]) if len(spec) > 1 else {}
    kind = combo_choices(spec) if spec[0] == "COMBO" or isinstance(spec[0], list) else spec[0]
    options.pop("options", None) if spec[0] == "COMBO" else None
    for key in ("multiline", "multiselect"):
        if options.get(key) is False:
            del options[key]
    return json.dumps([kind, options], sort_keys=True, default=str)


@pytest.mark.slow
@pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)
def test_every_node_is_a_v3_node_equal_to_its_declaration():
    report = _pack_as_comfyui_loads_it(COMFYUI_H3_NODE_API="")
    assert report["entrypoint"] and report["v1_mappings"] == [], "the pack did not offer its V3 entry point"
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    assert set(report["nodes"]) == set(NODE_CLASS_MAPPINGS)
    for node_id, node in report["nodes"].items():
        info, declared, v1 = node["info"], node["declared"], node["v1"]
        assert "ComfyNode" in node["base"], node["base"]
        for section in ("required", "optional"):
            want = declared.get(section) or {}
            assert info["input_order"].get(section, []) == list(want), (node_id, section)  # the saved widget order
            for name, spec in want.items():
                assert _served(info["input"][section][name]) == _served(json.loads(json.dumps(spec))), (node_id, name)
        assert set(info["input"].get("hidden") or {}) >= set(declared.get("hidden") or {}), node_id
        assert info["output"] == v1["RETURN_TYPES"] and info["output_name"] == v1["RETURN_NAMES"], node_id
        assert info["output_node"] == v1["OUTPUT_NODE"] and info["category"] == v1["CATEGORY"], node_id
        assert info["description"] == v1["DESCRIPTION"] and info["display_name"] == NODE_DISPLAY_NAME_MAPPINGS[node_id]
        for v1_name, (v3_args, v1_args) in node["args"].items():
            assert v3_args == v1_args, (node_id, v1_name)
    v1_report = _pack_as_comfyui_loads_it(COMFYUI_H3_NODE_API="v1")
    assert not v1_report["entrypoint"] and v1_report["v1_mappings"] == sorted(NODE_CLASS_MAPPINGS)


_MASK_PROMPT = {
    "1": {"class_type": "H3_LoadVideo", "inputs": {
        "video": "h3_schema_clip.mp4", "force_rate": 24.0, "skip_first_frames": 0, "frame_load_cap": 0,
        "select_every_nth": 1, "max_seconds": 0.0, "resize": "target size", "fit": "crop", "width": 64,
        "height": 48, "audio_sample_rate": "keep"}},
    "2": {"class_type": "H3_MaskDraw", "inputs": {
        "video": ["1", 0], "grow": 3, "feather": 0, "invert": False,
        "mask_state": '{"version": 1, "width": 64, "height": 48, "keyframes": [{"frame": 0, "shapes": '
                      '[{"id": "r", "type": "rect", "x": 10, "y": 10, "w": 20, "h": 12}]}]}'}},
    "3": {"class_type": "H3_MaskPreview", "inputs": {"video": ["1", 0], "mask": ["2", 0], "color": "red",
                                                     "opacity": 0.5}},
}


def _run_mask_prompt(server) -> tuple[dict, dict]:
    import numpy as np

    from comfyui_h3.backend.media.encode import Mp4Writer

    frames = np.zeros((12, 48, 64, 3), np.uint8)
    frames[..., 1] = np.arange(12, dtype=np.uint8)[:, None, None] * 16
    with Mp4Writer(str(server.input_dir / "h3_schema_clip.mp4"), 64, 48, 24) as writer:
        writer.write_frames(frames)
    status, body = server.request("/prompt", {"prompt": _MASK_PROMPT, "client_id": uuid.uuid4().hex})
    assert status == 200, server.why(str(body))
    entry = server.wait_for_prompt(body["prompt_id"])
    assert entry["status"]["status_str"] == "success", server.why(str(entry["status"]))
    bad = dict(_MASK_PROMPT, **{"2": dict(_MASK_PROMPT["2"], inputs=dict(_MASK_PROMPT["2"]["inputs"], grow=10 ** 9))})
    refused = server.request("/prompt", {"prompt": bad})
    assert refused[0] == 400 and "grow" in json.dumps(refused[1]), refused  # the declared range, checked by ComfyUI
    info = server.request("/object_info")[1]
    return entry["outputs"], {name: info[name] for name in ("H3_LoadVideo", "H3_MaskDraw", "H3_MaskPreview")}


@pytest.mark.slow
@pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)
def test_a_prompt_runs_the_same_on_the_v1_and_the_v3_nodes(tmp_path, monkeypatch):
    """One ComfyUI serving the V3 nodes (the default) and one serving the V1 classes: the same prompt succeeds on
    both with the same outputs (the preview's file list: names and types), a value out of the declared range is
    refused by both, and /object_info lists the same inputs in the same order."""
    from comfyui_lane import running_comfyui

    served = {}
    for api in ("v3", "v1"):
        monkeypatch.setenv("COMFYUI_H3_NODE_API", "" if api == "v3" else "v1")
        (tmp_path / api).mkdir()
        with running_comfyui(tmp_path / api) as server:
            served[api] = _run_mask_prompt(server)
    (v3_out, v3_info), (v1_out, v1_info) = served["v3"], served["v1"]
    assert sorted(v3_out) == sorted(v1_out) == ["3"]
    shape = [(sorted(k for k in item), item.get("type")) for item in v1_out["3"].get("images", [])]
    assert shape and shape == [(sorted(k for k in item), item.get("type")) for item in v3_out["3"].get("images", [])]
    for name, node in v1_info.items():
        for section in ("required", "optional"):  # V3 adds prompt / extra_pnginfo to an output node's hidden ones
            assert node["input_order"].get(section) == v3_info[name]["input_order"].get(section), (name, section)
        for section, inputs in node["input"].items():
            if section == "hidden":
                continue
            for key, spec in inputs.items():
                assert _served(spec) == _served(v3_info[name]["input"][section][key]), (name, key)
