// Driven by tests/js/test_video_editor_browser.py (not a node --test file): opens the full-size video editor
// (js/mask_dialog.js) on a bare page in headless Chromium, in both modes, and works it with the mouse and keyboard
// as a user would: scrub, brush size, draw, undo / redo, zoom and pan then draw again, onion skins, tint, play, and
// (prompts mode) clicks + / -, a box, a second object, remove. Prints one JSON object of what it saw; the pytest side
// judges it. Frames are SVG images made by this script's server (their frame number written in them).
// usage: node tests/js/video_editor_check.mjs <chromium> [screenshot dir]
import http from "node:http";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const shots = process.argv[3] || null;
const PAGE = `<!doctype html><html><body style="margin:0;background:#333">
<script type="module">
import { VideoEditorDialog } from "/js/mask_dialog.js";
window.VideoEditorDialog = VideoEditorDialog;
window.openEditor = (mode, value, video) => {
  window.changes = [];
  window.editorClosed = false;
  window.dialog = new VideoEditorDialog({
    mode, value, video, title: "test",
    frameUrl: (n, maxSize) => "/frame.svg?n=" + n + "&w=" + video.width + "&h=" + video.height + "&max=" + maxSize,
    onChange: (json) => window.changes.push(json),
    onClose: () => { window.editorClosed = true; },
  });
};
window.ready = true;
</script></body></html>`;

function frameSvg(n, w, h) {
  const grey = 40 + (n % 10) * 12;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}">
<rect width="${w}" height="${h}" fill="rgb(${grey},${grey},${grey})"/>
<circle cx="${(w * (0.2 + 0.02 * n)).toFixed(1)}" cy="${h / 2}" r="${h / 8}" fill="#9a7"/>
<text x="8" y="${h - 10}" font-size="${h / 8}" fill="#fff" font-family="sans-serif">frame ${n}</text></svg>`;
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  if (url.pathname === "/test.html") { res.writeHead(200, { "content-type": "text/html" }); res.end(PAGE); return; }
  if (url.pathname === "/frame.svg") {
    const q = url.searchParams;
    res.writeHead(200, { "content-type": "image/svg+xml" });
    res.end(frameSvg(Number(q.get("n")), Number(q.get("w")), Number(q.get("h"))));
    return;
  }
  const file = path.join(repo, path.normalize(url.pathname));
  if (!file.startsWith(path.join(repo, "js")) || !fs.existsSync(file)) { res.writeHead(404); res.end(); return; }
  res.writeHead(200, { "content-type": "text/javascript" });
  res.end(fs.readFileSync(file));
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const port = server.address().port;
const browser = await chromium.launch({ executablePath: process.argv[2], args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
const result = { pageErrors: [] };
const WAIT = { timeout: 20000 };

// -- in the page ----------------------------------------------------------------------------------------------------
function dialogView() {
  const d = window.dialog;
  const r = d.canvas.getBoundingClientRect();
  const o = d.overlay.getBoundingClientRect();
  return { frame: d.frame, scrubber: d.scrubber.value, label: d.frameLabel.textContent, view: { ...d.view_ },
    canvasBox: [r.left, r.top, r.width, r.height], overlayBox: [o.left, o.top, o.width, o.height],
    window: [window.innerWidth, window.innerHeight], zoomLabel: d.zoomLabel.textContent,
    undo: !d.undoButton.disabled, redo: !d.redoButton.disabled, status: d.status.textContent,
    changes: window.changes.length, last: window.changes[window.changes.length - 1] ?? null, playing: d.playing,
    frameShown: d.frames.get(d.frame)?.ok ?? null, size: d.size, sizeBox: d.sizeBox?.value ?? null };
}

// RGB of the viewport canvas at a doc point (through the dialog's current view).
function pixelAt([x, y]) {
  const d = window.dialog;
  const dpr = window.devicePixelRatio || 1;
  const px = (x * d.view_.scale + d.view_.ox) * dpr, py = (y * d.view_.scale + d.view_.oy) * dpr;
  return [...d.canvas.getContext("2d").getImageData(Math.round(px), Math.round(py), 1, 1).data.slice(0, 3)];
}

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", (e) => result.pageErrors.push(e.message));
  page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) result.pageErrors.push(m.text()); });
  await page.goto(`http://127.0.0.1:${port}/test.html`);
  await page.waitForFunction(() => window.ready === true);
  const view = () => page.evaluate(dialogView);
  const pixel = (pt) => page.evaluate(pixelAt, pt);
  // page coordinates of a doc point, through the dialog's current view
  const at = async ([x, y]) => {
    const v = await view();
    return [v.canvasBox[0] + x * v.view.scale + v.view.ox, v.canvasBox[1] + y * v.view.scale + v.view.oy];
  };
  const drag = async (points, button = "left") => {
    await page.mouse.move(...await at(points[0]));
    await page.mouse.down({ button });
    for (const p of points.slice(1)) await page.mouse.move(...await at(p), { steps: 2 });
    await page.mouse.up({ button });
  };
  const shown = (n) => page.waitForFunction((n) => window.dialog.frame === n && window.dialog.frames.get(n)?.ok === true, n, WAIT);
  const shot = async (name) => { if (shots) await page.screenshot({ path: path.join(shots, name) }); };

  // ---- mask mode ----
  await page.evaluate(() => window.openEditor("mask", "", { width: 320, height: 180, frameCount: 30, fps: 24 }));
  await shown(0);
  result.maskOpened = await view();
  // scrub with the keyboard on the timeline
  await page.locator('.h3-ve-overlay input[data-role="scrubber"]').focus();
  for (let k = 0; k < 5; k++) await page.keyboard.press("ArrowRight");
  await shown(5);
  result.scrubbed = await view();
  // brush size typed as a number; the ring follows the pointer
  await page.locator('.h3-ve-overlay input[data-role="size"]').fill("20");
  await page.locator('.h3-ve-overlay input[data-role="size"]').press("Enter");
  await page.mouse.move(...await at([160, 40]));
  await page.waitForTimeout(100);
  const v0 = await view();
  const ringAt = [160 + 10, 40];  // on the ring (radius = size / 2 in doc px)
  result.ring = { onRing: await pixel(ringAt), inside: await pixel([160 + 4, 40]), scale: v0.view.scale, size: v0.size, sizeBox: v0.sizeBox };
  await shot("mask_ring.png");
  // a brush stroke across frame 5
  await drag([[40, 90], [100, 90], [160, 90], [220, 90], [280, 90]]);
  result.stroke = await view();
  result.strokePixel = { on: await pixel([160, 90]), off: await pixel([160, 140]) };
  // undo / redo (keyboard and buttons)
  await page.keyboard.press("Control+z");
  result.undone = await view();
  await page.locator('.h3-ve-overlay button[data-action="redo"]').click();
  result.redone = await view();
  // zoom in at a point with the wheel; the point under the pointer stays put
  const zoomPoint = (await at([80, 45])).map(Math.round);  // whole pixels: what the wheel event reports
  await page.mouse.move(...zoomPoint);
  await page.mouse.wheel(0, -400);
  await page.waitForTimeout(100);
  result.zoomed = { ...(await view()), pointer: zoomPoint };
  // pan with the middle button
  const p0 = await at([80, 45]);
  await page.mouse.move(...p0);
  await page.mouse.down({ button: "middle" });
  await page.mouse.move(p0[0] - 120, p0[1] - 60, { steps: 3 });
  await page.mouse.up({ button: "middle" });
  result.panned = await view();
  // a rectangle drawn while zoomed and panned lands at the doc coordinates under the pointer
  await page.locator('.h3-ve-overlay button[data-tool="rect"]').click();
  await drag([[60, 30], [90, 50], [110, 70]]);
  result.zoomRect = await view();
  await shot("mask_zoomed.png");
  await page.locator('.h3-ve-overlay button[data-action="fit"]').click();
  // frame 12: an ellipse; then frame 8 shows both neighbours as onion skins
  await page.locator('.h3-ve-overlay input[data-role="scrubber"]').focus();
  for (let k = 0; k < 7; k++) await page.keyboard.press("ArrowRight");
  await shown(12);
  await page.locator('.h3-ve-overlay button[data-tool="ellipse"]').click();
  await drag([[200, 20], [240, 40], [260, 60]]);
  for (let k = 0; k < 4; k++) await page.keyboard.press("ArrowLeft");
  await shown(8);
  result.onion = { frame: (await view()).frame, before: await pixel([60, 90]), after: await pixel([230, 40]), none: await pixel([300, 160]) };
  await shot("mask_onion.png");
  await page.locator('.h3-ve-overlay input[data-role="onion"]').uncheck();
  result.onionOff = { before: await pixel([60, 90]), after: await pixel([230, 40]) };
  // tint colour and opacity
  await page.keyboard.press("Shift+ArrowLeft");  // previous keyframe: 5
  await shown(5);
  await page.locator('.h3-ve-overlay input[data-role="tint"]').evaluate((el) => { el.value = "#00ff00"; el.dispatchEvent(new Event("input")); });
  await page.locator('.h3-ve-overlay input[data-role="opacity"]').evaluate((el) => { el.value = "100"; el.dispatchEvent(new Event("input")); });
  result.tinted = { frame: (await view()).frame, on: await pixel([160, 90]) };
  await shot("mask_tint.png");
  // play, then pause
  await page.locator('.h3-ve-overlay button[data-action="play"]').click();
  await page.waitForFunction(() => window.dialog.frame >= 8, null, WAIT);
  await page.locator('.h3-ve-overlay button[data-action="play"]').click();
  result.played = await view();
  // Space plays / pauses, also right after a button click (it does not press the button again)
  const before = (await view()).changes;
  await page.locator('.h3-ve-overlay button[data-action="undo"]').click();
  await page.keyboard.press("Space");
  const spacePlays = (await view()).playing;
  await page.keyboard.press("Space");
  const after = await view();
  result.space = { plays: spacePlays, paused: !after.playing, changes: after.changes - before };
  await page.locator('.h3-ve-overlay button[data-action="redo"]').click();
  // a stroke started while playing pauses playback and stays on the frame it started on
  await page.locator('.h3-ve-overlay button[data-tool="brush"]').click();
  await page.locator('.h3-ve-overlay button[data-action="play"]').click();
  await page.waitForFunction((f) => window.dialog.frame !== f, result.played.frame, WAIT);
  await drag([[20, 20], [40, 20], [60, 20]]);
  result.playStroke = await view();
  await page.keyboard.press("Escape");
  result.maskClosed = await page.evaluate(() => ({ closed: window.editorClosed, overlay: document.querySelectorAll(".h3-ve-overlay").length, last: window.changes.at(-1) }));

  // ---- prompts mode ----
  await page.evaluate(() => window.openEditor("prompts", "", { width: 640, height: 360, frameCount: 20, fps: 24 }));
  await shown(0);
  await page.locator('.h3-ve-overlay button[data-tool="point-pos"]').click();
  await drag([[100, 100]]);
  await page.locator('.h3-ve-overlay button[data-tool="point-neg"]').click();
  await drag([[150, 120]]);
  await page.keyboard.press("ArrowRight");
  await page.keyboard.press("ArrowRight");
  await page.keyboard.press("ArrowRight");
  await shown(3);
  await page.locator('.h3-ve-overlay button[data-tool="box"]').click();
  await drag([[200, 50], [300, 200], [400, 300]]);
  await drag([[500, 40]]);  // a click with the box tool draws no box
  await page.locator('.h3-ve-overlay button[data-action="object-add"]').click();
  await page.locator('.h3-ve-overlay button[data-tool="point-pos"]').click();
  await drag([[520, 200]]);
  await drag([[-30, 200]]);  // off the frame: nothing
  result.promptsPlaced = await view();
  result.objects = await page.evaluate(() => [...document.querySelectorAll('.h3-ve-overlay select[data-role="object"] option')].map((o) => o.value));
  await shot("prompts_frame3.png");
  // back to frame 0, remove the negative click, undo that
  await page.keyboard.press("Shift+ArrowLeft");
  await shown(0);
  result.onionKept = await page.locator('.h3-ve-overlay input[data-role="onion"]').isChecked();  // a preference: kept
  await page.locator('.h3-ve-overlay input[data-role="onion"]').check();
  result.promptOnion = { box: await pixel([300, 50]), outside: await pixel([300, 30]), positive: await pixel([100, 100]) };
  await shot("prompts_frame0_onion.png");
  await page.locator('.h3-ve-overlay button[data-tool="remove-prompt"]').click();
  await drag([[152, 121]]);
  result.removed = await view();
  await page.keyboard.press("Control+z");
  result.restored = await view();
  await page.locator('.h3-ve-overlay button[data-action="close"]').click();
  result.promptsClosed = await page.evaluate(() => ({ closed: window.editorClosed, overlay: document.querySelectorAll(".h3-ve-overlay").length }));

  // ---- prompts without a known video: the dialog says why, and a click places nothing (no size to place it in) ----
  await page.evaluate(() => {
    window.changes = [];
    window.dialog = new window.VideoEditorDialog({ mode: "prompts", value: "", video: null, title: "no video",
      status: "No frames to show: connect an H3 Load Video to this node's video input.", frameUrl: () => null,
      onChange: (json) => window.changes.push(json) });
  });
  const vr = await page.evaluate(() => { const r = window.dialog.canvas.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; });
  await page.mouse.click(...vr);
  result.noVideo = await page.evaluate(() => ({ status: window.dialog.status.textContent, warn: window.dialog.status.classList.contains("h3-ve-warn"), changes: window.changes.length }));
  await shot("prompts_no_video.png");
  await page.keyboard.press("Escape");
} catch (err) {
  result.error = String(err?.stack || err);
} finally {
  await browser.close();
  server.close();
}
process.stdout.write(JSON.stringify(result));
process.exitCode = result.error ? 1 : 0;
