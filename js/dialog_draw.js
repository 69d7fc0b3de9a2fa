// Canvas drawing of the full-size video editor (js/mask_dialog.js): a tinted layer of mask shapes (with the rim
// style of onion skins), a Track Mask object's clicks and boxes, and the keyframe ticks over the scrubber. Each
// function draws what it is given; the dialog decides what and where.

import { objectColour } from "./editor_logic.js";

// One layer of shapes (on the offscreen `layer`; `rimLayer` scratch), tinted and drawn at `alpha` over the frame; `rim`: a faint fill and a strong edge (onion
// skins, so the current frame's mask stays readable under them).
export function drawLayer(ctx, layer, rimLayer, view, shapes, colour, alpha, dpr, rim = false) {
  const v = view;
  const lc = layer.getContext("2d");
  lc.setTransform(1, 0, 0, 1, 0, 0);
  lc.globalCompositeOperation = "source-over";
  lc.clearRect(0, 0, layer.width, layer.height);
  lc.setTransform(dpr * v.scale, 0, 0, dpr * v.scale, dpr * v.ox, dpr * v.oy);
  lc.fillStyle = lc.strokeStyle = "#fff";
  for (const s of shapes) {
    lc.globalCompositeOperation = s.type === "eraser" ? "destination-out" : "source-over";
    if (s.type === "rect") {
      lc.fillRect(Math.min(s.x, s.x + s.w), Math.min(s.y, s.y + s.h), Math.abs(s.w), Math.abs(s.h));
    } else if (s.type === "ellipse") {
      if (s.rx > 0 && s.ry > 0) { lc.beginPath(); lc.ellipse(s.cx, s.cy, s.rx, s.ry, 0, 0, 2 * Math.PI); lc.fill(); }
    } else if (s.points?.length) {
      const r = Number(s.size ?? 1) / 2;
      if (s.points.length === 1) {
        lc.beginPath(); lc.arc(s.points[0][0], s.points[0][1], r, 0, 2 * Math.PI); lc.fill();
      } else {
        lc.lineWidth = 2 * r; lc.lineCap = "round"; lc.lineJoin = "round";
        lc.beginPath();
        lc.moveTo(s.points[0][0], s.points[0][1]);
        for (const [x, y] of s.points.slice(1)) lc.lineTo(x, y);
        lc.stroke();
      }
    }
  }
  lc.setTransform(1, 0, 0, 1, 0, 0);
  let inside = null;
  if (rim) {  // the layer eroded by a couple of pixels: itself intersected with copies shifted four ways
    inside = rimLayer.getContext("2d");
    const w = Math.max(1, Math.round(2 * dpr));
    inside.globalCompositeOperation = "source-over";
    inside.clearRect(0, 0, rimLayer.width, rimLayer.height);
    inside.drawImage(layer, 0, 0);
    inside.globalCompositeOperation = "destination-in";
    for (const [dx, dy] of [[w, 0], [-w, 0], [0, w], [0, -w]]) inside.drawImage(layer, dx, dy);
    inside.globalCompositeOperation = "source-over";
  }
  lc.globalCompositeOperation = "source-in";
  lc.fillStyle = colour;
  lc.fillRect(0, 0, layer.width, layer.height);
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.globalAlpha = rim ? alpha * 0.3 : alpha;
  ctx.drawImage(layer, 0, 0);
  if (rim) {
    lc.globalCompositeOperation = "destination-out";
    lc.drawImage(rimLayer, 0, 0);
    ctx.globalAlpha = alpha;
    ctx.drawImage(layer, 0, 0);
  }
  lc.globalCompositeOperation = "source-over";
  ctx.globalAlpha = 1;
}


export function drawPrompts(ctx, o, alpha, dpr, v, ghost, selected) {
  const colour = objectColour(o.id);
  ctx.globalAlpha = alpha;
  ctx.setTransform(dpr * v.scale, 0, 0, dpr * v.scale, dpr * v.ox, dpr * v.oy);
  for (const b of o.boxes) {
    ctx.fillStyle = colour;
    ctx.globalAlpha = alpha * (ghost ? 0.05 : 0.12);
    ctx.fillRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0);
    ctx.globalAlpha = alpha;
    ctx.lineWidth = (selected && !ghost ? 2.5 : 1.5) / v.scale;
    ctx.strokeStyle = colour;
    ctx.setLineDash(ghost ? [6 / v.scale, 4 / v.scale] : []);
    ctx.strokeRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0);
    ctx.setLineDash([]);
  }
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  for (const p of o.points) {
    const x = (p.x * v.scale + v.ox) * dpr, y = (p.y * v.scale + v.oy) * dpr, r = (selected && !ghost ? 10 : 8) * dpr;
    ctx.beginPath(); ctx.arc(x, y, r + 1.5 * dpr, 0, 2 * Math.PI);
    ctx.fillStyle = "rgba(0,0,0,0.6)";  // a dark halo: the marker reads on light and dark frames alike
    ctx.fill();
    ctx.beginPath(); ctx.arc(x, y, r, 0, 2 * Math.PI);
    ctx.fillStyle = ghost ? "rgba(0,0,0,0)" : (p.positive ? colour : "#111");
    ctx.fill();
    ctx.lineWidth = 2 * dpr;
    ctx.strokeStyle = p.positive ? "#fff" : colour;
    ctx.stroke();
    ctx.beginPath();  // the sign: + for positive, − for negative
    ctx.moveTo(x - r * 0.5, y); ctx.lineTo(x + r * 0.5, y);
    if (p.positive) { ctx.moveTo(x, y - r * 0.5); ctx.lineTo(x, y + r * 0.5); }
    ctx.strokeStyle = p.positive ? "#fff" : colour;
    ctx.stroke();
  }
  ctx.globalAlpha = 1;
}


export function drawTicks(c, frameCount, keyFrames, frame) {
  const ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  const n = frameCount;
  const pad = 8 * (window.devicePixelRatio || 1);  // the range input's thumb half-width, so ticks line up with it
  const at = (f) => pad + (n > 1 ? f / (n - 1) : 0) * (c.width - 2 * pad);
  ctx.fillStyle = "#e8b030";
  for (const f of keyFrames) ctx.fillRect(Math.round(at(f)) - 1, 0, 3, c.height);
  ctx.fillStyle = "#fff";
  ctx.fillRect(Math.round(at(frame)), 0, 1, c.height);
}
