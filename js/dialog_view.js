// The DOM of the full-size video editor (js/mask_dialog.js): its style sheet, the tool tables and `buildDialog`, which
// makes the panel's rows (header, tools, edit row, viewport, transport, status) and stores on the dialog the elements
// it updates. Plain DOM; every control calls back into the dialog.

import { el } from "./dom.js";
import { clampOpacity, clearFramePrompts, nextObjectId, objectIds, removeObject } from "./editor_logic.js";
import { clearKeyframe, ensureKeyframe, removeKeyframe } from "./mask_logic.js";

const PAN_TOOL = ["pan", "pan", "Pan the view (H; or drag with the middle button, or hold Space and drag)"];  // both editors
const MASK_TOOLS = [
  ["brush", "brush", "Brush: paint the mask (B)"],
  ["eraser", "eraser", "Eraser: remove painted mask (E)"],
  ["rect", "rect", "Rectangle: moves smoothly between keyframes (R)"],
  ["ellipse", "ellipse", "Ellipse: moves smoothly between keyframes (O)"],
  ["move", "move", "Move a rectangle / ellipse on this frame; makes a keyframe (V)"],
  PAN_TOOL,
];
const PROMPT_TOOLS = [
  ["point-pos", "click +", "Positive click: this is the object (A)"],
  ["point-neg", "click −", "Negative click: this is not the object (N)"],
  ["box", "box", "Box around the object on this frame; one per object and frame (X)"],
  ["remove-prompt", "remove", "Remove the click or box nearest the pointer (D)"],
  PAN_TOOL,
];

export const TOOL_KEYS = { b: "brush", e: "eraser", r: "rect", o: "ellipse", v: "move", h: "pan", a: "point-pos", n: "point-neg", x: "box", d: "remove-prompt" };  // the tools' keys

const CSS = `
.h3-ve-overlay{position:fixed;inset:0;z-index:10000;background:rgba(0,0,0,.6);font:12px/1.3 sans-serif;color:#ddd}
.h3-ve-panel{position:absolute;inset:14px;display:flex;flex-direction:column;background:#1d1d1f;border:1px solid #444;border-radius:8px;overflow:hidden;box-shadow:0 8px 32px rgba(0,0,0,.6)}
.h3-ve-row{display:flex;flex-wrap:wrap;gap:6px;align-items:center;padding:5px 10px;border-bottom:1px solid #333}
.h3-ve-row button{background:#2c2c30;color:#ddd;border:1px solid #555;border-radius:4px;padding:3px 8px;cursor:pointer;font:12px sans-serif}
.h3-ve-row button:hover{background:#3a3a40}
.h3-ve-row button.h3-ve-on{background:#2d5a8a;border-color:#4af;color:#fff}
.h3-ve-row button:disabled{opacity:.4;cursor:default}
.h3-ve-overlay input[type=range],.h3-ve-overlay input[type=checkbox]{accent-color:#4af}
.h3-ve-row input[type=number]{width:54px;background:#111;color:#ddd;border:1px solid #555;border-radius:3px;padding:2px 4px}
.h3-ve-row select{background:#111;color:#ddd;border:1px solid #555;border-radius:3px;padding:2px 4px}
.h3-ve-sep{width:1px;height:20px;background:#444;margin:0 4px}
.h3-ve-title{font-weight:bold;font-size:13px;color:#fff}
.h3-ve-view{flex:1;position:relative;overflow:hidden;background:#0d0d0e;min-height:120px}
.h3-ve-view canvas{position:absolute;inset:0;width:100%;height:100%;touch-action:none}
.h3-ve-transport{display:flex;gap:6px;align-items:center;padding:6px 10px;border-top:1px solid #333}
.h3-ve-transport button{background:#2c2c30;color:#ddd;border:1px solid #555;border-radius:4px;padding:3px 8px;cursor:pointer;min-width:30px}
.h3-ve-timeline{flex:1;display:flex;flex-direction:column;gap:1px}
.h3-ve-timeline input{width:100%;margin:0}
.h3-ve-ticks{height:8px;width:100%}
.h3-ve-status{padding:3px 10px 6px;color:#999;min-height:16px}
.h3-ve-warn{color:#fc6}
`;

// d: the VideoEditorDialog being built (mode, prefs, options, model, frame, objectId, and the methods the controls call).
export function buildDialog(d) {
  if (!document.getElementById("h3-ve-style")) document.head.append(el("style", { id: "h3-ve-style" }, [CSS]));
  // After a click the keyboard goes back to the viewport: Space on a focused button would press it again.
  const button = (label, title, attrs, onclick) => el("button", { title, ...attrs,
    onclick: (e) => { onclick(e); if (!d.closed) d.canvas.focus({ preventScroll: true }); } }, [label]);
  d.overlay = el("div", { class: "h3-ve-overlay", "data-role": "video-editor", "data-mode": d.mode });
  const panel = el("div", { class: "h3-ve-panel" });
  d.overlay.append(panel);

  const header = el("div", { class: "h3-ve-row" });
  header.append(el("span", { class: "h3-ve-title" }, [d.options.title || (d.mode === "mask" ? "H3 Mask Draw" : "H3 Track Mask")]));
  header.append(el("span", { style: "color:#888" }, [d.mode === "mask"
    ? "grow / feather / invert: the node's widgets (its preview shows them)"
    : "clicks and boxes in source-video pixels, on any frames; the tracker carries them through the clip"]));
  header.append(el("span", { style: "flex:1" }));
  header.append(button("Close", "Close the editor (Esc); every edit is already in the node", { "data-action": "close" }, () => d.close()));

  const tools = el("div", { class: "h3-ve-row" });
  d.toolButtons = {};
  for (const [name, label, title] of d.mode === "mask" ? MASK_TOOLS : PROMPT_TOOLS) {
    const b = button(label, title, { "data-tool": name }, () => d.setTool(name));
    d.toolButtons[name] = b;
    tools.append(b);
  }
  tools.append(el("span", { class: "h3-ve-sep" }));
  if (d.mode === "mask") {
    d.sizeBox = el("input", { type: "number", min: "1", max: "512", step: "1", "data-role": "size", title: "Brush size in video pixels ([ and ] change it)",
      onchange: (e) => d.setSize(e.target.value) });
    d.sizeRange = el("input", { type: "range", min: "1", max: "256", "data-role": "size-range", title: "Brush size", style: "width:110px",
      oninput: (e) => d.setSize(e.target.value) });
    tools.append("size", d.sizeBox, d.sizeRange, el("span", { class: "h3-ve-sep" }));
  }
  d.undoButton = button("↶ undo", "Undo (Ctrl+Z)", { "data-action": "undo" }, () => d.undo());
  d.redoButton = button("↷ redo", "Redo (Ctrl+Shift+Z or Ctrl+Y)", { "data-action": "redo" }, () => d.redo());
  tools.append(d.undoButton, d.redoButton, el("span", { class: "h3-ve-sep" }));
  if (d.mode === "mask") {
    d.tintInput = el("input", { type: "color", value: d.prefs.tint, "data-role": "tint", title: "Mask tint colour",
      oninput: (e) => { d.prefs.tint = e.target.value; d.savePrefs(); d.render(); } });
    d.opacityInput = el("input", { type: "range", min: "0", max: "100", value: String(Math.round(clampOpacity(d.prefs.opacity) * 100)),
      "data-role": "opacity", title: "Mask tint opacity", style: "width:90px",
      oninput: (e) => { d.prefs.opacity = clampOpacity(Number(e.target.value) / 100); d.savePrefs(); d.render(); } });
    tools.append("tint", d.tintInput, d.opacityInput, el("span", { class: "h3-ve-sep" }));
  }
  d.onionInput = el("input", { type: "checkbox", "data-role": "onion", title: "Onion skin: show the neighbouring keyframes (blue: before, yellow: after)",
    onchange: (e) => { d.prefs.onion = e.target.checked; d.savePrefs(); d.render(); } });
  d.onionInput.checked = Boolean(d.prefs.onion);
  d.onionDepth = el("input", { type: "number", min: "1", max: "5", step: "1", value: String(d.prefs.onionDepth), "data-role": "onion-depth",
    title: "How many keyframes either side the onion skin shows", style: "width:40px",
    onchange: (e) => { d.prefs.onionDepth = Math.min(5, Math.max(1, Math.trunc(Number(e.target.value)) || 1)); e.target.value = String(d.prefs.onionDepth); d.savePrefs(); d.render(); } });
  tools.append(el("label", { style: "display:flex;gap:3px;align-items:center" }, [d.onionInput, "onion"]), d.onionDepth, el("span", { class: "h3-ve-sep" }));
  d.zoomLabel = el("span", { "data-role": "zoom", style: "min-width:44px;text-align:center" });
  tools.append(button("−", "Zoom out (wheel)", { "data-action": "zoom-out" }, () => d.zoomBy(1 / 1.25)),
    d.zoomLabel, button("+", "Zoom in (wheel)", { "data-action": "zoom-in" }, () => d.zoomBy(1.25)),
    button("fit", "Fit the frame in the window (F)", { "data-action": "fit" }, () => d.fit()),
    button("1:1", "One video pixel per screen pixel", { "data-action": "zoom-1" }, () => d.zoomTo(1)));

  const edit = el("div", { class: "h3-ve-row" });
  if (d.mode === "mask") {
    edit.append(button("key +", "Add a keyframe here (copies the shapes as they are on this frame)", { "data-action": "key-add" },
      () => d.commit(ensureKeyframe(d.model, d.frame))));
    edit.append(button("key −", "Remove this frame's keyframe", { "data-action": "key-remove" }, () => d.commit(removeKeyframe(d.model, d.frame))));
    edit.append(button("clear frame", "Remove every shape of this frame's keyframe", { "data-action": "clear" }, () => d.commit(clearKeyframe(d.model, d.frame))));
  } else {
    d.objectSelect = el("select", { "data-role": "object", title: "The object the clicks and boxes belong to",
      onchange: (e) => { d.objectId = Number(e.target.value); d.refresh(); } });
    edit.append("object", d.objectSelect,
      button("+ object", "Track another object (its own clicks and boxes)", { "data-action": "object-add" }, () => {
        d.objectId = nextObjectId(d.model, [d.objectId]);
        d.refresh();
      }),
      button("delete object", "Remove this object and all its clicks and boxes", { "data-action": "object-remove" }, () => {
        const next = removeObject(d.model, d.objectId);
        d.objectId = objectIds(next)[0] ?? 1;
        d.commit(next);
      }),
      button("clear frame", "Remove this object's clicks and boxes on this frame", { "data-action": "clear" },
        () => d.commit(clearFramePrompts(d.model, d.frame, d.objectId))));
  }
  d.summary = el("span", { "data-role": "summary", style: "color:#aaa;margin-left:8px" });
  edit.append(d.summary);

  d.view = el("div", { class: "h3-ve-view" });
  d.canvas = el("canvas", { class: "h3-ve-canvas", "data-role": "viewport", tabindex: "0", style: "outline:none" });
  d.view.append(d.canvas);
  d.layer = document.createElement("canvas");  // offscreen: one mask / onion layer at a time, tinted then drawn
  d.rimLayer = document.createElement("canvas");  // offscreen: an onion layer's inside, cut away to leave its rim

  const transport = el("div", { class: "h3-ve-transport" });
  d.playButton = button("▶", "Play / pause (Space)", { "data-action": "play" }, () => d.togglePlay());
  d.scrubber = el("input", { type: "range", min: "0", max: "0", value: "0", step: "1", "data-role": "scrubber", title: "Frame (← → step; Shift+← → jump keyframes)",
    oninput: (e) => d.setFrame(Number(e.target.value)) });
  d.ticks = el("canvas", { class: "h3-ve-ticks", "data-role": "ticks" });
  d.frameLabel = el("span", { "data-role": "frame-label", style: "min-width:260px;color:#bbb" });
  transport.append(
    button("◀ key", "Previous keyframe (Shift+←)", { "data-action": "key-prev" }, () => d.jumpKey(-1)),
    button("◀", "Previous frame (←)", { "data-action": "frame-prev" }, () => d.setFrame(d.frame - 1)),
    d.playButton,
    button("▶|", "Next frame (→)", { "data-action": "frame-next" }, () => d.setFrame(d.frame + 1)),
    button("key ▶", "Next keyframe (Shift+→)", { "data-action": "key-next" }, () => d.jumpKey(1)),
    el("div", { class: "h3-ve-timeline" }, [d.ticks, d.scrubber]),
    d.frameLabel);
  d.status = el("div", { class: "h3-ve-status", "data-role": "status" });
  panel.append(header, tools, edit, d.view, transport, d.status);
  document.body.append(d.overlay);
  d.setTool(d.tool);
  d.setSize(d.size);
}
