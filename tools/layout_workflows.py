"""Lay out the shipped UI workflows (example_workflows/*.json) at the node sizes ComfyUI's frontend really gives them.

    COMFYUI_DIR=/path/to/ComfyUI [COMFYUI_PYTHON=...] python tools/layout_workflows.py

Starts a ComfyUI serving this pack (tests/comfyui_lane.py), loads each workflow in headless Chromium
(tests/js/comfyui_hardening_check.mjs, check "layout"), with the canvas renderer and with the Vue ("Nodes 2.0") one,
and reads every node's size once the frontend has laid it out (DOM widgets measured, video previews loaded). Each node
is saved as tall as either renderer draws it, and the columns of the original design are restacked with GAP px between
boxes, title bars included. Only `pos` and `size` change. The integration lane (tests/lane/test_comfyui_hardening_ui.py)
checks that no two boxes overlap in either renderer. Workflows with ComfyUI's own MiniMax-H3 nodes
(comfyui_h3/native_workflows.py) are laid out only by a ComfyUI that has those nodes; others keep their saved layout.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
TEMPLATES = REPO / "example_workflows"
GAP = 40  # px between two boxes (title bars included)
TITLE = 30  # LiteGraph.NODE_TITLE_HEIGHT: the title bar sits above `pos`
MIN_WIDTH = {"H3_MaskDraw": 440}  # room to draw (the editor's canvas takes the node's width)
# Room for what a run adds inside the node: the summary text H3 Edit / H3 Extend / SeedVR2 Upscale show when done
# (~50 px). (Output nodes' previews grow their node downwards: the design keeps nothing under them.)
AFTER_RUN = {"H3_Edit": 70, "H3_Extend": 70, "H3_SeedVR2Upscale": 70}
PLAYING = "h3_demo_source.mp4"  # a sample input (comfyui_h3/sample_inputs/) the output players are measured with


def measure(comfy, files: list[Path], vue_nodes: bool) -> dict[str, list[dict]]:
    """Each workflow's node boxes as loaded, and (key "<file>#playing") with its output video nodes playing the
    pack's sample clip, as after a run: the player's room is part of the node's size."""
    from headless import run_script

    config = {"url": comfy.url, "checks": ["layout"],
              "layout": {"workflows": [str(f) for f in files], "vueNodes": vue_nodes, "playing": PLAYING}}
    run = run_script("comfyui_hardening_check.mjs", json.dumps(config), timeout=600)
    result = json.loads(run.stdout)
    if run.returncode or "error" in result:
        raise SystemExit(f"measuring failed: {result.get('error')}\n{run.stderr[-2000:]}")
    return result["layout"]


def columns(nodes: list[dict]) -> list[list[dict]]:
    """The design's columns: nodes grouped by x (left to right), each top to bottom."""
    by_x: dict[float, list[dict]] = {}
    for node in nodes:
        by_x.setdefault(node["pos"][0], []).append(node)
    return [sorted(col, key=lambda n: n["pos"][1]) for _, col in sorted(by_x.items())]


def relayout(workflow: dict, canvas: list[dict], vue: list[dict], played: tuple = ()) -> dict:
    """Each node as tall as either renderer draws it (plus AFTER_RUN), also with its output player shown (`played`:
    the canvas and Vue boxes measured so), the columns restacked GAP apart."""
    on_canvas, in_vue = {str(m["id"]): m for m in canvas}, {str(m["id"]): m for m in vue}  # 1.58: string ids
    playing = [{str(m["id"]): m for m in boxes} for boxes in played]
    nodes = workflow["nodes"]
    for node in nodes:
        m, v = on_canvas[str(node["id"])], in_vue[str(node["id"])]
        if len(playing) == 2:  # the larger of what each renderer asks for, player shown or not
            pm, pv = playing[0][str(node["id"])], playing[1][str(node["id"])]
            m = {**m, "wants": [m["wants"][0], max(m["wants"][1], pm["wants"][1], pm["size"][1])]}
            v = {**v, "domGraph": [v["domGraph"][0], max(v["domGraph"][1], pv["domGraph"][1])]}
        # Widths are the design's (the frontend keeps a saved width; a video preview's wish grows with the width it
        # is given). Heights: what the canvas renderer's content asks for (computeSize, whatever the node's size now)
        # plus the room a run adds, or the Vue renderer's element (it draws the whole graph `scale` times larger,
        # header included, and never smaller than the saved size, so measuring again gives the same layout); a note
        # keeps its designed size (its text scrolls).
        scale = v["domGraph"][0] / node["size"][0]
        height = max(math.ceil(m["wants"][1]) + AFTER_RUN.get(node["type"], 0),
                     math.ceil(v["domGraph"][1] / scale) - TITLE)
        if node["type"] == "Note":
            height = max(height, node["size"][1])
        node["size"] = [math.ceil(max(node["size"][0], MIN_WIDTH.get(node["type"], 0))), height]
    x = min(n["pos"][0] for n in nodes)
    for col in columns(nodes):
        y = min(n["pos"][1] for n in col)
        for node in col:
            node["pos"] = [x, y]
            y += node["size"][1] + TITLE + GAP
        x += max(n["size"][0] for n in col) + GAP
    return workflow


def dump(workflow: dict, like: str) -> str:
    """JSON in the file's own layout (indent, final newline), so a diff shows only what moved."""
    second = like.split("\n", 2)[1] if "\n" in like else ""
    indent = len(second) - len(second.lstrip(" ")) or 1
    return json.dumps(workflow, indent=indent) + ("\n" if like.endswith("\n") else "")


def overlaps(measured: list[dict], key: str = "box") -> list[tuple]:
    out = []
    for i, a in enumerate(measured):
        for b in measured[i + 1:]:
            ax, ay, aw, ah = a[key]
            bx, by, bw, bh = b[key]
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((a["type"], b["type"]))
    return out


def main() -> int:
    if not os.environ.get("COMFYUI_DIR"):
        print("set COMFYUI_DIR to a ComfyUI checkout (v0.8.0+)", file=sys.stderr)
        return 2
    from comfyui_lane import running_comfyui

    from comfyui_h3.native_workflows import NATIVE_WORKFLOWS

    files = sorted(TEMPLATES.glob("*.json"))
    with tempfile.TemporaryDirectory() as root, running_comfyui(Path(root)) as comfy:
        # Workflows with ComfyUI's own MiniMax-H3 nodes can be measured only by a ComfyUI that has them (0.30+):
        # elsewhere those nodes are placeholders, so the workflows keep their saved layout.
        known = set(comfy.request("/object_info")[1])
        for path in [f for f in files if set(NATIVE_WORKFLOWS.get(f.stem, ())) - known]:
            print(f"{path.name}: kept as saved (this ComfyUI lacks "
                  f"{', '.join(sorted(set(NATIVE_WORKFLOWS[path.stem]) - known))})", file=sys.stderr)
            files.remove(path)
        settings = comfy.root / "user" / "default" / "comfy.settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
        for attempt in range(4):  # a wider node can ask for another height: measure until the sizes hold
            canvas, vue = measure(comfy, files, False), measure(comfy, files, True)
            changed = False
            for path in files:
                before = path.read_text()
                played = tuple(seen[f"{path}#playing"]["boxes"] for seen in (canvas, vue) if f"{path}#playing" in seen)
                after = dump(relayout(json.loads(before), canvas[str(path)], vue[str(path)], played), before)
                if after != before:
                    path.write_text(after)
                    changed = True
            if not changed:
                break
        canvas, vue = measure(comfy, files, False), measure(comfy, files, True)
    bad = {f"{path.name} ({mode})": overlaps(seen[str(path)], key) for path in files
           for mode, seen, key in (("canvas", canvas, "box"), ("vue", vue, "dom")) if overlaps(seen[str(path)], key)}
    bad.update({f"{path.name} ({mode}, playing)": overlaps(seen[f"{path}#playing"]["boxes"], key) for path in files
                for mode, seen, key in (("canvas", canvas, "box"), ("vue", vue, "dom"))
                if f"{path}#playing" in seen and overlaps(seen[f"{path}#playing"]["boxes"], key)})
    spilled = {f"{path.name} ({mode})": [p["type"] for p in seen[f"{path}#playing"]["players"] if not p["fits"]]
               for path in files for mode, seen in (("canvas", canvas), ("vue", vue))
               if f"{path}#playing" in seen and not all(p["fits"] for p in seen[f"{path}#playing"]["players"])}
    if spilled:
        print(f"players drawn past their node: {spilled}", file=sys.stderr)
        return 1
    for path in files:
        print(path.name, [(m["type"], m["pos"], m["size"]) for m in canvas[str(path)]])
    if bad:
        print(f"still overlapping: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
