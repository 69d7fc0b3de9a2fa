"""`python -m comfyui_h3 run` checks a workflow as ComfyUI does before anything runs (comfyui_h3/workflow_validation.py):
types, ranges, choices, links, required inputs and VALIDATE_INPUTS, with ComfyUI's rule that the inputs a node's
VALIDATE_INPUTS names skip the built-in checks. CPU tests on small fake nodes and on the shipped workflows; the
ComfyUI lane compares the verdicts with a real ComfyUI's /prompt."""

from __future__ import annotations

import json

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI

from comfyui_h3.templates import workflows_dir
from comfyui_h3.workflow_runner import apply_overrides, execute, load_workflow
from comfyui_h3.workflow_validation import WorkflowError, validate_workflow

CALLS: list[str] = []


class Source:
    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1, "min": 0, "max": 10})}}

    def run(self, value):
        CALLS.append("Source")
        return (value,)


class Text(Source):
    RETURN_TYPES = ("STRING",)


class Sink:
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"number": ("NUMBER",), "mode": (["a", "b"],),
                             "scale": ("FLOAT", {"default": 1.0, "min": 0.5, "max": 2.0}),
                             "steps": ("INT", {"default": 3, "min": 1, "max": 5})},
                "optional": {"label": ("STRING", {"default": ""})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def run(self, number, mode, scale, steps, label="", unique_id=None):
        CALLS.append(("Sink", number, mode, scale, steps, label, unique_id))
        return {"ui": {"images": []}}


class SinkNamingSteps(Sink):
    seen: list = []

    @classmethod
    def VALIDATE_INPUTS(cls, steps, number=None, unique_id=None):
        cls.seen.append((steps, number, unique_id))
        return True if steps < 100 else f"steps {steps} is too many"


class SinkTakingAll(Sink):
    @classmethod
    def VALIDATE_INPUTS(cls, **kwargs):
        return True


NODES = {"Source": Source, "Text": Text, "Sink": Sink, "SinkNamingSteps": SinkNamingSteps, "SinkTakingAll": SinkTakingAll}


def _prompt(sink="Sink", **inputs):
    base = {"number": ["1", 0], "mode": "a", "scale": 1.0, "steps": 3}
    base.update(inputs)
    return {"1": {"class_type": "Source", "inputs": {"value": 2}},
            "2": {"class_type": sink, "inputs": {k: v for k, v in base.items() if v is not ...}}}


def _problems(prompt):
    with pytest.raises(WorkflowError) as info:
        validate_workflow(prompt, NODES)
    return {(nid, name) for nid, name, _ in info.value.problems}, str(info.value)


def test_built_in_checks_like_comfyui():
    assert _problems(_prompt(mode="c"))[0] == {("2", "mode")}
    assert _problems(_prompt(scale=3))[0] == {("2", "scale")}
    assert _problems(_prompt(steps=0))[0] == {("2", "steps")}
    assert _problems(_prompt(steps="abc"))[0] == {("2", "steps")}
    assert _problems(_prompt(steps=...))[0] == {("2", "steps")}  # required and missing
    assert _problems(_prompt(number=["1", 0, 0]))[0] == {("2", "number")}  # not a [node, output] link
    assert _problems(_prompt(number=["9", 0]))[0] == {("2", "number")}  # a node that is not there
    assert _problems(_prompt(number=["1", 3]))[0] == {("2", "number")}  # an output that is not there
    problems, text = _problems(_prompt(scale=float("nan")))
    assert problems == {("2", "scale")} and "finite" in text
    # A wrong value upstream fails the output that needs it; every problem is in the one-line message.
    wf = _prompt(mode="c")
    wf["1"]["inputs"]["value"] = 11
    problems, text = _problems(wf)
    assert problems == {("1", "value"), ("2", "mode")} and "\n" not in text
    # A link whose output type differs from the input's.
    wf = _prompt(number=["3", 0])
    wf["3"] = {"class_type": "Text", "inputs": {"value": 1}}
    problems, text = _problems(wf)
    assert problems == {("2", "number")} and "gives STRING" in text


def test_values_are_converted_and_unknown_inputs_dropped():
    prompt, outputs = validate_workflow(_prompt(steps="4", scale="1.5", label=7, extra="ignored"), NODES)
    assert outputs == ["2"]
    inputs = prompt["2"]["inputs"]
    assert inputs["steps"] == 4 and inputs["scale"] == 1.5 and inputs["label"] == "7"
    CALLS.clear()
    execute(_prompt(steps="4", extra="ignored"), NODES)
    assert CALLS == ["Source", ("Sink", 2, "a", 1.0, 4, "", "2")]


def test_inputs_named_by_validate_inputs_skip_the_built_in_checks():
    # steps is named: its range (max 5) is the node's business, as in ComfyUI; the other inputs are still checked.
    SinkNamingSteps.seen.clear()
    validate_workflow(_prompt("SinkNamingSteps", steps=50), NODES)
    assert SinkNamingSteps.seen == [(50, None, "2")]  # a linked input reaches VALIDATE_INPUTS as None
    problems, text = _problems(_prompt("SinkNamingSteps", steps=500, scale=9))
    assert problems == {("2", "scale"), ("2", None)} and "steps 500 is too many" in text
    # **kwargs: every input skips them (ComfyUI's rule; the reason H3 nodes must not take **kwargs).
    validate_workflow(_prompt("SinkTakingAll", steps=500, mode="zzz", scale=9), NODES)
    assert _problems(_prompt("SinkTakingAll", steps="abc"))[0] == {("2", "steps")}  # types still are


def test_nothing_runs_when_the_workflow_is_invalid():
    CALLS.clear()
    with pytest.raises(WorkflowError):
        execute(_prompt(mode="c"), NODES)
    assert CALLS == []
    with pytest.raises(WorkflowError, match="no output node"):
        execute({"1": {"class_type": "Source", "inputs": {"value": 2}}}, NODES)
    # Only what the outputs need runs (ComfyUI's rule): a dangling node is neither checked nor run.
    wf = _prompt()
    wf["3"] = {"class_type": "Source", "inputs": {"value": 99}}
    CALLS.clear()
    execute(wf, NODES)
    assert CALLS.count("Source") == 1


def test_set_refuses_inputs_a_node_does_not_have():
    with pytest.raises(WorkflowError, match=r"node 2 \(Sink\) has no input 'stepz'.*steps"):
        apply_overrides(_prompt(), ["2.stepz=3"], NODES)
    assert apply_overrides(_prompt(), ["2.steps=4"], NODES)["2"]["inputs"]["steps"] == 4


BAD_EDITS = [  # (workflow, --set items): each must be refused by ComfyUI and by `run`, on the same node and input
    ("h3_text_to_video", ["3.preset=\"bogus\""]),
    ("h3_text_to_video", ["3.crf=99"]),
    ("h3_text_to_video", ["2.steps=\"abc\""]),
    ("h3_text_to_video", ["2.steps=0", "3.fps=0"]),
    ("h3_text_to_video", ["1.dtype=\"float8\""]),
    ("h3_text_to_video", ["2.seconds=99"]),
    ("h3_text_to_video", ["3.video=[\"2\", 7]"]),
    ("h3_generate_then_upscale", ["4.batch_frames=6"]),  # SeedVR2 Upscale's own check: 0 or 4n+1
    ("h3_generate_then_upscale", ["4.batch_frames=5000", "4.scale=99"]),
    ("h3_generate_then_upscale", ["3.variant=\"9b\"", "4.target=\"double\""]),
]


@pytest.mark.parametrize("name,sets", BAD_EDITS)
def test_shipped_workflow_edits_are_refused_before_running(name, sets):
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    prompt = apply_overrides(load_workflow(workflows_dir() / f"{name}.api.json"), sets, NODE_CLASS_MAPPINGS)
    with pytest.raises(WorkflowError) as info:
        validate_workflow(prompt, NODE_CLASS_MAPPINGS)
    nodes = {item.split(".")[0] for item in sets}
    assert {nid for nid, _, _ in info.value.problems} == nodes


@pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)
def test_verdicts_equal_a_real_comfyui(comfy):
    """The same edited workflows, POSTed to a real ComfyUI: it refuses each on the nodes and inputs `run` names (an
    error of a node's own VALIDATE_INPUTS is listed by ComfyUI once per input it names). A workflow with another
    output that still validates (h3_generate_then_upscale previews the H3 clip before upscaling) is queued by ComfyUI
    for that output alone (200, with the same node_errors); `run` refuses it whole: a partial result from a typo
    helps no one."""
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    for name, sets in BAD_EDITS:
        prompt = apply_overrides(load_workflow(workflows_dir() / f"{name}.api.json"), sets, NODE_CLASS_MAPPINGS)
        with pytest.raises(WorkflowError) as info:
            validate_workflow(prompt, NODE_CLASS_MAPPINGS)
        ours = info.value.problems
        status, body = comfy.request("/prompt", {"prompt": json.loads(json.dumps(prompt))})
        assert status == 400 or (status == 200 and body.get("node_errors")), comfy.why(
            f"{sets}: ComfyUI accepted what run refuses: {body}")
        theirs = body["node_errors"]
        assert set(theirs) == {nid for nid, _, _ in ours}, (sets, theirs, ours)
        for nid, input_name, _ in ours:
            named = {e.get("extra_info", {}).get("input_name") for e in theirs[nid]["errors"]}
            # (an exception inside ComfyUI's own check, e.g. a link to a missing output, names no input)
            assert input_name is None or input_name in named or named == {None}, (sets, nid, theirs[nid])
