// node --test tests/js/ : pure logic of the full-size video editor (js/editor_logic.js).
import test from "node:test";
import assert from "node:assert/strict";
import {
  UndoStack, addPoint, adjacentKeyframe, clampBrush, clampOpacity, clampToDoc, clearFramePrompts, fitView, insideDoc,
  movePoint, nearestPrompt, nextObjectId, objectColour, objectIds, onionFrames, panBy, parseHexColour, parsePrompts,
  promptFrames, promptSummary, promptsOn, removeObject, removePrompt, ringRadius, serializePrompts, setBox, stepFrame,
  toDoc, toScreen, wheelFactor, zoomAt, zoomLimits,
} from "../../js/editor_logic.js";

const close = (a, b, eps = 1e-9) => assert.ok(Math.abs(a - b) <= eps, `${a} != ${b}`);

test("fit centres the frame in the viewport at the largest scale that shows all of it", () => {
  const v = fitView(1344, 768, 1000, 700, 0);
  close(v.scale, 1000 / 1344);
  close(v.ox, 0);
  close(v.oy, (700 - 768 * v.scale) / 2);
  const tall = fitView(100, 400, 1000, 500, 10);
  close(tall.scale, 480 / 400);
  close(tall.ox, (1000 - 100 * tall.scale) / 2);
  close(tall.oy, 10);
});

test("screen <-> doc round trip, zoom keeps the point under the cursor, pan moves by screen pixels", () => {
  let v = fitView(640, 360, 800, 600);
  const [x, y] = toDoc(v, 300, 250);
  const [px, py] = toScreen(v, x, y);
  close(px, 300); close(py, 250);
  const zoomed = zoomAt(v, 3, 300, 250);
  close(zoomed.scale, v.scale * 3);
  const [zx, zy] = toDoc(zoomed, 300, 250);
  close(zx, x, 1e-9); close(zy, y, 1e-9);
  v = panBy(zoomed, 40, -10);
  const [qx, qy] = toDoc(v, 340, 240);
  close(qx, x, 1e-9); close(qy, y, 1e-9);
});

test("zoom is clamped to the limits of the fitted view; wheel in then out is identity", () => {
  const fit = fitView(1920, 1080, 960, 540, 0);
  const limits = zoomLimits(fit);
  close(limits.min, fit.scale / 4);
  assert.equal(limits.max, 32);
  close(zoomAt(fit, 1e-6, 0, 0, limits).scale, limits.min);
  close(zoomAt(fit, 1e6, 0, 0, limits).scale, 32);
  close(wheelFactor(-100) * wheelFactor(100), 1, 1e-12);
  assert.ok(wheelFactor(-100) > 1 && wheelFactor(100) < 1);
  close(wheelFactor(1e9), wheelFactor(500));  // a runaway delta is one big step, not a jump to the limit
  close(wheelFactor("x"), 1);
});

test("doc bounds, brush size and its cursor ring", () => {
  assert.ok(insideDoc(0, 0, 10, 5) && insideDoc(10, 5, 10, 5) && !insideDoc(-0.1, 2, 10, 5) && !insideDoc(3, 5.1, 10, 5));
  assert.deepEqual(clampToDoc(-4, 9, 10, 5), [0, 5]);
  assert.equal(clampBrush(0), 1);
  assert.equal(clampBrush(9999), 512);
  assert.equal(clampBrush("12.6"), 13);
  assert.equal(clampBrush("abc", 20), 20);
  close(ringRadius({ scale: 2.5, ox: 0, oy: 0 }, 32), 40);
});

test("undo / redo walk the snapshots; a new edit drops the redo branch; the stack is bounded", () => {
  const s = new UndoStack(3);
  assert.equal(s.undo("a"), undefined);
  let cur = "a";
  for (const next of ["b", "c"]) { s.record(cur); cur = next; }
  assert.ok(s.canUndo && !s.canRedo);
  cur = s.undo(cur); assert.equal(cur, "b");
  cur = s.undo(cur); assert.equal(cur, "a");
  assert.equal(s.undo(cur), undefined);
  cur = s.redo(cur); assert.equal(cur, "b");
  s.record(cur); cur = "x";  // edit after undo: "c" can no longer be redone
  assert.ok(!s.canRedo);
  assert.equal(s.redo(cur), undefined);
  for (const next of ["y", "z", "w"]) { s.record(cur); cur = next; }
  const back = [];
  while (s.canUndo) { cur = s.undo(cur); back.push(cur); }
  assert.deepEqual(back, ["z", "y", "x"]);  // only the last 3 kept
});

test("onion skin picks the nearest keyframes either side, never the frame itself", () => {
  const keys = [30, 0, 12, 12, 50];
  assert.deepEqual(onionFrames(keys, 12, 1), { before: [0], after: [30] });
  assert.deepEqual(onionFrames(keys, 20, 2), { before: [12, 0], after: [30, 50] });
  assert.deepEqual(onionFrames(keys, 0, 3), { before: [], after: [12, 30, 50] });
  assert.deepEqual(onionFrames(keys, 60, 1), { before: [50], after: [] });
  assert.deepEqual(onionFrames([], 5, 2), { before: [], after: [] });
  assert.deepEqual(onionFrames(keys, 5, 0), { before: [], after: [] });
  assert.equal(adjacentKeyframe(keys, 12, -1), 0);
  assert.equal(adjacentKeyframe(keys, 12, 1), 30);
  assert.equal(adjacentKeyframe(keys, 50, 1), null);
});

test("playback steps wrap (loop) or stop at the ends", () => {
  assert.equal(stepFrame(4, 5, 1), 0);
  assert.equal(stepFrame(0, 5, -1), 4);
  assert.equal(stepFrame(4, 5, 1, false), 4);
  assert.equal(stepFrame(2, 5, 1), 3);
  assert.equal(stepFrame(0, 0, 1), 0);
});

test("colours", () => {
  assert.deepEqual(parseHexColour("#00ff80"), [0, 255, 128]);
  assert.deepEqual(parseHexColour("#0f8"), [0, 255, 136]);
  assert.deepEqual(parseHexColour("nope", [1, 2, 3]), [1, 2, 3]);
  assert.equal(clampOpacity(2), 1);
  assert.equal(clampOpacity(-1), 0);
  assert.equal(clampOpacity("x", 0.4), 0.4);
  assert.notEqual(objectColour(1), objectColour(2));
  assert.equal(objectColour(1), objectColour(9));
});

test("prompts: empty forms, parse errors name the problem", () => {
  assert.deepEqual(parsePrompts(""), { version: 1, objects: [] });
  assert.deepEqual(parsePrompts("  "), { version: 1, objects: [] });
  assert.deepEqual(parsePrompts('{"version":1,"objects":[]}'), { version: 1, objects: [] });
  assert.throws(() => parsePrompts("{"), /not valid JSON/);
  assert.throws(() => parsePrompts("[]"), /JSON object/);
  assert.throws(() => parsePrompts('{"version":2,"objects":[]}'), /version 2/);
  assert.throws(() => parsePrompts('{"objects":[{"id":0}]}'), /id 0/);
  assert.throws(() => parsePrompts('{"objects":[{"id":1},{"id":1}]}'), /twice/);
  assert.throws(() => parsePrompts('{"objects":[{"id":1,"points":[{"frame":0,"x":"a","y":1}]}]}'), /object 1 has a click/);
  assert.throws(() => parsePrompts('{"objects":[{"id":1,"boxes":[{"frame":0,"x0":1}]}]}'), /object 1 has a box/);
});

test("prompts: clicks, boxes (one per object and frame), objects; serialised in the contract's shape", () => {
  let p = parsePrompts("");
  p = addPoint(p, 1, 3, 120.5, 80, true);
  p = addPoint(p, 1, 0, 10, 20, false);
  p = setBox(p, 1, 3, 200, 160, 10, 20.123);  // corners in any order
  p = setBox(p, 1, 3, 11, 21, 201, 161);  // replaces frame 3's box
  p = addPoint(p, 2, 7, 5, 6);
  assert.deepEqual(objectIds(p), [1, 2]);
  assert.equal(nextObjectId(p), 3);
  assert.equal(nextObjectId(p, [5]), 6);
  const json = serializePrompts(p);
  assert.deepEqual(JSON.parse(json), { version: 1, objects: [
    { id: 1, points: [{ frame: 0, x: 10, y: 20, positive: false }, { frame: 3, x: 120.5, y: 80, positive: true }],
      boxes: [{ frame: 3, x0: 11, y0: 21, x1: 201, y1: 161 }] },
    { id: 2, points: [{ frame: 7, x: 5, y: 6, positive: true }], boxes: [] },
  ] });
  assert.deepEqual(parsePrompts(json), parsePrompts(JSON.parse(json)));
  assert.equal(serializePrompts(parsePrompts(json)), json);  // stable
  assert.deepEqual(JSON.parse(serializePrompts(setBox(parsePrompts(""), 4, 0, 5, 7, 1, 2))).objects[0].boxes,
    [{ frame: 0, x0: 1, y0: 2, x1: 5, y1: 7 }]);
  assert.deepEqual(promptFrames(p), [0, 3, 7]);
  assert.deepEqual(promptsOn(p, 3).map((o) => [o.id, o.points.length, o.boxes.length]), [[1, 1, 1]]);
  assert.equal(promptSummary(p), "2 objects · 3 clicks (1 negative) · 1 box · frames 0, 3, 7");
  assert.equal(promptSummary(parsePrompts("")), "no clicks or boxes");
  assert.equal(promptSummary(setBox(parsePrompts(""), 1, 0, 1, 2, 3, 4)), "1 object · 1 box · frame 0");
  // an object with nothing left is not written
  const gone = clearFramePrompts(p, 7, 2);
  assert.deepEqual(JSON.parse(serializePrompts(gone)).objects.map((o) => o.id), [1]);
  assert.deepEqual(JSON.parse(serializePrompts(removeObject(p, 1))).objects.map((o) => o.id), [2]);
  assert.deepEqual(promptFrames(clearFramePrompts(p, 3)), [0, 7]);
  // a duplicate box for a frame in loaded JSON: the last one wins
  const dup = parsePrompts({ objects: [{ id: 1, boxes: [{ frame: 2, x0: 0, y0: 0, x1: 1, y1: 1 }, { frame: 2, x0: 5, y0: 5, x1: 9, y1: 9 }] }] });
  assert.deepEqual(dup.objects[0].boxes, [{ frame: 2, x0: 5, y0: 5, x1: 9, y1: 9 }]);
  assert.equal(JSON.parse(serializePrompts(movePoint(p, 1, 0, 50, 60))).objects[0].points[1].x, 50);
});

test("prompts: the nearest click or box is picked for removal; a click inside a box wins over the box", () => {
  let p = parsePrompts("");
  p = setBox(p, 1, 4, 0, 0, 100, 100);
  p = addPoint(p, 2, 4, 50, 50, true);
  p = addPoint(p, 2, 5, 52, 50, true);
  assert.deepEqual(nearestPrompt(p, 4, 51, 50, 6), { id: 2, kind: "point", index: 0 });
  assert.deepEqual(nearestPrompt(p, 4, 2, 40, 6), { id: 1, kind: "box", index: 0 });
  assert.deepEqual(nearestPrompt(p, 4, 103, 50, 6), { id: 1, kind: "box", index: 0 });
  assert.equal(nearestPrompt(p, 4, 150, 50, 6), null);
  assert.equal(nearestPrompt(p, 6, 50, 50, 6), null);  // other frames do not count
  const q = removePrompt(p, nearestPrompt(p, 4, 51, 50, 6));
  assert.deepEqual(q.objects.find((o) => o.id === 2).points.map((pt) => pt.frame), [5]);
  const r = removePrompt(q, nearestPrompt(q, 4, 2, 40, 6));
  assert.equal(r.objects.find((o) => o.id === 1).boxes.length, 0);
  assert.equal(removePrompt(p, null), p);
});
