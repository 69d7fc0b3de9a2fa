// The H3 Mask Draw editor: a canvas over the video frame, a timeline scrubber and the drawing tools. Plain DOM, no
// ComfyUI imports, so it runs on any page (mask_draw.js mounts it in the node; tests mount it on a bare page).
//
//   const editor = new MaskEditor(rootElement, {
//     state,                       // a parsed state (mask_logic.js schema) or its JSON string
//     frameCount,                  // frames on the timeline
//     frameUrl: (n) => url|null,   // an image of frame n (optional)
//     onChange: (json) => {},      // the serialised state, after every finished edit
//     limits: {grow: {min, max}, feather: {min, max}},  // the node widgets' ranges (setSettings clamps to them)
//     onResize: () => {},          // the editor's content height changed (a status line shown or hidden)
//     onOpen: () => {},            // optional: shows an "open editor" button (the full-size dialog, mask_dialog.js)
//   });
// Grow / feather / invert are the node's widgets (one place for them); the host passes their values to
// setSettings so the preview shows the mask as the node will make it.

import { el } from "./dom.js";
import {
  addShape, clampSetting, clearKeyframe, ensureKeyframe, hitShape, keyframeAt, newShapeId, parseState, removeKeyframe,
  renderFrame, replaceShape, serializeState, shapesAt, sortedKeyframes, spanShape, translateShape,
} from "./mask_logic.js";

const TOOLS = [
  ["brush", "Brush: paint the mask"],
  ["eraser", "Eraser: remove painted mask"],
  ["rect", "Rectangle (moves smoothly between keyframes)"],
  ["ellipse", "Ellipse (moves smoothly between keyframes)"],
  ["move", "Move a rectangle / ellipse on this frame (makes a keyframe)"],
];
const PREVIEW_MAX = 512;

export class MaskEditor {
  constructor(root, options = {}) {
    this.root = root;
    this.options = options;
    this.limits = { grow: { ...options.limits?.grow }, feather: { min: 0, ...options.limits?.feather } };
    this.state = parseState(options.state || "");
    this.frameCount = Math.max(1, options.frameCount || 1);
    this.frame = 0;
    this.tool = "brush";
    this.size = 32;
    this.drag = null;
    this.image = null;
    this.imageFrame = -1;
    this.build();
    this.resize();
    this.loadFrame();
  }

  build() {
    const bar = el("div", { class: "h3-mask-toolbar", style: "display:flex;flex-wrap:wrap;gap:3px;align-items:center;font:11px sans-serif;color:#ddd" });
    this.toolButtons = {};
    for (const [name, title] of TOOLS) {
      const b = el("button", { "data-tool": name, title, onclick: () => this.setTool(name) }, [name]);
      this.toolButtons[name] = b;
      bar.append(b);
    }
    this.sizeInput = el("input", { type: "range", min: "1", max: "256", value: String(this.size), title: "Brush size (video pixels)", "data-role": "size",
      oninput: (e) => { this.size = Number(e.target.value); } });
    bar.append(el("span", { style: "display:inline-flex;align-items:center;gap:2px" }, ["size", this.sizeInput]));  // kept on one line
    bar.append(el("button", { "data-action": "clear", title: "Remove every shape of this frame's keyframe", onclick: () => this.commit(clearKeyframe(this.state, this.frame)) }, ["clear"]));
    bar.append(el("button", { "data-action": "key-add", title: "Add a keyframe here (copies the shapes as they are on this frame)", onclick: () => this.commit(ensureKeyframe(this.state, this.frame)) }, ["key +"]));
    bar.append(el("button", { "data-action": "key-remove", title: "Remove this frame's keyframe", onclick: () => this.commit(removeKeyframe(this.state, this.frame)) }, ["key −"]));
    if (this.options.onOpen) {
      bar.append(el("button", { "data-action": "open-editor", title: "Open the full-size editor (zoom, play, onion skin, undo)", style: "margin-left:auto",
        onclick: () => this.options.onOpen() }, ["open editor"]));
    }
    this.canvas = el("canvas", { class: "h3-mask-canvas", style: "width:100%;display:block;background:#111;cursor:crosshair;touch-action:none" });
    this.scrubber = el("input", { type: "range", min: "0", max: "0", value: "0", style: "width:100%", title: "Frame", "data-role": "scrubber",
      oninput: (e) => this.setFrame(Number(e.target.value)) });
    this.label = el("div", { style: "font:11px sans-serif;color:#aaa" });
    // Why there is no frame under the drawing (set by the host, or a frame that failed to load); hidden when empty.
    this.status = el("div", { "data-role": "status", style: "font:12px sans-serif;color:#fc6;display:none;white-space:normal" });
    this.root.append(bar, this.status, this.canvas, this.scrubber, this.label);
    this.canvas.addEventListener("mousedown", (e) => this.down(e));
    this.moveHandler = (e) => this.move(e);
    this.upHandler = (e) => this.up(e);
    window.addEventListener("mousemove", this.moveHandler);
    window.addEventListener("mouseup", this.upHandler);
    this.setTool(this.tool);
  }

  destroy() {
    window.removeEventListener("mousemove", this.moveHandler);
    window.removeEventListener("mouseup", this.upHandler);
  }

  // -- external updates ----------------------------------------------------------------------------------------------
  setState(json) {
    this.state = parseState(json);
    this.resize();
    this.render();
  }

  // Returns true when the drawing itself changed (an empty one adopted the video's size), so the host saves it.
  setVideo({ width, height, frameCount }) {
    // Shapes keep their coordinate space (the rasteriser scales it); only an empty drawing adopts the new size.
    const adopt = width && height && !this.state.keyframes.length && (width !== this.state.width || height !== this.state.height);
    if (adopt) this.state = { ...this.state, width, height };
    this.frameCount = Math.max(1, frameCount || 1);
    this.frame = Math.min(this.frame, this.frameCount - 1);
    this.imageFrame = -1;
    this.resize();
    this.loadFrame();
    return Boolean(adopt);
  }

  setSettings({ grow, feather, invert }) {
    this.state = { ...this.state, grow: clampSetting(grow ?? this.state.grow, this.limits.grow),
      feather: clampSetting(feather ?? this.state.feather, this.limits.feather), invert: Boolean(invert ?? this.state.invert) };
    this.render();
  }

  // A line above the canvas saying why no frames show ("" hides it).
  setStatus(text) {
    this.hostStatus = text || "";
    this.showStatus();
  }

  showStatus() {
    const text = this.hostStatus || this.frameError || "";
    if (text === this.status.textContent) return;
    this.status.textContent = text;
    this.status.style.display = text ? "" : "none";
    this.options.onResize?.();  // the rows' height changed: the host may need to grow its node
  }

  setTool(name) {
    this.tool = name;
    for (const [k, b] of Object.entries(this.toolButtons)) b.style.outline = k === name ? "2px solid #4af" : "";
  }

  setFrame(n) {
    this.frame = Math.max(0, Math.min(this.frameCount - 1, Math.trunc(n)));
    this.scrubber.value = String(this.frame);
    this.loadFrame();
  }

  // Height (CSS px) the rows need when the editor is `width` px wide: the canvas keeps the drawing's aspect, the other
  // rows are measured as laid out now. 0 while the editor is not laid out.
  contentHeight(width) {
    const rows = [...this.root.children];
    if (!this.canvas.offsetParent) return 0;
    const last = rows[rows.length - 1];
    const span = last.offsetTop + last.offsetHeight - rows[0].offsetTop;
    return span - this.canvas.offsetHeight + width * this.canvas.height / this.canvas.width;
  }

  // -- internals ------------------------------------------------------------------------------------------------------
  resize() {
    const scale = Math.min(1, PREVIEW_MAX / Math.max(this.state.width, this.state.height));
    this.canvas.width = Math.max(1, Math.round(this.state.width * scale));
    this.canvas.height = Math.max(1, Math.round(this.state.height * scale));
    this.scrubber.max = String(this.frameCount - 1);
  }

  loadFrame() {
    const url = this.options.frameUrl ? this.options.frameUrl(this.frame) : null;
    if (!url) { this.image = null; this.frameError = ""; this.showStatus(); this.render(); return; }
    const wanted = this.frame;
    const img = new Image();
    img.onload = () => { if (this.frame === wanted) { this.image = img; this.imageFrame = wanted; this.frameError = ""; this.showStatus(); this.render(); } };
    img.onerror = () => {
      if (this.frame !== wanted) return;
      this.image = null;
      this.frameError = `Frame ${wanted} could not be loaded from the server.`;
      this.showStatus();
      this.render();
    };
    img.src = url;
    this.render();
  }

  toState(e) {
    const r = this.canvas.getBoundingClientRect();
    return [(e.clientX - r.left) / r.width * this.state.width, (e.clientY - r.top) / r.height * this.state.height];
  }

  down(e) {
    if (e.button !== 0) return;
    e.preventDefault();
    e.stopPropagation();
    const [x, y] = this.toState(e);
    const id = newShapeId();
    if (this.tool === "brush" || this.tool === "eraser") {
      const shape = { id, type: this.tool, size: this.size, points: [[x, y]] };
      this.state = addShape(this.state, this.frame, shape);
      this.drag = { shape };
    } else if (this.tool === "rect") {
      const shape = { id, type: "rect", x, y, w: 0, h: 0 };
      this.state = addShape(this.state, this.frame, shape);
      this.drag = { shape, x, y };
    } else if (this.tool === "ellipse") {
      const shape = { id, type: "ellipse", cx: x, cy: y, rx: 0, ry: 0 };
      this.state = addShape(this.state, this.frame, shape);
      this.drag = { shape, x, y };
    } else if (this.tool === "move") {
      const hit = hitShape(this.state, this.frame, x, y);
      if (!hit) return;
      this.state = ensureKeyframe(this.state, this.frame);
      const shape = keyframeAt(this.state, this.frame).shapes.find((s) => s.id === hit.id);
      this.drag = { shape, original: shape, x, y };
    }
    this.render();
  }

  move(e) {
    if (!this.drag) return;
    const [x, y] = this.toState(e);
    const d = this.drag;
    let shape = d.shape;
    if (shape.type === "brush" || shape.type === "eraser") {
      const last = shape.points[shape.points.length - 1];
      if (Math.hypot(x - last[0], y - last[1]) < Math.max(1, shape.size / 8)) return;
      shape = { ...shape, points: [...shape.points, [x, y]] };
    } else if (this.tool === "move") {
      shape = translateShape(d.original, x - d.x, y - d.y);
    } else {
      shape = spanShape(shape, d.x, d.y, x, y);
    }
    d.shape = shape;
    this.state = replaceShape(this.state, this.frame, shape);
    this.scheduleRender();
  }

  up() {
    if (!this.drag) return;
    this.drag = null;
    this.commit(this.state);
  }

  commit(state) {
    this.state = state;
    this.options.onChange?.(serializeState(this.state));
    this.render();
  }

  scheduleRender() {
    if (this.pending) return;
    this.pending = true;
    const run = () => { this.pending = false; this.render(); };
    if (typeof requestAnimationFrame === "function") requestAnimationFrame(run); else setTimeout(run, 16);
  }

  render() {
    const { width, height } = this.canvas;
    const ctx = this.canvas.getContext("2d");
    ctx.clearRect(0, 0, width, height);
    if (this.image) ctx.drawImage(this.image, 0, 0, width, height);
    const mask = renderFrame(this.state, this.frame, width, height, { scale: width / this.state.width });
    const overlay = ctx.getImageData(0, 0, width, height);
    const px = overlay.data;
    for (let k = 0; k < mask.length; k++) {
      const a = mask[k] * 0.55;
      if (a <= 0) continue;
      px[4 * k] = px[4 * k] * (1 - a) + 255 * a;
      px[4 * k + 1] = px[4 * k + 1] * (1 - a);
      px[4 * k + 2] = px[4 * k + 2] * (1 - a);
      px[4 * k + 3] = Math.max(px[4 * k + 3], 255 * a);
    }
    ctx.putImageData(overlay, 0, 0);
    const keys = sortedKeyframes(this.state).map((kf) => (kf.frame === this.frame ? `[${kf.frame}]` : String(kf.frame)));
    const here = keyframeAt(this.state, this.frame) ? "keyframe" : "";
    this.label.textContent = `frame ${this.frame} / ${this.frameCount - 1} ${here} · shapes ${shapesAt(this.state, this.frame).length} · keyframes: ${keys.join(" ") || "none"}`;
  }
}
