"""The pack's nodes as ComfyUI V3 nodes (`comfy_api.latest` io.Schema) where the ComfyUI at hand has that API.

Each node is declared once, as its class in nodes/ (INPUT_TYPES built from the families' option tables, RETURN_TYPES /
RETURN_NAMES / OUTPUT_TOOLTIPS, CATEGORY, DESCRIPTION, OUTPUT_NODE, VALIDATE_INPUTS, IS_CHANGED and the function
that runs it). This module turns that declaration into a V3 schema — typed io inputs (Int, Float, String, Boolean,
Combo, custom types) with their tooltips, ranges and defaults, hidden inputs, typed outputs — and a ComfyNode whose
`execute`, `validate_inputs` and `fingerprint_inputs` run the declared class's own. Node IDs, input names and their
order (the widget order saved workflows store) are the declaration's, so a workflow saved against the V1 nodes loads
and runs the same. Without `comfy_api.latest` (older ComfyUI), or with COMFYUI_H3_NODE_API=v1, ComfyUI gets the V1
classes as they are.
"""

from __future__ import annotations

import inspect
import os

_SCALARS = ("INT", "FLOAT", "STRING", "BOOLEAN")
_TYPED_KEYS = {"INT": ("default", "min", "max", "step"), "FLOAT": ("default", "min", "max", "step"),
               "STRING": ("default", "multiline"), "BOOLEAN": ("default",)}


def v3_io():
    """ComfyUI's V3 io module and ComfyExtension, or None where this ComfyUI lacks them or V1 is asked for."""
    if os.environ.get("COMFYUI_H3_NODE_API", "").strip().lower() == "v1":
        return None
    try:
        from comfy_api.latest import ComfyExtension, io
    except ImportError:  # not inside ComfyUI, or a ComfyUI from before the V3 API
        return None
    if not all(hasattr(io, name) for name in ("ComfyNode", "Schema", "Custom", "Combo", "Hidden")):
        return None
    return io, ComfyExtension


def io_input(io, name: str, spec: tuple, optional: bool):
    """One declared input `(type, options)` as the V3 io input of that type; options without a typed argument
    (control_after_generate, multiline, image_upload, display, ...) travel in extra_dict unchanged."""
    kind = spec[0]
    options = dict(spec[1]) if len(spec) > 1 and spec[1] else {}
    common = {"optional": optional, "tooltip": options.pop("tooltip", None)}
    if isinstance(kind, (list, tuple)):  # a combo: its choices
        return io.Combo.Input(name, options=list(kind), default=options.pop("default", None), extra_dict=options,
                              **common)
    if kind in _SCALARS:
        typed = {key: options.pop(key) for key in _TYPED_KEYS[kind] if key in options}
        kind_class = {"INT": io.Int, "FLOAT": io.Float, "STRING": io.String, "BOOLEAN": io.Boolean}[kind]
        return kind_class.Input(name, extra_dict=options, **common, **typed)
    return io.Custom(kind).Input(name, extra_dict=options, **common)


def _hidden(io, declared: dict) -> dict:
    """{V1 argument name: io.Hidden} for a declaration's hidden inputs ({"unique_id": "UNIQUE_ID"})."""
    return {name: io.Hidden(value) for name, value in declared.items()}


def v3_node(io, node_id: str, display_name: str, node_class: type) -> type:
    """A ComfyNode with `node_class`'s declaration as its schema, running `node_class`'s own methods."""
    function = node_class.FUNCTION
    returns = tuple(node_class.RETURN_TYPES)
    names = tuple(getattr(node_class, "RETURN_NAMES", None) or returns)
    tips = tuple(getattr(node_class, "OUTPUT_TOOLTIPS", None) or (None,) * len(returns))
    hidden = _hidden(io, node_class.INPUT_TYPES().get("hidden") or {})  # fixed per class: read once, not per run

    def define_schema(cls):
        declared = node_class.INPUT_TYPES()  # per call: model and file lists follow the folders, as V1 does
        inputs = [io_input(io, name, spec, section == "optional")
                  for section in ("required", "optional") for name, spec in (declared.get(section) or {}).items()]
        outputs = [io.Custom(kind).Output(id=f"{index}:{name}", display_name=name, tooltip=tip)
                   for index, (kind, name, tip) in enumerate(zip(returns, names, tips))]
        return io.Schema(node_id=node_id, display_name=display_name, category=node_class.CATEGORY,
                         description=getattr(node_class, "DESCRIPTION", ""), inputs=inputs, outputs=outputs,
                         hidden=list(hidden.values()),
                         is_output_node=bool(getattr(node_class, "OUTPUT_NODE", False)))

    def execute(cls, **inputs):
        given = {name: getattr(cls.hidden, which.name) for name, which in hidden.items()}
        # a tuple, or {"ui": ..., "result": ...}: ComfyUI normalises both into its NodeOutput
        return getattr(node_class(), function)(**inputs, **given)

    body = {"define_schema": classmethod(define_schema), "execute": classmethod(execute),
            "__doc__": node_class.__doc__, "__module__": node_class.__module__}
    if hasattr(node_class, "VALIDATE_INPUTS"):
        body["validate_inputs"] = classmethod(_same_arguments(node_class.VALIDATE_INPUTS))
    if hasattr(node_class, "IS_CHANGED"):
        body["fingerprint_inputs"] = classmethod(_same_arguments(node_class.IS_CHANGED))
    return type(node_class.__name__, (io.ComfyNode,), body)


def _same_arguments(method):
    """A classmethod body calling the declaration's `method` with the same named arguments. ComfyUI reads them
    (inspect.getfullargspec): the inputs a VALIDATE_INPUTS names are the ones whose range and choices it leaves to
    the node, so the V3 node must name exactly the same."""
    def call(cls, *args, **kwargs):
        return method(*args, **kwargs)

    call.__signature__ = inspect.signature(method.__func__)  # (cls, <the declaration's arguments>)
    call.__name__ = method.__name__
    return call


def comfy_extension(io, extension_base, mappings: dict, display_names: dict):
    """The ComfyExtension ComfyUI's comfy_entrypoint returns: every node of `mappings` as a V3 node."""
    nodes = [v3_node(io, node_id, display_names.get(node_id, node_id), node_class)
             for node_id, node_class in mappings.items()]

    class H3Extension(extension_base):
        async def get_node_list(self):
            return list(nodes)

    return H3Extension()
