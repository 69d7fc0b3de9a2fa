"""Run an API-format workflow of this pack's nodes without ComfyUI (`python -m comfyui_h3 run`).

API format: {node_id: {"class_type": str, "inputs": {name: literal | [source_node_id, output_index]}}}. The whole
workflow is checked first exactly as ComfyUI checks a queued prompt (workflow_validation.py: types, ranges, choices,
links, VALIDATE_INPUTS), so nothing runs (no model loads) when an input is wrong; then the output nodes and what they
need run once each, in dependency order, as ComfyUI calls them (FUNCTION with the declared inputs, converted to their
types, hidden inputs filled in). Only the pack's nodes are available here; a workflow that uses core nodes runs in
ComfyUI (`--server`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

from .workflow_validation import WorkflowError, check_override, declared_inputs, is_link, validate_workflow

__all__ = ["WorkflowError", "apply_overrides", "execute", "load_workflow", "planned_nodes"]


def load_workflow(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkflowError(f"Workflow file not found: {path}") from None
    except ValueError as exc:
        raise WorkflowError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and "nodes" in data and "links" in data:
        raise WorkflowError(f"{path} is a UI-format workflow; use its .api.json sibling (Export (API) in ComfyUI).")
    if not isinstance(data, dict) or not all(isinstance(v, dict) and "class_type" in v for v in data.values()):
        raise WorkflowError(f"{path} is not an API-format workflow ({{id: {{class_type, inputs}}}}).")
    return data


def _parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def apply_overrides(prompt: dict, assignments: list[str], node_classes: dict | None = None) -> dict:
    """`NODE_ID.INPUT=VALUE` (VALUE parsed as JSON when it is JSON, else kept as a string). With `node_classes`, the
    input must be one the node declares (values are checked with the whole workflow, by validate_workflow)."""
    prompt = copy.deepcopy(prompt)
    for item in assignments or []:
        target, sep, value = item.partition("=")
        node_id, dot, name = target.partition(".")
        if not sep or not dot or not name:
            raise WorkflowError(f"--set wants NODE_ID.INPUT=VALUE, got {item!r}.")
        if node_id not in prompt:
            raise WorkflowError(f"--set {item!r}: no node {node_id!r} in the workflow (nodes: {', '.join(prompt)}).")
        if node_classes is not None:
            check_override(prompt, node_id, name, node_classes)
        prompt[node_id].setdefault("inputs", {})[name] = _parse_value(value)
    return prompt


def _order(prompt: dict, roots: list[str]) -> list[str]:
    """The nodes `roots` need, each after its inputs."""
    order, state = [], {}

    def visit(node_id: str, trail: tuple):
        if state.get(node_id) == "done":
            return
        if node_id in trail:
            raise WorkflowError(f"The workflow has a cycle through node {node_id}.")
        if node_id not in prompt:
            raise WorkflowError(f"A link points to node {node_id!r}, which the workflow does not have.")
        for value in prompt[node_id].get("inputs", {}).values():
            if is_link(value):
                visit(value[0], trail + (node_id,))
        state[node_id] = "done"
        order.append(node_id)

    for node_id in roots:
        visit(node_id, ())
    return order


def planned_nodes(prompt: dict, node_classes: dict | None = None) -> list[str]:
    """The nodes `execute` would run, in its order (WorkflowError for a workflow it would refuse)."""
    if node_classes is None:
        from .registration import NODE_CLASS_MAPPINGS as node_classes
    prompt, outputs = validate_workflow(prompt, node_classes)
    return _order(prompt, outputs)


def execute(prompt: dict, node_classes: dict | None = None, on_node: Callable[[str, str], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> dict[str, dict]:
    """Check the workflow (WorkflowError before anything runs), then run its output nodes and what they need;
    returns {node_id: ui dict} for output nodes. `should_stop()` true before a node, or after the last one (a node
    that ignored the Stop, or finished its work before it saw it): H3Interrupted, and no later node runs (nothing
    is saved from a stopped run but what a node kept on its Stop)."""
    if node_classes is None:
        from .registration import NODE_CLASS_MAPPINGS as node_classes
    original = prompt
    prompt, outputs = validate_workflow(prompt, node_classes)
    results: dict[str, tuple] = {}
    ui_outputs: dict[str, dict] = {}
    for node_id in _order(prompt, outputs):
        _stop_if_asked(should_stop)
        spec = prompt[node_id]
        cls = node_classes[spec["class_type"]]
        declared = declared_inputs(cls)
        kwargs = {}
        for name, value in spec.get("inputs", {}).items():
            if name not in declared:
                continue  # ComfyUI drops inputs a node does not declare
            kwargs[name] = results[value[0]][value[1]] if is_link(value) else value
        for name, kind in cls.INPUT_TYPES().get("hidden", {}).items():
            kwargs[name] = {"UNIQUE_ID": node_id, "PROMPT": original, "EXTRA_PNGINFO": None}.get(kind)
        if on_node is not None:
            on_node(node_id, spec["class_type"])
        value = getattr(cls(), cls.FUNCTION)(**kwargs)
        if isinstance(value, dict):
            if getattr(cls, "OUTPUT_NODE", False):
                ui_outputs[node_id] = value.get("ui", {})
            value = tuple(value.get("result", ()))
        elif getattr(cls, "OUTPUT_NODE", False):
            ui_outputs[node_id] = {}
        results[node_id] = value
    _stop_if_asked(should_stop)
    return ui_outputs


def _stop_if_asked(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        from .comfy_services.errors import H3Interrupted

        raise H3Interrupted("Stopped by the user.")
