"""Check an API-format workflow the way ComfyUI's `validate_prompt` does, before anything runs (`python -m comfyui_h3
run`), so a workflow that ComfyUI would refuse is refused here too, with the same rules:

- Only output nodes (OUTPUT_NODE = True) and what they depend on are checked (and run); a workflow without one fails.
- Every declared input (required + optional) of those nodes: a missing required input, a link that is not
  [node_id, output_index] or whose output type does not match, and a literal that does not convert to its type
  (INT -> int, FLOAT -> float, STRING -> str, BOOLEAN -> bool; `{"__value__": v}` unwrapped) are errors. The converted
  value is what the node gets.
- min / max and the choices of a list (combo) input are checked, except for the inputs the node's VALIDATE_INPUTS names
  (all of them when it takes **kwargs): ComfyUI leaves those to the node.
- VALIDATE_INPUTS gets the literal inputs it names (linked ones as None, hidden UNIQUE_ID / PROMPT filled in); anything
  but True is an error.
- Inputs a node does not declare are ignored (ComfyUI drops them); `--set` refuses them up front (see check_override).

One deliberate difference: every error of every output fails the whole run (ComfyUI would run the outputs that
passed), since a partial run from the command line is a surprise rather than a convenience. A FLOAT that is NaN or
infinite is refused too (ComfyUI lets it reach the node).
"""

from __future__ import annotations

import copy
import inspect
import math

ANY_TYPE = "*"
COMBO_TYPE = "COMBO"


class WorkflowError(ValueError):
    """The workflow cannot run as given; the message names the node, the input and the fix. `problems`: (node_id,
    input name or None for the node's own VALIDATE_INPUTS, message) for each error found."""

    def __init__(self, message: str, problems: list | None = None):
        super().__init__(message)
        self.problems = problems or []


def is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def declared_inputs(cls) -> dict:
    """{name: (category, spec tuple)} for the required and optional inputs of a node class."""
    types = cls.INPUT_TYPES()
    out = {}
    for category in ("required", "optional"):
        for name, spec in (types.get(category) or {}).items():
            out[name] = (category, spec)
    return out


def check_override(prompt: dict, node_id: str, name: str, node_classes: dict) -> None:
    """`--set NODE.NAME=...` must name an input the node declares (a typo would otherwise be dropped silently)."""
    class_type = prompt[node_id].get("class_type")
    cls = node_classes.get(class_type)
    if cls is None:
        return  # a node of another pack (a --server run): the server checks it
    names = declared_inputs(cls)
    if name not in names:
        raise WorkflowError(f"--set {node_id}.{name}: node {node_id} ({class_type}) has no input {name!r}; its inputs "
                            f"are {', '.join(names)}.")


def types_match(received, wanted) -> bool:
    """ComfyUI's link type rule: equal, '*' on either side, a list (combo) into COMBO, or comma-separated type sets
    that share a type."""
    if received == wanted or ANY_TYPE in (received, wanted):
        return True
    if isinstance(received, list) and wanted == COMBO_TYPE:
        return True
    if not isinstance(received, str) or not isinstance(wanted, str):
        return False
    got = {t.strip() for t in received.split(",")}
    want = {t.strip() for t in wanted.split(",")}
    return ANY_TYPE in got or ANY_TYPE in want or bool(got & want)


_CONVERT = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}


def validate_workflow(prompt: dict, node_classes: dict) -> tuple[dict, list[str]]:
    """-> (a copy of `prompt` with literals converted to their declared types, the output node ids in order).
    Raises WorkflowError listing every problem, one line."""
    prompt = copy.deepcopy(prompt)
    unknown = sorted({spec.get("class_type") for spec in prompt.values()} - set(node_classes), key=str)
    if unknown:
        raise WorkflowError(f"Not nodes of this pack: {', '.join(map(str, unknown))}. Run this workflow in ComfyUI "
                            "(python -m comfyui_h3 run WORKFLOW --server URL).")
    outputs = [nid for nid, spec in prompt.items() if getattr(node_classes[spec["class_type"]], "OUTPUT_NODE", False)
               is True]
    if not outputs:
        raise WorkflowError("The workflow has no output node (e.g. H3 Save Video): nothing would be made.")
    own_errors: dict[str, list[str]] = {}
    valid: dict[str, bool] = {}
    for node_id in outputs:
        _validate_node(prompt, node_id, node_classes, own_errors, valid, ())
    lines = [f"node {nid} ({prompt[nid]['class_type']}): " + "; ".join(m.rstrip(".") for _, m in errs)
             for nid, errs in own_errors.items() if errs]
    if lines:
        raise WorkflowError("The workflow does not validate: " + " | ".join(lines) + ".",
                            [(nid, name, msg) for nid, errs in own_errors.items() for name, msg in errs])
    return prompt, outputs


def _validate_node(prompt: dict, node_id: str, node_classes: dict, own_errors: dict, valid: dict,
                   trail: tuple) -> bool:
    """Fills own_errors[node_id] with this node's errors and valid[node_id] with whether it and everything it needs
    passed; returns the latter."""
    if node_id in valid:
        return valid[node_id]
    if node_id in trail:
        raise WorkflowError(f"The workflow has a cycle through node {node_id}.")
    spec = prompt[node_id]
    cls = node_classes[spec["class_type"]]
    inputs = spec.setdefault("inputs", {})
    checker = getattr(cls, "VALIDATE_INPUTS", None)
    named, takes_any = [], False
    if checker is not None:
        argspec = inspect.getfullargspec(checker)
        named, takes_any = list(argspec.args), argspec.varkw is not None
    errors: list[tuple[str | None, str]] = []
    upstream_ok = True
    received_types = {}
    for name, (category, declared) in declared_inputs(cls).items():
        wanted = declared[0]
        options = declared[1] if len(declared) > 1 and isinstance(declared[1], dict) else {}
        if name not in inputs:
            if category == "required":
                errors.append((name, f"required input {name!r} is missing"))
            continue
        value = inputs[name]
        if isinstance(value, list):
            problem = _check_link(prompt, name, value, wanted, node_classes, "input_types" in named)
            if problem:
                errors.append((name, problem))
                continue
            received_types[name] = node_classes[prompt[value[0]]["class_type"]].RETURN_TYPES[value[1]]
            if not _validate_node(prompt, value[0], node_classes, own_errors, valid, trail + (node_id,)):
                upstream_ok = False
            continue
        if isinstance(value, dict) and "__value__" in value:
            value = inputs[name] = value["__value__"]
        if isinstance(wanted, str) and wanted in _CONVERT:
            try:
                value = inputs[name] = _CONVERT[wanted](value)
            except Exception as exc:  # noqa: BLE001 - ComfyUI reports any conversion failure the same way
                article = "an" if wanted[0] in "AEIOU" else "a"
                errors.append((name, f"{name}: {value!r} is not {article} {wanted} value ({exc})"))
                continue
            if wanted == "FLOAT" and not math.isfinite(value):
                errors.append((name, f"{name}: {value!r} is not a finite number"))
                continue
        if name in named or takes_any:
            continue  # ComfyUI leaves the range and the choices of these to the node's VALIDATE_INPUTS
        if "min" in options and value < options["min"]:
            errors.append((name, f"{name}: {value!r} is smaller than the minimum {options['min']!r}"))
        elif "max" in options and value > options["max"]:
            errors.append((name, f"{name}: {value!r} is bigger than the maximum {options['max']!r}"))
        elif isinstance(wanted, list) or wanted == COMBO_TYPE:
            choices = wanted if isinstance(wanted, list) else options.get("options", [])
            if value not in choices:
                listed = str(choices) if len(choices) <= 20 else f"a list of {len(choices)} choices"
                errors.append((name, f"{name}: {value!r} is not one of {listed}"))
    if checker is not None and (named or takes_any):
        verdict = _run_validate_inputs(cls, checker, node_id, inputs, named, takes_any, received_types)
        if verdict is not None:
            errors.append((None, verdict))
    own_errors[node_id] = errors
    valid[node_id] = not errors and upstream_ok
    return valid[node_id]


def _check_link(prompt: dict, name: str, value: list, wanted, node_classes: dict, skip_type: bool) -> str | None:
    if not is_link(value):
        return f"{name}: a link must be [node_id, output_index], got {value!r}"
    source, index = value
    if source not in prompt:
        return f"{name}: links to node {source!r}, which the workflow does not have"
    returns = node_classes[prompt[source]["class_type"]].RETURN_TYPES
    if not 0 <= index < len(returns):
        return f"{name}: node {source} has no output {index} (it has {len(returns)})"
    if not skip_type and not types_match(returns[index], wanted):
        return f"{name}: node {source} gives {returns[index]}, this input takes {wanted}"
    return None


def _run_validate_inputs(cls, checker, node_id: str, inputs: dict, named: list, takes_any: bool,
                         received_types: dict) -> str | None:
    """Call VALIDATE_INPUTS as ComfyUI does at queue time; -> the error text, or None when it returned True."""
    declared = cls.INPUT_TYPES()
    given = {}
    for name, value in inputs.items():
        known = name in (declared.get("required") or {}) or name in (declared.get("optional") or {}) \
            or name in (declared.get("hidden") or {})
        if is_link(value):
            given[name] = None  # not computed yet at validation time
        elif known:
            given[name] = value
    hidden = {"UNIQUE_ID": node_id, "PROMPT": {}, "DYNPROMPT": None, "EXTRA_PNGINFO": None}
    for name, kind in (declared.get("hidden") or {}).items():
        if kind in hidden:
            given[name] = hidden[kind]
    kwargs = {k: v for k, v in given.items() if k in named or takes_any}
    if "input_types" in named:
        kwargs["input_types"] = received_types
    try:
        verdict = checker(**kwargs)
    except Exception as exc:  # noqa: BLE001 - ComfyUI turns any exception here into a validation error
        return f"validation raised {type(exc).__name__}: {exc}"
    if verdict is True:
        return None
    return "invalid input" if verdict is False else str(verdict)
