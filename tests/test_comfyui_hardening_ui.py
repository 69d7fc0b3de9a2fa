"""What a ComfyUI user meets first, in a real ComfyUI (the integration lane: tests/comfyui_lane.py; skipped without
COMFYUI_DIR): out-of-range widget values are refused at queue time, never run."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, WORKFLOWS

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)


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
