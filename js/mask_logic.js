// Pure mask logic of H3 Mask Draw, shared by the widget (live preview) and the tests. No DOM, no ComfyUI.
// It mirrors backend/media/mask_raster.py rule for rule; that module's docstring states the state JSON schema
// (version 1: {version, width, height, grow, feather, invert, keyframes: [{frame, shapes: [...]}]}) and the rules.
// Change both together: tests/nodes/test_mask_nodes.py runs this file under node and compares the masks.

export const SCHEMA_VERSION = 1;
export const SHAPE_TYPES = ["brush", "eraser", "rect", "ellipse"];
const INTERP_KEYS = { rect: ["x", "y", "w", "h"], ellipse: ["cx", "cy", "rx", "ry"] };

export function emptyState(width = 512, height = 512) {
  return { version: SCHEMA_VERSION, width, height, grow: 0, feather: 0, invert: false, keyframes: [] };
}

export function parseState(text) {
  if (text && typeof text === "object") return normalizeState(text);
  const trimmed = (text || "").trim();
  if (!trimmed) return emptyState();
  return normalizeState(JSON.parse(trimmed));
}

function normalizeState(state) {
  const out = emptyState(Number(state.width) || 512, Number(state.height) || 512);
  out.grow = Number(state.grow) || 0;
  out.feather = Number(state.feather) || 0;
  out.invert = Boolean(state.invert);
  out.keyframes = (Array.isArray(state.keyframes) ? state.keyframes : [])
    .filter((kf) => kf && Array.isArray(kf.shapes))
    .map((kf) => ({ frame: Math.trunc(Number(kf.frame) || 0), shapes: kf.shapes.filter((s) => s && SHAPE_TYPES.includes(s.type)) }));
  return out;
}

// A grow / feather value as the node's widget holds it: an integer inside the widget's [min, max] (the host passes
// the limits it reads off the widget; ComfyUI refuses a prompt with anything outside them). Not a number: `fallback`.
export function clampSetting(value, limits = {}, fallback = 0) {
  let v = Math.trunc(Number(value));
  if (!Number.isFinite(v)) v = Math.trunc(Number(fallback)) || 0;
  if (Number.isFinite(limits?.min)) v = Math.max(Math.ceil(limits.min), v);
  if (Number.isFinite(limits?.max)) v = Math.min(Math.floor(limits.max), v);
  return v;
}

// Stable serialisation (what goes into the mask_state widget): keyframes sorted by frame.
export function serializeState(state) {
  const copy = { ...state, keyframes: sortedKeyframes(state) };
  return JSON.stringify(copy);
}

export function sortedKeyframes(state) {
  return [...(state.keyframes || [])].sort((a, b) => a.frame - b.frame);
}

export function keyframeAt(state, frame) {
  return (state.keyframes || []).find((kf) => kf.frame === frame) || null;
}

// Shapes on frame t: strokes held until the next keyframe, rect/ellipse with the same id (and type) in the next
// keyframe linearly interpolated.
export function shapesAt(state, t) {
  const kfs = sortedKeyframes(state);
  if (!kfs.length) return [];
  let idx = -1;
  kfs.forEach((kf, k) => { if (kf.frame <= t) idx = k; });
  if (idx < 0) return [...kfs[0].shapes];
  const k0 = kfs[idx];
  const k1 = idx + 1 < kfs.length ? kfs[idx + 1] : null;
  if (!k1) return [...k0.shapes];
  const a = (t - k0.frame) / (k1.frame - k0.frame);
  const next = new Map(k1.shapes.map((s) => [`${s.id}\u0000${s.type}`, s]));
  return k0.shapes.map((shape) => {
    const keys = INTERP_KEYS[shape.type];
    const other = keys && shape.id != null ? next.get(`${shape.id}\u0000${shape.type}`) : null;
    if (!other) return shape;
    const moved = { ...shape };
    for (const key of keys) {
      const p0 = Number(shape[key] || 0), p1 = Number(other[key] || 0);
      moved[key] = p0 + (p1 - p0) * a;
    }
    return moved;
  });
}

function span(lo, hi, scale, n) {
  const a = Math.max(0, Math.floor(lo * scale - 0.5) - 1);
  const b = Math.min(n, Math.ceil(hi * scale - 0.5) + 2);
  return [a, Math.max(a, b)];
}

// Paint one shape into a Float32Array [H*W] (row-major), per the rules of mask_raster.py.
export function paintShape(out, shape, sw, sh, width, height) {
  const kind = shape.type;
  const sx = width / sw, sy = height / sh;
  let x0, x1, y0, y1, cx, cy, rx, ry, pts, r;
  if (kind === "rect") {
    const x = Number(shape.x || 0), y = Number(shape.y || 0), w = Number(shape.w || 0), h = Number(shape.h || 0);
    x0 = Math.min(x, x + w); x1 = Math.max(x, x + w); y0 = Math.min(y, y + h); y1 = Math.max(y, y + h);
  } else if (kind === "ellipse") {
    cx = Number(shape.cx || 0); cy = Number(shape.cy || 0); rx = Number(shape.rx || 0); ry = Number(shape.ry || 0);
    if (rx <= 0 || ry <= 0) return;
    x0 = cx - rx; x1 = cx + rx; y0 = cy - ry; y1 = cy + ry;
  } else {
    pts = (shape.points || []).map((p) => [Number(p[0]), Number(p[1])]);
    if (!pts.length) return;
    r = Number(shape.size ?? 1) / 2;
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    x0 = Math.min(...xs) - r; x1 = Math.max(...xs) + r; y0 = Math.min(...ys) - r; y1 = Math.max(...ys) + r;
  }
  const [c0, c1] = span(x0, x1, sx, width);
  const [r0, r1] = span(y0, y1, sy, height);
  if (c1 <= c0 || r1 <= r0) return;
  const value = kind === "eraser" ? 0 : 1;
  const segs = [];
  if (pts) {
    if (pts.length > 1) for (let k = 0; k + 1 < pts.length; k++) segs.push([pts[k], pts[k + 1]]);
    else segs.push([pts[0], pts[0]]);
  }
  const r2 = r * r;
  for (let i = r0; i < r1; i++) {
    const Y = (i + 0.5) * sh / height;
    for (let j = c0; j < c1; j++) {
      const X = (j + 0.5) * sw / width;
      let inside = false;
      if (kind === "rect") inside = X >= x0 && X < x1 && Y >= y0 && Y < y1;
      else if (kind === "ellipse") inside = ((X - cx) / rx) ** 2 + ((Y - cy) / ry) ** 2 <= 1;
      else {
        for (const [[ax, ay], [bx, by]] of segs) {
          const dx = bx - ax, dy = by - ay;
          const l2 = dx * dx + dy * dy;
          const u = l2 > 0 ? Math.min(1, Math.max(0, ((X - ax) * dx + (Y - ay) * dy) / l2)) : 0;
          const qx = ax + u * dx, qy = ay + u * dy;
          if ((X - qx) ** 2 + (Y - qy) ** 2 <= r2) { inside = true; break; }
        }
      }
      if (inside) out[i * width + j] = value;
    }
  }
}

export function rasterizeShapes(shapes, sw, sh, width, height) {
  const out = new Float32Array(width * height);
  for (const shape of shapes) paintShape(out, shape, sw, sh, width, height);
  return out;
}

function isqrt(n) {
  let x = Math.floor(Math.sqrt(n));
  while (x * x > n) x--;
  while ((x + 1) * (x + 1) <= n) x++;
  return x;
}

function dilate(m, width, height, radius) {
  const out = new Float32Array(width * height);
  const row = new Float32Array(width);
  for (let dy = -radius; dy <= radius; dy++) {
    const half = isqrt(radius * radius - dy * dy);
    for (let i = 0; i < height; i++) {
      const src = i + dy;
      if (src < 0 || src >= height) continue;
      const base = src * width;
      // sliding maximum over [j - half, j + half] (zero outside); O(width * half) is fine at preview sizes
      for (let j = 0; j < width; j++) {
        let best = 0;
        const lo = Math.max(0, j - half), hi = Math.min(width - 1, j + half);
        for (let k = lo; k <= hi; k++) if (m[base + k] > best) best = m[base + k];
        row[j] = best;
      }
      const o = i * width;
      for (let j = 0; j < width; j++) if (row[j] > out[o + j]) out[o + j] = row[j];
    }
  }
  return out;
}

function boxH(m, width, height, radius) {
  const out = new Float32Array(width * height);
  const n = 2 * radius + 1;
  for (let i = 0; i < height; i++) {
    const o = i * width;
    for (let j = 0; j < width; j++) {
      let sum = 0;
      for (let k = -radius; k <= radius; k++) sum += m[o + Math.min(width - 1, Math.max(0, j + k))];
      out[o + j] = sum / n;
    }
  }
  return out;
}

function boxV(m, width, height, radius) {
  const out = new Float32Array(width * height);
  const n = 2 * radius + 1;
  for (let i = 0; i < height; i++) {
    for (let j = 0; j < width; j++) {
      let sum = 0;
      for (let k = -radius; k <= radius; k++) sum += m[Math.min(height - 1, Math.max(0, i + k)) * width + j];
      out[i * width + j] = sum / n;
    }
  }
  return out;
}

export function growFeatherInvert(mask, width, height, grow = 0, feather = 0, invert = false) {
  let m = mask;
  grow = Math.trunc(grow);
  if (grow > 0) m = dilate(m, width, height, grow);
  else if (grow < 0) {
    const inv = m.map((v) => 1 - v);
    m = dilate(inv, width, height, -grow).map((v) => 1 - v);
  }
  feather = Math.trunc(feather);
  if (feather > 0) {
    const radius = Math.ceil(feather / 3);
    for (let p = 0; p < 3; p++) m = boxV(boxH(m, width, height, radius), width, height, radius);
  }
  if (invert) m = m.map((v) => 1 - v);
  return m.map((v) => Math.min(1, Math.max(0, v)));
}

// The mask of frame t at width x height with the state's grow / feather / invert (options override them;
// `scale` multiplies grow / feather, for a preview drawn smaller than the video).
export function renderFrame(state, t, width, height, options = {}) {
  const hard = rasterizeShapes(shapesAt(state, t), state.width, state.height, width, height);
  const scale = options.scale ?? 1;
  const grow = Math.round((options.grow ?? state.grow ?? 0) * scale);
  const feather = Math.round((options.feather ?? state.feather ?? 0) * scale);
  return growFeatherInvert(hard, width, height, grow, feather, options.invert ?? state.invert ?? false);
}

let idCounter = 0;
export function newShapeId() {
  idCounter += 1;
  return `s${Date.now().toString(36)}${idCounter.toString(36)}`;
}

// Editing helpers (pure: they return a new state).
export function ensureKeyframe(state, frame) {
  if (keyframeAt(state, frame)) return state;
  const shapes = shapesAt(state, frame).map((s) => ({ ...s }));
  return { ...state, keyframes: [...state.keyframes, { frame, shapes }] };
}

export function removeKeyframe(state, frame) {
  return { ...state, keyframes: state.keyframes.filter((kf) => kf.frame !== frame) };
}

export function addShape(state, frame, shape) {
  const withKf = ensureKeyframe(state, frame);
  return {
    ...withKf,
    keyframes: withKf.keyframes.map((kf) => (kf.frame === frame ? { ...kf, shapes: [...kf.shapes, shape] } : kf)),
  };
}

export function replaceShape(state, frame, shape) {
  return {
    ...state,
    keyframes: state.keyframes.map((kf) => (kf.frame === frame
      ? { ...kf, shapes: kf.shapes.map((s) => (s.id === shape.id ? shape : s)) } : kf)),
  };
}

export function clearKeyframe(state, frame) {
  const withKf = ensureKeyframe(state, frame);
  return { ...withKf, keyframes: withKf.keyframes.map((kf) => (kf.frame === frame ? { ...kf, shapes: [] } : kf)) };
}

// Topmost rect / ellipse of frame `frame` containing (x, y) in state space, or null.
export function hitShape(state, frame, x, y) {
  const shapes = shapesAt(state, frame);
  for (let k = shapes.length - 1; k >= 0; k--) {
    const s = shapes[k];
    if (s.type === "rect") {
      const x0 = Math.min(s.x, s.x + s.w), x1 = Math.max(s.x, s.x + s.w);
      const y0 = Math.min(s.y, s.y + s.h), y1 = Math.max(s.y, s.y + s.h);
      if (x >= x0 && x < x1 && y >= y0 && y < y1) return s;
    } else if (s.type === "ellipse" && s.rx > 0 && s.ry > 0) {
      if (((x - s.cx) / s.rx) ** 2 + ((y - s.cy) / s.ry) ** 2 <= 1) return s;
    }
  }
  return null;
}

export function translateShape(shape, dx, dy) {
  if (shape.type === "rect") return { ...shape, x: shape.x + dx, y: shape.y + dy };
  if (shape.type === "ellipse") return { ...shape, cx: shape.cx + dx, cy: shape.cy + dy };
  return { ...shape, points: shape.points.map(([x, y]) => [x + dx, y + dy]) };
}

// A rectangle / ellipse spanned by a drag from (x0, y0) to (x, y) (both editors draw them so); other shapes unchanged.
export function spanShape(shape, x0, y0, x, y) {
  if (shape.type === "rect") return { ...shape, x: Math.min(x0, x), y: Math.min(y0, y), w: Math.abs(x - x0), h: Math.abs(y - y0) };
  if (shape.type === "ellipse") return { ...shape, cx: (x0 + x) / 2, cy: (y0 + y) / 2, rx: Math.abs(x - x0) / 2, ry: Math.abs(y - y0) / 2 };
  return shape;
}
