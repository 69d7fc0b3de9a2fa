// node --test tests/js/ : pure logic of the mask editor (js/mask_logic.js).
import test from "node:test";
import assert from "node:assert/strict";
import {
  addShape, clampSetting, ensureKeyframe, growFeatherInvert, parseState, rasterizeShapes, removeKeyframe, renderFrame,
  serializeState, shapesAt, spanShape,
} from "../../js/mask_logic.js";

const sum = (m) => m.reduce((a, b) => a + b, 0);

test("rect covers the pixel centres inside it", () => {
  const m = rasterizeShapes([{ id: "a", type: "rect", x: 2, y: 1, w: 3, h: 2 }], 8, 4, 8, 4);
  const on = [];
  m.forEach((v, k) => { if (v) on.push([Math.floor(k / 8), k % 8]); });
  assert.deepEqual(on, [[1, 2], [1, 3], [1, 4], [2, 2], [2, 3], [2, 4]]);
});

test("shapes scale from state space to the output size", () => {
  const m = rasterizeShapes([{ id: "a", type: "rect", x: 0, y: 0, w: 4, h: 2 }], 8, 4, 16, 8);
  assert.equal(sum(m), 8 * 4);
});

test("ellipse, brush and eraser", () => {
  const e = rasterizeShapes([{ id: "e", type: "ellipse", cx: 5, cy: 5, rx: 3, ry: 3 }], 10, 10, 10, 10);
  assert.equal(e[5 * 10 + 5], 1);
  assert.equal(e[0], 0);
  const shapes = [{ id: "b", type: "brush", size: 2, points: [[0, 5], [10, 5]] },
    { id: "x", type: "eraser", size: 2, points: [[5, 5]] }];
  const b = rasterizeShapes(shapes, 10, 10, 10, 10);
  assert.equal(b[5 * 10 + 1], 1);
  assert.equal(b[4 * 10 + 1], 1);
  assert.equal(b[5 * 10 + 4], 0);  // erased (centre 4.5 is 0.5 from (5, 5))
  assert.equal(b[2 * 10 + 1], 0);
});

test("rects interpolate between keyframes, strokes hold", () => {
  const state = parseState({ width: 100, height: 100, keyframes: [
    { frame: 0, shapes: [{ id: "r", type: "rect", x: 0, y: 0, w: 10, h: 10 }, { id: "s", type: "brush", size: 4, points: [[50, 50]] }] },
    { frame: 10, shapes: [{ id: "r", type: "rect", x: 40, y: 20, w: 20, h: 10 }] },
  ] });
  const mid = shapesAt(state, 5);
  assert.deepEqual(mid[0], { id: "r", type: "rect", x: 20, y: 10, w: 15, h: 10 });
  assert.equal(mid[1].type, "brush");
  assert.equal(shapesAt(state, 10).length, 1);
  assert.equal(shapesAt(state, 99)[0].x, 40);
  assert.deepEqual(shapesAt(parseState(""), 3), []);
});

test("grow, feather and invert", () => {
  const m = new Float32Array(11 * 11);
  m[5 * 11 + 5] = 1;
  const g = growFeatherInvert(m, 11, 11, 2, 0, false);
  assert.equal(sum(g), 13);  // disk of radius 2
  const shrunk = growFeatherInvert(g, 11, 11, -1, 0, false);
  assert.equal(sum(shrunk), 5);  // the centre and its 4 neighbours
  const f = growFeatherInvert(g, 11, 11, 0, 3, false);
  assert.ok(Math.abs(sum(f) - 13) < 1e-3);  // a blur keeps the mass away from the edges
  assert.ok(f[5 * 11 + 5] < 1 && f[5 * 11 + 8] > 0);
  const inv = growFeatherInvert(m, 11, 11, 0, 0, true);
  assert.equal(sum(inv), 120);
});

test("editing helpers and serialisation round-trip", () => {
  let s = parseState({ width: 64, height: 32, keyframes: [] });
  s = addShape(s, 7, { id: "a", type: "rect", x: 1, y: 1, w: 4, h: 4 });
  s = addShape(s, 3, { id: "b", type: "brush", size: 3, points: [[1, 1]] });
  s = ensureKeyframe(s, 12);
  const json = serializeState(s);
  const back = parseState(json);
  assert.deepEqual(back.keyframes.map((k) => k.frame), [3, 7, 12]);
  // frame 3 was made by copying what frame 3 showed (the first keyframe's rect) then the brush; 12 copies 7
  assert.equal(back.keyframes[0].shapes.length, 2);
  assert.equal(back.keyframes[2].shapes.length, 1);
  assert.equal(removeKeyframe(back, 7).keyframes.length, 2);
  assert.equal(sum(renderFrame(back, 7, 64, 32)), 16);
});

test("grow / feather from the node widgets are clamped to their range for the preview", () => {
  const grow = { min: -256, max: 256 };
  assert.equal(clampSetting(5000, grow), 256);
  assert.equal(clampSetting("-100000", grow), -256);
  assert.equal(clampSetting("12.7", grow), 12);
  assert.equal(clampSetting(-3, grow), -3);
  assert.equal(clampSetting("abc", grow, 7), 7);  // not a number: the previous value
  assert.equal(clampSetting("", { min: 0, max: 256 }), 0);
  assert.equal(clampSetting(-5, { min: 0, max: 256 }), 0);
  assert.equal(clampSetting(1e9, { min: 0, max: 256 }), 256);
  assert.equal(clampSetting(Infinity, { min: 0, max: 256 }, 4), 4);
  assert.equal(clampSetting(40, { min: NaN, max: undefined }), 40);  // no range given: only made an integer
});

test("a drag spans rectangles and ellipses from its start corner, in any direction", () => {
  const rect = { id: 1, type: "rect", x: 0, y: 0, w: 0, h: 0 };
  assert.deepEqual(spanShape(rect, 10, 20, 4, 30), { id: 1, type: "rect", x: 4, y: 20, w: 6, h: 10 });
  const ellipse = { id: 2, type: "ellipse", cx: 0, cy: 0, rx: 0, ry: 0 };
  assert.deepEqual(spanShape(ellipse, 10, 20, 4, 30), { id: 2, type: "ellipse", cx: 7, cy: 25, rx: 3, ry: 5 });
  const brush = { id: 3, type: "brush", size: 4, points: [[1, 1]] };
  assert.equal(spanShape(brush, 0, 0, 9, 9), brush);
});
