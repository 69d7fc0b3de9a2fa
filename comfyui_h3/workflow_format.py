"""Convert between ComfyUI's UI workflow format (nodes + links + positional widgets_values) and the API format, for
this pack's nodes. Used to write the shipped UI workflows from their API twins and to check they stay in sync.

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


def api_to_ui(api: dict, node_classes: dict, positions: dict | None = None, notes: list | None = None) -> dict:
    """`notes`: [(text, (x, y)), ...] added as frontend Note nodes (they carry advice, not data)."""
    positions = positions or {}
    nodes, links = [], []
    ui_ids = {node_id: int(node_id) for node_id in api}
    outgoing: dict[tuple[str, int], list[int]] = {}
    link_id = 0
    pending = []
    for order, (node_id, spec) in enumerate(api.items()):
        cls = node_classes[spec["class_type"]]
        inputs, widgets = [], []
        for name, kind, opts in _inputs(cls):
            value = spec.get("inputs", {}).get(name)
            is_link = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            if _is_widget(kind):
                widgets.append(value if value is not None else opts.get("default"))
                widgets += _extra_widget_values(name, kind, opts)
                continue
            entry = {"name": name, "type": kind, "link": None}
            if is_link:
                link_id += 1
                entry["link"] = link_id
                pending.append((link_id, value[0], value[1], node_id, len(inputs), kind))
                outgoing.setdefault((value[0], value[1]), []).append(link_id)
            inputs.append(entry)
        nodes.append({"id": ui_ids[node_id], "type": spec["class_type"],
                      "pos": list(positions.get(node_id, (60 + 380 * order, 120))), "size": [340, 260],
                      "flags": {}, "order": order, "mode": 0, "inputs": inputs, "outputs": [],
                      "properties": {"Node name for S&R": spec["class_type"]}, "widgets_values": widgets})
    for node in nodes:
        cls = node_classes[node["type"]]
        names = getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES
        node["outputs"] = [{"name": n, "type": t, "slot_index": i,
                            "links": outgoing.get((str(node["id"]), i), [])}
                           for i, (n, t) in enumerate(zip(names, cls.RETURN_TYPES))]
    for lid, src, slot, dst, dst_slot, kind in pending:
        links.append([lid, ui_ids[src], slot, ui_ids[dst], dst_slot, kind])
    for text, pos in notes or []:
        note_id = max([n["id"] for n in nodes], default=0) + 1
        nodes.append({"id": note_id, "type": "Note", "pos": list(pos), "size": [380, 160], "flags": {},
                      "order": len(nodes), "mode": 0, "inputs": [], "outputs": [], "properties": {},
                      "widgets_values": [text]})
        ui_ids[f"note{note_id}"] = note_id
    return {"last_node_id": max(ui_ids.values(), default=0), "last_link_id": link_id, "nodes": nodes,
            "links": links, "groups": [], "config": {}, "extra": {}, "version": 0.4}


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
