"""Run an API-format workflow of this pack's nodes without ComfyUI (`python -m comfyui_h3 run`).

API format: {node_id: {"class_type": str, "inputs": {name: literal | [source_node_id, output_index]}}}. Nodes run
once each, in dependency order, exactly as ComfyUI would call them (FUNCTION with the declared inputs, hidden
inputs filled in, VALIDATE_INPUTS checked first). Only the pack's nodes are available here; a workflow that uses
core nodes runs in ComfyUI (`--server`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable


class WorkflowError(ValueError):
    pass


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


def apply_overrides(prompt: dict, assignments: list[str]) -> dict:
    """`NODE_ID.INPUT=VALUE` (VALUE parsed as JSON when it is JSON, else kept as a string)."""
    prompt = copy.deepcopy(prompt)
    for item in assignments or []:
        target, sep, value = item.partition("=")
        node_id, dot, name = target.partition(".")
        if not sep or not dot or not name:
            raise WorkflowError(f"--set wants NODE_ID.INPUT=VALUE, got {item!r}.")
        if node_id not in prompt:
            raise WorkflowError(f"--set {item!r}: no node {node_id!r} in the workflow (nodes: {', '.join(prompt)}).")
        prompt[node_id].setdefault("inputs", {})[name] = _parse_value(value)
    return prompt


def _is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def _order(prompt: dict) -> list[str]:
    order, state = [], {}

    def visit(node_id: str, trail: tuple):
        if state.get(node_id) == "done":
            return
        if node_id in trail:
            raise WorkflowError(f"The workflow has a cycle through node {node_id}.")
        if node_id not in prompt:
            raise WorkflowError(f"A link points to node {node_id!r}, which the workflow does not have.")
        for value in prompt[node_id].get("inputs", {}).values():
            if _is_link(value):
                visit(value[0], trail + (node_id,))
        state[node_id] = "done"
        order.append(node_id)

    for node_id in prompt:
        visit(node_id, ())
    return order


def execute(prompt: dict, node_classes: dict | None = None,
            on_node: Callable[[str, str], None] | None = None) -> dict[str, dict]:
    """Run the workflow; returns {node_id: ui dict} for output nodes."""
    if node_classes is None:
        from .registration import NODE_CLASS_MAPPINGS as node_classes
    unknown = {v["class_type"] for v in prompt.values()} - set(node_classes)
    if unknown:
        raise WorkflowError(f"Not nodes of this pack: {', '.join(sorted(unknown))}. Run this workflow in ComfyUI "
                            "(python -m comfyui_h3 run WORKFLOW --server URL).")
    results: dict[str, tuple] = {}
    outputs: dict[str, dict] = {}
    for node_id in _order(prompt):
        spec = prompt[node_id]
        cls = node_classes[spec["class_type"]]
        declared = cls.INPUT_TYPES()
        kwargs = {}
        for name, value in spec.get("inputs", {}).items():
            if _is_link(value):
                source, index = value
                kwargs[name] = results[source][index]
            else:
                kwargs[name] = value
        missing = [n for n in declared.get("required", {}) if n not in kwargs]
        if missing:
            raise WorkflowError(f"Node {node_id} ({spec['class_type']}) is missing required inputs: {missing}.")
        if hasattr(cls, "VALIDATE_INPUTS"):
            literal = {k: v for k, v in spec.get("inputs", {}).items() if not _is_link(v)}
            verdict = cls.VALIDATE_INPUTS(**literal) if _accepts_any(cls.VALIDATE_INPUTS) else cls.VALIDATE_INPUTS(
                **{k: literal.get(k) for k in _params(cls.VALIDATE_INPUTS)})
            if verdict is not True:
                raise WorkflowError(f"Node {node_id} ({spec['class_type']}): {verdict}")
        for name, kind in declared.get("hidden", {}).items():
            kwargs[name] = {"UNIQUE_ID": node_id, "PROMPT": prompt, "EXTRA_PNGINFO": None}.get(kind)
        if on_node is not None:
            on_node(node_id, spec["class_type"])
        value = getattr(cls(), cls.FUNCTION)(**kwargs)
        if isinstance(value, dict):
            outputs[node_id] = value.get("ui", {})
            value = tuple(value.get("result", ()))
        results[node_id] = value
    return outputs


def _params(fn) -> list[str]:
    import inspect

    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _accepts_any(fn) -> bool:
    import inspect

    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
