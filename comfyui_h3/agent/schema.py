"""JSON Schema for a tool's arguments, made from the node inputs they set: the same declarations (type, range,
choices, default, tooltip) the nodes give ComfyUI, so a tool argument means what the widget means. Node inputs are
read as ComfyUI's /object_info lists them ({class: {"input": {"required": {...}, "optional": {...}}}}): from this
process's node classes, or from the ComfyUI a runner talks to (its file lists and model choices are the truth)."""

from __future__ import annotations

from typing import Mapping

import jsonschema

# widget kinds -> JSON Schema types
TYPES = {"INT": "integer", "FLOAT": "number", "STRING": "string", "BOOLEAN": "boolean"}
FILE_INPUTS = {("H3_LoadVideo", "video"), ("H3_LoadImage", "image")}  # choices = files of ComfyUI's input folder


class ArgumentError(ValueError):
    """A tool's arguments do not fit its schema, or name what the pack refuses; the message says which and why."""


def node_inputs_of(node_classes: Mapping) -> dict:
    """This process's node classes as /object_info lists their inputs."""
    return {name: {"input": cls.INPUT_TYPES()} for name, cls in node_classes.items()}


def input_spec(info: Mapping, class_type: str, name: str) -> tuple[object, dict]:
    """(kind, options) of one input: kind a type name or a list of choices (ComfyUI's COMBO form read too)."""
    inputs = (info.get(class_type) or {}).get("input") or {}
    for section in ("required", "optional"):
        spec = (inputs.get(section) or {}).get(name)
        if spec is not None:
            kind = spec[0]
            opts = dict(spec[1]) if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if kind == "COMBO":  # the v3 schema's combo: choices in options
                kind = list(opts.get("options") or [])
            return (list(kind) if isinstance(kind, (list, tuple)) else kind), opts
    raise KeyError(f"{class_type} has no input {name!r}")


def widget_property(info: Mapping, class_type: str, name: str, description: str | None = None) -> dict:
    """The JSON Schema of one widget input: type, default, minimum / maximum, enum, its tooltip as description."""
    kind, opts = input_spec(info, class_type, name)
    prop: dict = {}
    if isinstance(kind, list):
        prop["type"] = "string" if all(isinstance(c, str) for c in kind) else ["string", "number"]
        if kind and (class_type, name) not in FILE_INPUTS:
            prop["enum"] = kind
        default = opts.get("default", kind[0] if kind else None)
    else:
        if kind not in TYPES:
            raise TypeError(f"{class_type}.{name} is a {kind} socket, not a widget")
        prop["type"] = TYPES[kind]
        default = opts.get("default")
        for key, schema_key in (("min", "minimum"), ("max", "maximum")):
            if isinstance(opts.get(key), (int, float)) and not isinstance(opts.get(key), bool):
                prop[schema_key] = opts[key]
    if default is not None and (class_type, name) not in FILE_INPUTS:
        prop["default"] = default
    text = description or opts.get("tooltip")
    if text:
        prop["description"] = text
    return prop


def check_arguments(schema: dict, arguments: Mapping) -> dict:
    """The arguments checked against the tool's schema (ArgumentError naming the first problem), with the
    schema's defaults filled in for what was left out."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "arguments"
        raise ArgumentError(f"{where}: {first.message}")
    filled = dict(arguments)
    for key, prop in schema.get("properties", {}).items():
        if key not in filled and "default" in prop:
            filled[key] = prop["default"]
    return filled
