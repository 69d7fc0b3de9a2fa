"""ComfyUI's UI workflow format (nodes + links + positional widgets_values) -> the API format, for this pack's nodes, as
the frontend's "Export (API)" makes it: the tests check each shipped UI workflow against its API twin with it.

Widget order = the order of non-socket inputs in INPUT_TYPES (required, then optional); an INT input named `seed`
carries an extra `control_after_generate` value after it, an `image_upload` combo an extra "image" value, as the
ComfyUI frontend stores them.
"""

from __future__ import annotations

WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")
VIRTUAL_NODE_TYPES = ("Note", "MarkdownNote")  # frontend-only nodes: never exported to the API format


def _inputs(cls) -> list[tuple[str, object, dict]]:
    spec = cls.INPUT_TYPES()
    out = []
    for section in ("required", "optional"):
        for name, value in spec.get(section, {}).items():
            kind = value[0]
            opts = value[1] if len(value) > 1 and isinstance(value[1], dict) else {}
            out.append((name, kind, opts))
    return out


def _is_widget(kind) -> bool:
    return isinstance(kind, list) or kind in WIDGET_TYPES


def _extra_widget_values(name: str, kind, opts: dict) -> list:
    if kind == "INT" and (name in ("seed", "noise_seed") or opts.get("control_after_generate")):
        return ["fixed"]
    if isinstance(kind, list) and opts.get("image_upload"):
        return ["image"]
    return []


def ui_to_api(ui: dict, node_classes: dict) -> dict:
    """What ComfyUI's "Export (API)" makes of a UI workflow of this pack's nodes."""
    links = {link[0]: link for link in ui.get("links", [])}
    api = {}
    for node in sorted(ui["nodes"], key=lambda n: n["id"]):
        if node.get("mode", 0) in (2, 4) or node["type"] in VIRTUAL_NODE_TYPES:  # muted / bypassed / notes
            continue
        cls = node_classes.get(node["type"])
        if cls is None:
            raise ValueError(f"Node {node['id']} is a {node['type']}, not a node of this pack.")
        values = list(node.get("widgets_values", []))
        linked = {i["name"]: links[i["link"]] for i in node.get("inputs", []) if i.get("link") is not None}
        inputs = {}
        for name, kind, opts in _inputs(cls):
            if _is_widget(kind):
                value = values.pop(0) if values else opts.get("default")
                for _ in _extra_widget_values(name, kind, opts):
                    values.pop(0) if values else None
                inputs[name] = value
            if name in linked:
                link = linked[name]
                inputs[name] = [str(link[1]), link[2]]
        api[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return api
