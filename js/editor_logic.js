// Pure logic of the full-size video editor (js/mask_dialog.js): the view transform (zoom / pan), the undo stack,
// the H3 Track Mask `prompts` JSON (version 1, see below), the onion-skin frame choice, playback steps and colours.
// No DOM, no ComfyUI: tests/js/editor_logic.test.mjs runs it under node.
//
// `prompts` JSON (shared with the H3 Track Mask node, whose parser is backend/media/track_prompts.py):
//   {"version": 1, "objects": [{"id": 1,                                     // positive int, unique
//     "points": [{"frame": 0, "x": 120.5, "y": 80, "positive": true}],       // clicks (positive false: negative)
//     "boxes":  [{"frame": 0, "x0": 10, "y0": 20, "x1": 200, "y1": 160}]}]}   // at most one box per object per frame
// frame: 0-based index into the video's frames; coordinates: pixels of the source video frame (x right, y down,
// origin at the frame's top-left corner). The editor never rescales them to a model.

// -- view: screen = doc * scale + offset (CSS px inside the viewport; doc = the video's / drawing's pixels) ----------
export function fitView(docW, docH, viewW, viewH, margin = 12) {
  const w = Math.max(1, docW), h = Math.max(1, docH);
  const scale = Math.max(1e-3, Math.min((viewW - 2 * margin) / w, (viewH - 2 * margin) / h));
  return { scale, ox: (viewW - w * scale) / 2, oy: (viewH - h * scale) / 2 };
}

// How far the view may zoom: out to a quarter of the fitted size, in to 32 screen px per doc px (or 4x the fit).
export function zoomLimits(fit) {
  return { min: fit.scale / 4, max: Math.max(32, fit.scale * 4) };
}

export function toDoc(view, px, py) {
  return [(px - view.ox) / view.scale, (py - view.oy) / view.scale];
}

export function toScreen(view, x, y) {
  return [x * view.scale + view.ox, y * view.scale + view.oy];
}

// Zoom by `factor` about the screen point (px, py): the doc point under it stays under it.
export function zoomAt(view, factor, px, py, limits = { min: 1e-3, max: 1e3 }) {
  const scale = Math.min(limits.max, Math.max(limits.min, view.scale * factor));
  const [x, y] = toDoc(view, px, py);
  return { scale, ox: px - x * scale, oy: py - y * scale };
}

export function panBy(view, dx, dy) {
  return { ...view, ox: view.ox + dx, oy: view.oy + dy };
}

// The zoom factor of one wheel event (deltaY in pixels; a notch is ~100): smooth and symmetric (in then out = 1).
export function wheelFactor(deltaY) {
  return Math.pow(1.0015, -Math.max(-500, Math.min(500, Number(deltaY) || 0)));
}

export function insideDoc(x, y, docW, docH) {
  return x >= 0 && y >= 0 && x <= docW && y <= docH;
}

export function clampToDoc(x, y, docW, docH) {
  return [Math.min(docW, Math.max(0, x)), Math.min(docH, Math.max(0, y))];
}

// Brush size (doc pixels, what the drawing stores) as an integer in [1, 512]; the cursor ring's radius on screen.
export const BRUSH_MIN = 1, BRUSH_MAX = 512;
export function clampBrush(size, fallback = 32) {
  const v = Math.round(Number(size));
  if (!Number.isFinite(v)) return fallback;
  return Math.min(BRUSH_MAX, Math.max(BRUSH_MIN, v));
}

export function ringRadius(view, size) {
  return (size / 2) * view.scale;
}

// -- undo / redo over immutable snapshots (the editor keeps serialised states) ---------------------------------------
export class UndoStack {
  constructor(limit = 200) {
    this.limit = limit;
    this.past = [];
    this.future = [];
  }

  // `before` is the value as it was before an edit; a new edit drops what could be redone.
  record(before) {
    this.past.push(before);
    if (this.past.length > this.limit) this.past.shift();
    this.future = [];
  }

  get canUndo() { return this.past.length > 0; }
  get canRedo() { return this.future.length > 0; }

  // The value to go back to (and `current` becomes redoable), or undefined when there is nothing to undo.
  undo(current) {
    if (!this.past.length) return undefined;
    this.future.push(current);
    return this.past.pop();
  }

  redo(current) {
    if (!this.future.length) return undefined;
    this.past.push(current);
    return this.future.pop();
  }
}

// -- onion skin: the keyframes either side of a frame ---------------------------------------------------------------
// `keyFrames`: frame numbers that carry an edit (drawing keyframes, or frames with prompts). Returns up to `depth`
// of them before `frame` (nearest first) and after it; the frame itself is never its own onion skin.
export function onionFrames(keyFrames, frame, depth = 1) {
  const frames = [...new Set(keyFrames.map((f) => Math.trunc(f)))].sort((a, b) => a - b);
  const before = frames.filter((f) => f < frame).reverse().slice(0, Math.max(0, depth));
  const after = frames.filter((f) => f > frame).slice(0, Math.max(0, depth));
  return { before, after };
}

// The keyframe the "previous / next keyframe" buttons jump to (null when there is none that way).
export function adjacentKeyframe(keyFrames, frame, direction) {
  const { before, after } = onionFrames(keyFrames, frame, 1);
  return (direction < 0 ? before[0] : after[0]) ?? null;
}

// Playback: the frame after `frame` (by `delta`), wrapping at the clip's ends when `loop`.
export function stepFrame(frame, frameCount, delta = 1, loop = true) {
  const n = Math.max(1, Math.trunc(frameCount));
  const next = Math.trunc(frame) + Math.trunc(delta);
  if (loop) return ((next % n) + n) % n;
  return Math.min(n - 1, Math.max(0, next));
}

// -- colours --------------------------------------------------------------------------------------------------------
export function parseHexColour(text, fallback = [255, 0, 0]) {
  const m = /^#?([0-9a-f]{6}|[0-9a-f]{3})$/i.exec(String(text || "").trim());
  if (!m) return [...fallback];
  const hex = m[1].length === 3 ? [...m[1]].map((c) => c + c).join("") : m[1];
  return [0, 2, 4].map((k) => parseInt(hex.slice(k, k + 2), 16));
}

export function clampOpacity(value, fallback = 0.5) {
  const v = Number(value);
  return Number.isFinite(v) ? Math.min(1, Math.max(0, v)) : fallback;
}

const OBJECT_COLOURS = ["#ff4d4d", "#4da6ff", "#5cd65c", "#ffb84d", "#c266ff", "#4dffd2", "#ff66c2", "#d9d926"];
export function objectColour(id) {
  const k = Math.max(1, Math.trunc(id)) - 1;
  return OBJECT_COLOURS[k % OBJECT_COLOURS.length];
}

// -- Track Mask prompts ---------------------------------------------------------------------------------------------
export const PROMPTS_VERSION = 1;

export function emptyPrompts() {
  return { version: PROMPTS_VERSION, objects: [] };
}

const finite = (v) => typeof v === "number" ? Number.isFinite(v) : (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v)));

// Parse the `prompts` widget's text (or an object). "" is no prompts. Malformed input throws an Error that says what
// is wrong (the editor shows it and leaves the widget alone until the user edits).
export function parsePrompts(text) {
  let data = text;
  if (typeof text !== "object" || text === null) {
    const trimmed = String(text ?? "").trim();
    if (!trimmed) return emptyPrompts();
    try {
      data = JSON.parse(trimmed);
    } catch (err) {
      throw new Error(`prompts is not valid JSON (${err.message})`);
    }
  }
  if (!data || typeof data !== "object" || Array.isArray(data)) throw new Error("prompts must be a JSON object {version, objects}");
  if (data.version !== undefined && Number(data.version) !== PROMPTS_VERSION) {
    throw new Error(`prompts version ${data.version} is not supported (this editor writes version ${PROMPTS_VERSION})`);
  }
  const objects = data.objects ?? [];
  if (!Array.isArray(objects)) throw new Error("prompts.objects must be a list");
  const out = emptyPrompts();
  const seen = new Set();
  for (const obj of objects) {
    const id = Number(obj?.id);
    if (!Number.isInteger(id) || id < 1) throw new Error(`prompts: object id ${JSON.stringify(obj?.id)} is not a positive integer`);
    if (seen.has(id)) throw new Error(`prompts: object id ${id} appears twice`);
    seen.add(id);
    const points = [];
    for (const p of obj.points ?? []) {
      if (!p || !finite(p.frame) || !finite(p.x) || !finite(p.y)) throw new Error(`prompts: object ${id} has a click without frame / x / y numbers`);
      points.push({ frame: Math.max(0, Math.trunc(Number(p.frame))), x: Number(p.x), y: Number(p.y), positive: p.positive !== false });
    }
    const boxes = new Map();
    for (const b of obj.boxes ?? []) {
      if (!b || ![b.frame, b.x0, b.y0, b.x1, b.y1].every(finite)) throw new Error(`prompts: object ${id} has a box without frame / x0 / y0 / x1 / y1 numbers`);
      const frame = Math.max(0, Math.trunc(Number(b.frame)));
      boxes.set(frame, normalBox(frame, Number(b.x0), Number(b.y0), Number(b.x1), Number(b.y1)));  // one per frame: last wins
    }
    out.objects.push({ id, points, boxes: [...boxes.values()] });
  }
  return out;
}

function normalBox(frame, x0, y0, x1, y1) {
  return { frame, x0: Math.min(x0, x1), y0: Math.min(y0, y1), x1: Math.max(x0, x1), y1: Math.max(y0, y1) };
}

// What the widget stores: objects by id, each one's clicks and boxes by frame (stable), objects with nothing dropped.
export function serializePrompts(prompts) {
  const objects = [...prompts.objects]
    .filter((o) => o.points.length || o.boxes.length)
    .sort((a, b) => a.id - b.id)
    .map((o) => ({
      id: o.id,
      points: o.points.map((p, k) => [p, k]).sort((a, b) => a[0].frame - b[0].frame || a[1] - b[1])
        .map(([p]) => ({ frame: p.frame, x: round2(p.x), y: round2(p.y), positive: Boolean(p.positive) })),
      boxes: [...o.boxes].sort((a, b) => a.frame - b.frame)
        .map((b) => ({ frame: b.frame, x0: round2(b.x0), y0: round2(b.y0), x1: round2(b.x1), y1: round2(b.y1) })),
    }));
  return JSON.stringify({ version: PROMPTS_VERSION, objects });
}

// Sub-pixel detail beyond 1/100 px means nothing to a tracker; rounding keeps the saved JSON short.
function round2(v) {
  return Math.round(v * 100) / 100;
}

export function objectIds(prompts) {
  return prompts.objects.map((o) => o.id).sort((a, b) => a - b);
}

// An id for a new object: one past the largest in use (`extra`: ids the editor holds that have no prompt yet).
export function nextObjectId(prompts, extra = []) {
  return Math.max(0, ...objectIds(prompts), ...extra) + 1;
}

function withObject(prompts, id, edit) {
  const has = prompts.objects.some((o) => o.id === id);
  const objects = has ? prompts.objects : [...prompts.objects, { id, points: [], boxes: [] }];
  return { ...prompts, objects: objects.map((o) => (o.id === id ? edit(o) : o)) };
}

export function addPoint(prompts, id, frame, x, y, positive = true) {
  return withObject(prompts, id, (o) => ({ ...o, points: [...o.points, { frame, x, y, positive: Boolean(positive) }] }));
}

export function movePoint(prompts, id, index, x, y) {
  return withObject(prompts, id, (o) => ({ ...o, points: o.points.map((p, k) => (k === index ? { ...p, x, y } : p)) }));
}

// The object's box on `frame` (replacing the one it had there).
export function setBox(prompts, id, frame, x0, y0, x1, y1) {
  const box = normalBox(frame, x0, y0, x1, y1);
  return withObject(prompts, id, (o) => ({ ...o, boxes: [...o.boxes.filter((b) => b.frame !== frame), box] }));
}

export function removeObject(prompts, id) {
  return { ...prompts, objects: prompts.objects.filter((o) => o.id !== id) };
}

// Remove the prompts on `frame` of object `id` (every object when id is null).
export function clearFramePrompts(prompts, frame, id = null) {
  return {
    ...prompts,
    objects: prompts.objects.map((o) => (id !== null && o.id !== id ? o
      : { ...o, points: o.points.filter((p) => p.frame !== frame), boxes: o.boxes.filter((b) => b.frame !== frame) })),
  };
}

// The prompt nearest (x, y) on `frame` within `radius` (doc px): a click by its distance, a box by its edge or its
// inside. Returns {id, kind: "point" | "box", index} (index into that object's list) or null.
export function nearestPrompt(prompts, frame, x, y, radius) {
  let best = null;
  const consider = (d, ref) => { if (d <= radius && (!best || d < best.d)) best = { d, ref }; };
  for (const o of prompts.objects) {
    o.points.forEach((p, index) => { if (p.frame === frame) consider(Math.hypot(p.x - x, p.y - y), { id: o.id, kind: "point", index }); });
    o.boxes.forEach((b, index) => {
      if (b.frame !== frame) return;
      const inside = x >= b.x0 && x <= b.x1 && y >= b.y0 && y <= b.y1;
      const dx = Math.max(b.x0 - x, 0, x - b.x1), dy = Math.max(b.y0 - y, 0, y - b.y1);
      const edge = inside ? Math.min(x - b.x0, b.x1 - x, y - b.y0, b.y1 - y) : Math.hypot(dx, dy);
      // a click on a point inside a box picks the point: boxes count a little farther than their edge distance
      consider(edge + (inside ? radius / 2 : 0), { id: o.id, kind: "box", index });
    });
  }
  return best ? best.ref : null;
}

export function removePrompt(prompts, ref) {
  if (!ref) return prompts;
  return withObject(prompts, ref.id, (o) => (ref.kind === "point"
    ? { ...o, points: o.points.filter((_, k) => k !== ref.index) }
    : { ...o, boxes: o.boxes.filter((_, k) => k !== ref.index) }));
}

export function promptFrames(prompts) {
  const frames = new Set();
  for (const o of prompts.objects) {
    for (const p of o.points) frames.add(p.frame);
    for (const b of o.boxes) frames.add(b.frame);
  }
  return [...frames].sort((a, b) => a - b);
}

// The clicks and boxes on `frame`: [{id, points: [...], boxes: [...]}] for the objects that have any there.
export function promptsOn(prompts, frame) {
  return prompts.objects
    .map((o) => ({ id: o.id, points: o.points.filter((p) => p.frame === frame), boxes: o.boxes.filter((b) => b.frame === frame) }))
    .filter((o) => o.points.length || o.boxes.length);
}

// One line for the node: "2 objects · 3 clicks (1 negative) · 1 box · frames 0, 12".
export function promptSummary(prompts) {
  const objects = prompts.objects.filter((o) => o.points.length || o.boxes.length);
  if (!objects.length) return "no clicks or boxes";
  const points = objects.flatMap((o) => o.points);
  const negative = points.filter((p) => !p.positive).length;
  const boxes = objects.reduce((n, o) => n + o.boxes.length, 0);
  const frames = promptFrames(prompts);
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const parts = [plural(objects.length, "object")];
  if (points.length) parts.push(plural(points.length, "click") + (negative ? ` (${negative} negative)` : ""));
  if (boxes) parts.push(boxes === 1 ? "1 box" : `${boxes} boxes`);
  const shown = frames.slice(0, 8).join(", ") + (frames.length > 8 ? ", …" : "");
  parts.push(`${frames.length === 1 ? "frame" : "frames"} ${shown}`);
  return parts.join(" · ");
}
