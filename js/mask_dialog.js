// The full-size video mask editor: a dialog over the whole window (like ComfyUI's own mask editor) with the frame
// scrubber, play / pause, zoom and pan, the brush size as a number and as a cursor ring, onion skins of the
// neighbouring keyframes, tint colour and opacity, undo / redo, and either the H3 Mask Draw drawing tools (mode "mask":
// edits the mask_state JSON of js/mask_logic.js) or the H3 Track Mask prompt tools (mode "prompts": clicks + / -,
// boxes and an object picker, editing the prompts JSON of js/editor_logic.js). Plain DOM, no ComfyUI imports: the
// glue (mask_draw.js, track_mask_editor.js) opens it; the logic it relies on is in editor_logic.js / mask_logic.js.
// Grow / feather / invert are the node's widgets, not controls here: the dialog shows what is drawn.
//
//   const dialog = new VideoEditorDialog({
//     mode: "mask" | "prompts", title,
//     value,                          // the widget's JSON text
//     video: {width, height, frameCount, fps} | null, status: "why there are no frames" (optional),
//     frameUrl: (n, maxSize) => url | null,
//     onChange: (json) => {},         // after every finished edit, undo and redo: the widget's new text
//     onClose: () => {},
//   });

import { drawLayer, drawPrompts, drawTicks } from "./dialog_draw.js";
import { TOOL_KEYS, buildDialog } from "./dialog_view.js";
import { el } from "./dom.js";
import {
  UndoStack, addPoint, adjacentKeyframe, clampBrush, clampOpacity, clampToDoc, emptyPrompts,
  fitView, insideDoc, movePoint, nearestPrompt, objectColour, objectIds, onionFrames, panBy, parsePrompts,
  promptFrames, promptSummary, promptsOn, removePrompt, ringRadius, serializePrompts, setBox, stepFrame,
  toDoc, wheelFactor, zoomAt, zoomLimits,
} from "./editor_logic.js";
import {
  addShape, ensureKeyframe, hitShape, keyframeAt, newShapeId, parseState, replaceShape,
  serializeState, shapesAt, sortedKeyframes, spanShape, translateShape,
} from "./mask_logic.js";

const ONION_COLOURS = { before: "#3fa9ff", after: "#ffd23f" };
const PREFS_KEY = "comfyui_h3.videoEditor";
const DEFAULT_PREFS = { tint: "#ff2020", opacity: 0.5, onion: true, onionDepth: 1, size: 32 };
const FRAME_CACHE = 48;

function loadPrefs() {
  try {
    return { ...DEFAULT_PREFS, ...JSON.parse(globalThis.localStorage?.getItem(PREFS_KEY) || "{}") };
  } catch {
    return { ...DEFAULT_PREFS };
  }
}


export class VideoEditorDialog {
  constructor(options) {
    this.options = options;
    this.mode = options.mode === "prompts" ? "prompts" : "mask";
    this.prefs = loadPrefs();
    this.size = clampBrush(this.prefs.size);
    this.tool = this.mode === "mask" ? "brush" : "point-pos";
    this.frame = 0;
    this.history = new UndoStack();
    this.frames = new Map();  // frame -> {img, ok: true | false | null (loading)}
    this.pointer = null;  // last pointer position over the viewport (CSS px), for the cursor ring
    this.drag = null;
    this.playing = false;
    this.spaceDown = false;
    this.parseError = "";
    this.current = options.value ?? "";
    this.model = this.parse(this.current);
    this.video = null;
    this.frameCount = 1;
    this.objectId = this.mode === "prompts" ? (objectIds(this.model)[0] ?? 1) : null;
    this.build();
    this.setVideo(options.video || null, options.status || "");
    this.listen();
  }

  // -- the value being edited ----------------------------------------------------------------------------------------
  parse(text) {
    if (this.mode === "mask") return parseState(text);
    try {
      this.parseError = "";
      return parsePrompts(text);
    } catch (err) {
      this.parseError = `The node's prompts could not be read (${err.message}); your first edit here replaces them.`;
      return emptyPrompts();
    }
  }

  serialize(model) {
    return this.mode === "mask" ? serializeState(model) : serializePrompts(model);
  }

  // Doc space: the drawing's own pixel space (mask) or the source video's pixels (prompts).
  get docSize() {
    if (this.mode === "mask") return [this.model.width, this.model.height];
    return this.video ? [this.video.width, this.video.height] : [0, 0];
  }

  keyFrames() {
    return this.mode === "mask" ? sortedKeyframes(this.model).map((kf) => kf.frame) : promptFrames(this.model);
  }

  commit(next) {
    const json = this.serialize(next);
    this.model = next;
    if (json !== this.current) {
      this.history.record(this.current);
      this.current = json;
      this.parseError = "";
      this.options.onChange?.(json);
    }
    this.refresh();
  }

  undo() { this.travel(this.history.undo(this.current)); }
  redo() { this.travel(this.history.redo(this.current)); }

  travel(value) {
    if (value === undefined || this.drag) return;
    this.current = value;
    this.model = this.parse(value);
    this.options.onChange?.(value);
    if (this.mode === "prompts" && !objectIds(this.model).includes(this.objectId) && objectIds(this.model).length) {
      this.objectId = objectIds(this.model)[0];
    }
    this.refresh();
  }

  // -- external updates ----------------------------------------------------------------------------------------------
  // The video's size and frame count (null: unknown, with `status` saying why).
  setVideo(video, status = "") {
    this.video = video && video.width > 0 && video.height > 0 ? { fps: 24, ...video } : null;
    this.frameCount = Math.max(1, this.video?.frameCount || 1);
    this.frame = Math.min(this.frame, this.frameCount - 1);
    this.hostStatus = status;
    this.frames.clear();
    // An empty drawing takes the video's size (as the node's editor does); shapes keep their own space.
    if (this.mode === "mask" && this.video && !this.model.keyframes.length
        && (this.model.width !== this.video.width || this.model.height !== this.video.height)) {
      this.model = { ...this.model, width: this.video.width, height: this.video.height };
    }
    this.scrubber.max = String(this.frameCount - 1);
    this.scrubber.value = String(this.frame);
    this.fitted = true;
    this.layout();
    this.refresh();
  }

  // -- DOM ----------------------------------------------------------------------------------------------------------
  build() {
    buildDialog(this);
  }

  listen() {
    const c = this.canvas;
    c.addEventListener("pointerdown", (e) => this.down(e));
    c.addEventListener("pointermove", (e) => this.move(e));
    c.addEventListener("pointerup", (e) => this.up(e));
    c.addEventListener("pointercancel", (e) => this.up(e));
    c.addEventListener("pointerleave", () => { this.pointer = null; this.scheduleRender(); });
    c.addEventListener("contextmenu", (e) => e.preventDefault());
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [px, py] = this.local(e);
      this.view_ = zoomAt(this.view_, wheelFactor(e.deltaMode === 1 ? e.deltaY * 33 : e.deltaY), px, py, this.limits);
      this.fitted = false;
      this.render();
    }, { passive: false });
    // The graph canvas and ComfyUI's shortcuts below must not see what happens in the dialog.
    for (const type of ["pointerdown", "mousedown", "wheel", "click", "dblclick"]) {
      this.overlay.addEventListener(type, (e) => e.stopPropagation());
    }
    this.keyHandler = (e) => this.key(e);
    this.keyUpHandler = (e) => {
      if (e.code === "Space" && this.spaceDown) {
        this.spaceDown = false;
        if (!this.spaceUsed && !this.inField(e)) this.togglePlay();
        e.stopPropagation();
      }
    };
    window.addEventListener("keydown", this.keyHandler, true);
    window.addEventListener("keyup", this.keyUpHandler, true);
    this.resizeObserver = typeof ResizeObserver === "function" ? new ResizeObserver(() => this.layout()) : null;
    this.resizeObserver?.observe(this.view);
    this.windowResize = () => this.layout();
    window.addEventListener("resize", this.windowResize);
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.pause();
    window.removeEventListener("keydown", this.keyHandler, true);
    window.removeEventListener("keyup", this.keyUpHandler, true);
    window.removeEventListener("resize", this.windowResize);
    this.resizeObserver?.disconnect();
    this.overlay.remove();
    this.options.onClose?.();
  }

  savePrefs() {
    try { globalThis.localStorage?.setItem(PREFS_KEY, JSON.stringify(this.prefs)); } catch { /* private mode: not kept */ }
  }

  inField(e) {
    const t = e.target;
    return t instanceof HTMLElement && (t.tagName === "TEXTAREA" || (t.tagName === "INPUT" && ["number", "text"].includes(t.type)));
  }

  key(e) {
    if (this.closed) return;
    e.stopPropagation();  // ComfyUI's shortcuts (Delete, Ctrl+Z on the graph, ...) stay off while the dialog is open
    const mod = e.ctrlKey || e.metaKey;
    if (e.key === "Escape") { e.preventDefault(); this.close(); return; }
    if (this.inField(e)) return;  // typing a number
    const k = e.key.toLowerCase();
    if (mod && k === "z") { e.preventDefault(); if (e.shiftKey) this.redo(); else this.undo(); return; }
    if (mod && k === "y") { e.preventDefault(); this.redo(); return; }
    if (mod) return;
    if (e.code === "Space") {
      e.preventDefault();
      if (!e.repeat) { this.spaceDown = true; this.spaceUsed = false; }
      return;
    }
    if (e.target === this.scrubber && ["ArrowLeft", "ArrowRight", "Home", "End", "PageUp", "PageDown"].includes(e.key)) return;
    if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
      e.preventDefault();
      const dir = e.key === "ArrowLeft" ? -1 : 1;
      if (e.shiftKey) this.jumpKey(dir); else this.setFrame(this.frame + dir);
      return;
    }
    if (e.key === "[" || e.key === "]") { this.setSize(e.key === "[" ? Math.floor(this.size / 1.2) : Math.ceil(this.size * 1.2)); return; }
    if (k === "f") { this.fit(); return; }
    const tool = TOOL_KEYS[k];
    if (tool && this.toolButtons[tool]) this.setTool(tool);
  }

  // -- controls -------------------------------------------------------------------------------------------------------
  setTool(name) {
    this.tool = name;
    for (const [k, b] of Object.entries(this.toolButtons)) b.classList.toggle("h3-ve-on", k === name);
    this.updateCursor();
    this.render();
  }

  setSize(value) {
    this.size = clampBrush(value, this.size);
    if (this.sizeBox) this.sizeBox.value = String(this.size);
    if (this.sizeRange) this.sizeRange.value = String(Math.min(256, this.size));
    this.prefs.size = this.size;
    this.savePrefs();
    this.scheduleRender();
  }

  setFrame(n) {
    if (this.drag && this.drag.kind !== "pan") { this.scrubber.value = String(this.frame); return; }  // mid-stroke
    const frame = Math.max(0, Math.min(this.frameCount - 1, Math.trunc(Number(n) || 0)));
    this.frame = frame;
    this.scrubber.value = String(frame);
    this.refresh();
  }

  jumpKey(direction) {
    const f = adjacentKeyframe(this.keyFrames(), this.frame, direction);
    if (f !== null) this.setFrame(f);
  }

  togglePlay() {
    if (this.playing) this.pause(); else this.play();
  }

  play() {
    if (this.playing || this.frameCount < 2) return;
    this.playing = true;
    this.playButton.textContent = "❚❚";
    this.playButton.setAttribute("data-playing", "true");
    const tick = () => {
      if (!this.playing) return;
      // Wait for the frame on screen before moving on: playback runs at the clip's rate or as fast as frames arrive.
      const entry = this.frames.get(this.frame);
      if (!this.frameSource() || (entry && entry.ok !== null)) this.setFrame(stepFrame(this.frame, this.frameCount, 1, true));
      this.playTimer = setTimeout(tick, 1000 / (this.video?.fps || 24));
    };
    this.playTimer = setTimeout(tick, 1000 / (this.video?.fps || 24));
  }

  pause() {
    this.playing = false;
    clearTimeout(this.playTimer);
    if (this.playButton) { this.playButton.textContent = "▶"; this.playButton.removeAttribute("data-playing"); }
  }

  fit() {
    this.fitted = true;
    this.view_ = this.fitView();
    this.render();
  }

  zoomTo(scale) {
    const { width, height } = this.viewSize;
    this.zoomBy(scale / this.view_.scale, width / 2, height / 2);
  }

  zoomBy(factor, px, py) {
    const { width, height } = this.viewSize;
    this.view_ = zoomAt(this.view_, factor, px ?? width / 2, py ?? height / 2, this.limits);
    this.fitted = false;
    this.render();
  }

  fitView() {
    const [w, h] = this.docSize;
    const { width, height } = this.viewSize;
    return fitView(w || 16, h || 9, width, height);
  }

  layout() {
    const r = this.view.getBoundingClientRect();
    this.viewSize = { width: Math.max(1, r.width), height: Math.max(1, r.height) };
    const dpr = window.devicePixelRatio || 1;
    for (const c of [this.canvas, this.layer, this.rimLayer]) {
      c.width = Math.round(this.viewSize.width * dpr);
      c.height = Math.round(this.viewSize.height * dpr);
    }
    const fit = this.fitView();
    this.limits = zoomLimits(fit);
    if (this.fitted || !this.view_) this.view_ = fit;
    const tr = this.ticks.getBoundingClientRect();
    this.ticks.width = Math.max(1, Math.round(tr.width * dpr));
    this.ticks.height = Math.max(1, Math.round(tr.height * dpr));
    this.render();
  }

  updateCursor() {
    const panning = this.tool === "pan" || this.spaceDown || this.drag?.kind === "pan";
    this.canvas.style.cursor = panning ? (this.drag ? "grabbing" : "grab")
      : (this.tool === "brush" || this.tool === "eraser") ? "none" : "crosshair";
  }

  // -- pointer ---------------------------------------------------------------------------------------------------------
  local(e) {
    const r = this.canvas.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }

  down(e) {
    if (this.closed || this.drag) return;
    e.preventDefault();
    this.canvas.focus({ preventScroll: true });  // out of the size box: keys (Ctrl+Z, arrows) act on the drawing again
    this.canvas.setPointerCapture?.(e.pointerId);
    const [px, py] = this.local(e);
    this.pointer = [px, py];
    if (e.button === 1 || (e.button === 0 && (this.tool === "pan" || this.spaceDown))) {
      this.spaceUsed = true;
      this.drag = { kind: "pan", px, py };
      this.updateCursor();
      return;
    }
    if (e.button !== 0) return;
    this.pause();  // an edit belongs to the frame it started on
    const [x, y] = toDoc(this.view_, px, py);
    const [w, h] = this.docSize;
    if (this.mode === "mask") this.downMask(x, y);
    else if (w && h) this.downPrompt(x, y, w, h);
    this.render();
  }

  downMask(x, y) {
    const round = (v) => Math.round(v * 100) / 100;
    x = round(x); y = round(y);
    const id = newShapeId();
    const t = this.tool;
    if (t === "brush" || t === "eraser") {
      const shape = { id, type: t, size: this.size, points: [[x, y]] };
      this.model = addShape(this.model, this.frame, shape);
      this.drag = { kind: "shape", shape, frame: this.frame };
    } else if (t === "rect" || t === "ellipse") {
      const shape = t === "rect" ? { id, type: "rect", x, y, w: 0, h: 0 } : { id, type: "ellipse", cx: x, cy: y, rx: 0, ry: 0 };
      this.model = addShape(this.model, this.frame, shape);
      this.drag = { kind: "shape", shape, x, y, frame: this.frame };
    } else if (t === "move") {
      const hit = hitShape(this.model, this.frame, x, y);
      if (!hit) return;
      this.model = ensureKeyframe(this.model, this.frame);
      const shape = keyframeAt(this.model, this.frame).shapes.find((s) => s.id === hit.id);
      this.drag = { kind: "shape", shape, original: shape, x, y, moving: true, frame: this.frame };
    }
  }

  downPrompt(x, y, w, h) {
    const t = this.tool;
    if (t === "remove-prompt") {
      const ref = nearestPrompt(this.model, this.frame, x, y, 12 / this.view_.scale);
      if (ref) this.commit(removePrompt(this.model, ref));
      return;
    }
    if (!insideDoc(x, y, w, h)) return;  // a prompt belongs on the frame
    if (t === "point-pos" || t === "point-neg") {
      this.model = addPoint(this.model, this.objectId, this.frame, x, y, t === "point-pos");
      const obj = this.model.objects.find((o) => o.id === this.objectId);
      this.drag = { kind: "point", index: obj.points.length - 1, id: this.objectId, frame: this.frame };
    } else if (t === "box") {
      this.drag = { kind: "box", base: this.model, x, y, id: this.objectId, frame: this.frame };
    }
  }

  move(e) {
    const [px, py] = this.local(e);
    this.pointer = [px, py];
    const d = this.drag;
    if (!d) { this.scheduleRender(); return; }
    if (d.kind === "pan") {
      this.view_ = panBy(this.view_, px - d.px, py - d.py);
      d.px = px; d.py = py;
      this.fitted = false;
      this.scheduleRender();
      return;
    }
    let [x, y] = toDoc(this.view_, px, py);
    if (d.kind === "shape") {
      const round = (v) => Math.round(v * 100) / 100;
      x = round(x); y = round(y);
      let shape = d.shape;
      if (shape.type === "brush" || shape.type === "eraser") {
        const last = shape.points[shape.points.length - 1];
        // a new point every few screen pixels (or size / 8 doc px): smooth at any zoom, short JSON
        if (Math.hypot(x - last[0], y - last[1]) < Math.max(0.25, Math.min(shape.size / 8, 3 / this.view_.scale))) return;
        shape = { ...shape, points: [...shape.points, [x, y]] };
      } else if (d.moving) {
        shape = translateShape(d.original, x - d.x, y - d.y);
      } else {
        shape = spanShape(shape, d.x, d.y, x, y);
      }
      d.shape = shape;
      this.model = replaceShape(this.model, d.frame, shape);
    } else {
      const [w, h] = this.docSize;
      [x, y] = clampToDoc(x, y, w, h);
      if (d.kind === "point") this.model = movePoint(this.model, d.id, d.index, x, y);
      else if (d.kind === "box") this.model = setBox(d.base, d.id, d.frame, d.x, d.y, x, y);
    }
    this.scheduleRender();
  }

  up(e) {
    const d = this.drag;
    if (!d) return;
    this.drag = null;
    this.canvas.releasePointerCapture?.(e.pointerId);
    this.updateCursor();
    if (d.kind === "pan") return;
    if (d.kind === "box") {
      const box = this.model.objects.find((o) => o.id === d.id)?.boxes.find((b) => b.frame === d.frame);
      // a click without a drag is not a box (and leaves the frame's box as it was)
      if (!box || d.base === this.model || Math.min(box.x1 - box.x0, box.y1 - box.y0) * this.view_.scale < 3) {
        this.model = d.base;
        this.render();
        return;
      }
    }
    this.commit(this.model);
  }

  // -- frames ---------------------------------------------------------------------------------------------------------
  frameSource() {
    return Boolean(this.video && this.options.frameUrl);
  }

  frameImage(n) {
    if (!this.frameSource()) return null;
    let entry = this.frames.get(n);
    if (entry) {  // most recently used last
      this.frames.delete(n);
      this.frames.set(n, entry);
      return entry;
    }
    const maxSize = Math.max(16, Math.min(2048, Math.max(this.video.width, this.video.height)));
    const url = this.options.frameUrl(n, maxSize);
    if (!url) return null;
    const img = new Image();
    entry = { img, ok: null };
    img.onload = () => { entry.ok = true; if (n === this.frame) this.refresh(); };
    img.onerror = () => { entry.ok = false; if (n === this.frame) this.refresh(); };
    img.src = url;
    this.frames.set(n, entry);
    while (this.frames.size > FRAME_CACHE) this.frames.delete(this.frames.keys().next().value);
    return entry;
  }

  // -- drawing --------------------------------------------------------------------------------------------------------
  refresh() {
    this.undoButton.disabled = !this.history.canUndo;
    this.redoButton.disabled = !this.history.canRedo;
    if (this.mode === "prompts") {
      const ids = [...new Set([...objectIds(this.model), this.objectId])].sort((a, b) => a - b);
      const key = ids.join(",") + "|" + this.objectId;
      if (this.objectKey !== key) {
        this.objectKey = key;
        this.objectSelect.replaceChildren(...ids.map((id) => {
          const o = el("option", { value: String(id), style: `color:${objectColour(id)}` }, [`● object ${id}`]);
          o.selected = id === this.objectId;
          return o;
        }));
        this.objectSelect.style.color = objectColour(this.objectId);
      }
      this.summary.textContent = promptSummary(this.model);
    } else {
      const n = this.model.keyframes.length;
      this.summary.textContent = `${n} keyframe${n === 1 ? "" : "s"} · drawing ${this.model.width} × ${this.model.height}`;
    }
    this.render();
  }

  scheduleRender() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.render(); });
  }

  render() {
    if (!this.view_ || this.closed) return;
    const dpr = window.devicePixelRatio || 1;
    const ctx = this.canvas.getContext("2d");
    const v = this.view_;
    const [w, h] = this.docSize;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = "#0d0d0e";
    ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
    const toCanvas = () => ctx.setTransform(dpr * v.scale, 0, 0, dpr * v.scale, dpr * v.ox, dpr * v.oy);
    let frameNote = "";
    if (w && h) {
      toCanvas();
      const entry = this.frameImage(this.frame);
      ctx.imageSmoothingEnabled = v.scale < 2;  // zoomed in: see the pixels
      if (entry?.ok) ctx.drawImage(entry.img, 0, 0, w, h);
      else {
        ctx.fillStyle = "#26262a";
        ctx.fillRect(0, 0, w, h);
        if (entry?.ok === false) frameNote = `Frame ${this.frame} could not be loaded from the server.`;
        else if (entry) frameNote = "";
      }
      // prefetch the next frames while playing or stepping
      for (let k = 1; k <= (this.playing ? 3 : 1); k++) if (this.frame + k < this.frameCount) this.frameImage(this.frame + k);
      const onion = this.prefs.onion ? onionFrames(this.keyFrames(), this.frame, this.prefs.onionDepth) : { before: [], after: [] };
      if (this.mode === "mask") this.renderMask(ctx, onion, dpr);
      else this.renderPrompts(ctx, onion, dpr);
      toCanvas();
      ctx.lineWidth = 1 / v.scale;
      ctx.strokeStyle = "rgba(255,255,255,0.35)";
      ctx.strokeRect(0, 0, w, h);
    }
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    if (this.pointer && !this.drag?.kind?.startsWith("pan") && this.mode === "mask" && (this.tool === "brush" || this.tool === "eraser")) {
      const [px, py] = this.pointer;
      const r = Math.max(1, ringRadius(v, this.size)) * dpr;
      ctx.lineWidth = 3 * dpr;
      ctx.strokeStyle = "rgba(0,0,0,0.8)";
      ctx.beginPath(); ctx.arc(px * dpr, py * dpr, r, 0, 2 * Math.PI); ctx.stroke();
      ctx.lineWidth = 1.2 * dpr;
      ctx.strokeStyle = this.tool === "eraser" ? "#8cf" : "#fff";
      ctx.beginPath(); ctx.arc(px * dpr, py * dpr, r, 0, 2 * Math.PI); ctx.stroke();
      ctx.font = `${11 * dpr}px sans-serif`;
      ctx.fillStyle = "#fff";
      ctx.fillText(String(this.size), px * dpr + r + 4 * dpr, py * dpr - 4 * dpr);
    }
    this.zoomLabel.textContent = w && h ? `${Math.round(v.scale * 100)}%` : "–";
    drawTicks(this.ticks, this.frameCount, this.keyFrames(), this.frame);
    this.renderLabels(frameNote);
  }

  renderMask(ctx, onion, dpr) {
    drawLayer(ctx, this.layer, this.rimLayer, this.view_, shapesAt(this.model, this.frame), this.prefs.tint, clampOpacity(this.prefs.opacity), dpr);
    // over the current mask, nearest last: a keyframe that holds the same shapes still shows its edge
    [...onion.before.map((f, k) => [f, k, ONION_COLOURS.before]), ...onion.after.map((f, k) => [f, k, ONION_COLOURS.after])]
      .sort((a, b) => b[1] - a[1])
      .forEach(([f, k, colour]) => drawLayer(ctx, this.layer, this.rimLayer, this.view_, shapesAt(this.model, f), colour, 0.9 / (k + 1), dpr, true));
  }

  renderPrompts(ctx, onion, dpr) {
    const v = this.view_;
    const frames = [...onion.before.map((f, k) => [f, 0.45 / (k + 1)]), ...onion.after.map((f, k) => [f, 0.45 / (k + 1)])];
    for (const [f, alpha] of frames) for (const o of promptsOn(this.model, f)) drawPrompts(ctx, o, alpha, dpr, v, true, o.id === this.objectId);
    for (const o of promptsOn(this.model, this.frame)) drawPrompts(ctx, o, 1, dpr, v, false, o.id === this.objectId);
  }

  renderLabels(frameNote) {
    const keyHere = this.keyFrames().includes(this.frame);
    let here;
    if (this.mode === "mask") here = `${shapesAt(this.model, this.frame).length} shapes`;
    else {
      const on = promptsOn(this.model, this.frame);
      const clicks = on.reduce((a, o) => a + o.points.length, 0), boxes = on.reduce((a, o) => a + o.boxes.length, 0);
      here = `${clicks} click${clicks === 1 ? "" : "s"}, ${boxes} box${boxes === 1 ? "" : "es"} here`;
    }
    this.frameLabel.textContent = `frame ${this.frame} / ${this.frameCount - 1}${keyHere ? " · keyframe" : ""} · ${here}`;
    const warn = [this.hostStatus, this.parseError, frameNote].filter(Boolean);
    if (this.mode === "prompts" && !this.docSize[0]) {
      warn.push(this.hostStatus ? "Clicks and boxes need the video's frames."
        : "Clicks and boxes need the video's frames: connect an H3 Load Video to the node's video input.");
    }
    const hint = "wheel: zoom · middle-drag or Space+drag: pan · Space: play · ← →: frames · [ ]: brush size · Ctrl+Z / Ctrl+Y: undo / redo · Esc: close";
    const text = warn.length ? warn.join(" ") : hint;
    if (this.status.textContent !== text) this.status.textContent = text;
    this.status.classList.toggle("h3-ve-warn", warn.length > 0);
  }
}
