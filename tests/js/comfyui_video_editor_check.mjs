// Driven by tests/lane/test_video_editor_in_comfyui.py (not a node --test file): the full-size video editor
// (js/mask_dialog.js) opened from H3 Mask Draw and from H3 Track Mask in the real ComfyUI frontend. Builds
// Load Video -> Track Mask -> Mask Draw (mask input) -> Mask Preview on the canvas, points the loader at a clip, then
// as a user: opens Mask Draw's editor with its button, scrubs, draws a stroke, undoes and redoes, closes; opens Track
// Mask's editor, places clicks + / -, a box on another frame and a second object's click, closes; saves and reloads the
// workflow and checks both widgets came back; optionally presses Run. Prints one JSON object; the pytest side judges.
// usage: node tests/js/comfyui_video_editor_check.mjs <chromium> '<config JSON>'
//   config: {url, clip, frame, stroke: [[x, y], ...] (video px), clicks: {pos, neg, box: [x0, y0, x1, y1], frame,
//            other}, run (bool), shots (folder for screenshots, or null)}
import path from "node:path";
import { chromium } from "playwright-core";

const executablePath = process.argv[2];
const config = JSON.parse(process.argv[3]);
const WAIT = { timeout: 30000 };

// -- in the page -----------------------------------------------------------------------------------------------------
function buildGraph(clip) {
  const { app, LiteGraph } = window;
  app.graph.clear();
  const add = (type, pos) => {
    const node = LiteGraph.createNode(type);
    node.pos = pos;
    app.graph.add(node);
    return node;
  };
  const loader = add("H3_LoadVideo", [70, 120]);
  const track = add("H3_TrackMask", [420, 120]);
  const draw = add("H3_MaskDraw", [840, 120]);
  const preview = add("H3_MaskPreview", [420, 520]);
  const out = (node, name) => node.outputs.findIndex((o) => o.name === name);
  const inp = (node, name) => node.inputs.findIndex((i) => i.name === name);
  loader.connect(out(loader, "video"), track, inp(track, "video"));
  loader.connect(out(loader, "video"), draw, inp(draw, "video"));
  loader.connect(out(loader, "video"), preview, inp(preview, "video"));
  track.connect(out(track, "mask"), draw, inp(draw, "mask"));
  draw.connect(out(draw, "mask"), preview, inp(preview, "mask"));
  const video = loader.widgets.find((w) => w.name === "video");
  video.value = clip;
  video.callback?.(clip);
  app.canvas.ds.offset = [0, 0];
  app.canvas.ds.scale = 1;
  app.canvas.setDirty(true, true);
  return { track: track.id, draw: draw.id, trackWidgets: track.widgets.map((w) => [w.name, w.type]) };
}

function nodeState() {
  const nodes = window.app.graph.nodes;
  const draw = nodes.find((n) => n.type === "H3_MaskDraw");
  const track = nodes.find((n) => n.type === "H3_TrackMask");
  const w = (node, name) => node.widgets.find((x) => x.name === name);
  const summary = track.widgets.find((x) => x.name === "prompt_editor")?.element?.querySelector('[data-role="prompt-summary"]');
  return {
    maskState: w(draw, "mask_state").value, prompts: w(track, "prompts").value,
    previewState: draw.h3MaskEditor ? JSON.stringify(draw.h3MaskEditor.state.keyframes) : null,
    previewFrame: draw.h3MaskEditor?.frame ?? null, summary: summary?.textContent ?? null,
    promptsHidden: w(track, "prompts").hidden === true, maskStateHidden: w(draw, "mask_state").hidden === true,
    // a field on the page showing the raw JSON (the Vue renderer draws widgets as inputs)
    jsonShown: [...document.querySelectorAll("input, textarea")].some((el) => el.value.startsWith('{"version"')),
    overlays: document.querySelectorAll(".h3-ve-overlay").length,
  };
}

function dialogState() {
  const node = window.app.graph.nodes.find((n) => n.h3VideoEditor);
  const d = node?.h3VideoEditor;
  if (!d) return null;
  const o = d.overlay.getBoundingClientRect(), c = d.canvas.getBoundingClientRect();
  return { node: node.type, mode: d.mode, frame: d.frame, frameCount: d.frameCount, video: d.video, current: d.current,
    shown: d.frames.get(d.frame)?.ok ?? null, src: d.frames.get(d.frame)?.img.src ?? null, label: d.frameLabel.textContent,
    status: d.status.textContent, overlayBox: [o.left, o.top, o.width, o.height], canvasBox: [c.left, c.top, c.width, c.height],
    window: [window.innerWidth, window.innerHeight], undo: !d.undoButton.disabled, redo: !d.redoButton.disabled };
}

// -- driver ----------------------------------------------------------------------------------------------------------
const browser = await chromium.launch({ executablePath, args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
const result = { pageErrors: [] };
page.on("pageerror", (e) => result.pageErrors.push(e.message));
page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) result.pageErrors.push(m.text()); });
const shot = async (name) => { if (config.shots) await page.screenshot({ path: path.join(config.shots, name) }); };
const dialog = () => page.evaluate(dialogState);
const dialogShows = (n) => page.waitForFunction((n) => {
  const d = window.app.graph.nodes.find((x) => x.h3VideoEditor)?.h3VideoEditor;
  return d && d.video && d.frame === n && d.frames.get(n)?.ok === true;
}, n, WAIT);
// page coordinates of a video pixel, through the open dialog's view
const at = ([x, y]) => page.evaluate(([x, y]) => {
  const d = window.app.graph.nodes.find((n) => n.h3VideoEditor).h3VideoEditor;
  const r = d.canvas.getBoundingClientRect();
  return [r.left + x * d.view_.scale + d.view_.ox, r.top + y * d.view_.scale + d.view_.oy];
}, [x, y]);
const drag = async (points) => {
  await page.mouse.move(...await at(points[0]));
  await page.mouse.down();
  for (const p of points.slice(1)) await page.mouse.move(...await at(p), { steps: 2 });
  await page.mouse.up();
};
// A real click on a node's "open editor" button (a DOM widget inside the node).
const openEditorOf = async (type) => {
  const box = await page.evaluate((type) => {
    const node = window.app.graph.nodes.find((n) => n.type === type);
    const el = [...document.querySelectorAll('button[data-action="open-editor"]')]
      .find((b) => (type === "H3_MaskDraw" ? node.h3MaskEditor.root.contains(b) : !window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw").h3MaskEditor.root.contains(b)));
    const r = el.getBoundingClientRect();
    return { x: r.left + r.width / 2, y: r.top + r.height / 2, hit: document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) === el };
  }, type);
  result[`${type}Button`] = box.hit;
  await page.mouse.click(box.x, box.y);
  await page.waitForFunction(() => document.querySelectorAll(".h3-ve-overlay").length === 1, null, WAIT);
};
const scrubTo = async (n) => {
  await page.locator('.h3-ve-overlay input[data-role="scrubber"]').focus();
  await page.keyboard.press("Home");
  for (let k = 0; k < n; k++) await page.keyboard.press("ArrowRight");
  await dialogShows(n);
};

try {
  await page.goto(config.url);
  await page.waitForFunction(() => window.app?.vueAppReady && window.app.graph && window.LiteGraph
    && window.app.extensions.some((e) => e.name === "comfyui_h3.TrackMaskEditor"), null, { timeout: 60000 });
  result.vueNodes = await page.evaluate(() => window.app.extensionManager.setting.get("Comfy.VueNodes.Enabled"));
  // On a loaded machine the frontend can still be restoring its start-up workflow, which replaces the graph built
  // here: build it again when its Mask Draw is gone (at most twice), then wait for the clip's frames.
  const editorReady = () => window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw")?.h3MaskEditor?.frameCount > 1;
  const graphGone = () => !window.app.graph.nodes.some((n) => n.type === "H3_MaskDraw");
  for (let build = 0; build < 2; build++) {
    result.built = await page.evaluate(buildGraph, config.clip);
    await page.waitForFunction((f) => new Function(`return (${f[0]})() || (${f[1]})()`)(),
      [editorReady.toString(), graphGone.toString()], WAIT);
    if (!(await page.evaluate(graphGone))) break;
  }
  await page.waitForFunction(editorReady, null, WAIT);
  await page.waitForTimeout(300);  // let the renderer place the DOM widgets
  result.before = await page.evaluate(nodeState);
  await shot(`graph_${result.vueNodes ? "vue" : "classic"}.png`);

  // ---- H3 Mask Draw: its button opens the dialog; scrub, draw, undo / redo, close ----
  await openEditorOf("H3_MaskDraw");
  await dialogShows(0);
  result.maskOpened = await dialog();
  await scrubTo(config.frame);
  await page.locator('.h3-ve-overlay button[data-tool="brush"]').click();
  await page.locator('.h3-ve-overlay input[data-role="size"]').fill("12");
  await page.locator('.h3-ve-overlay input[data-role="size"]').press("Enter");
  await drag(config.stroke);
  result.drawn = { ...(await page.evaluate(nodeState)), dialog: await dialog() };
  await page.mouse.move(...await at([96, 30]));  // the cursor ring, for the screenshot
  await shot(`mask_dialog_${result.vueNodes ? "vue" : "classic"}.png`);
  await page.keyboard.press("Control+z");
  result.undone = await page.evaluate(nodeState);
  await page.keyboard.press("Control+Shift+z");
  result.redone = await page.evaluate(nodeState);
  await page.locator('.h3-ve-overlay button[data-action="close"]').click();
  result.maskClosed = await page.evaluate(nodeState);

  // ---- H3 Track Mask: clicks + / -, a box on another frame, a second object ----
  const c = config.clicks;
  await openEditorOf("H3_TrackMask");
  await dialogShows(0);
  result.trackOpened = await dialog();
  await drag([c.pos]);  // click + is the first tool
  await page.locator('.h3-ve-overlay button[data-tool="point-neg"]').click();
  await drag([c.neg]);
  await scrubTo(c.frame);
  await page.locator('.h3-ve-overlay button[data-tool="box"]').click();
  await drag([[c.box[0], c.box[1]], [(c.box[0] + c.box[2]) / 2, (c.box[1] + c.box[3]) / 2], [c.box[2], c.box[3]]]);
  await page.locator('.h3-ve-overlay button[data-action="object-add"]').click();
  await page.locator('.h3-ve-overlay button[data-tool="point-pos"]').click();
  await drag([c.other]);
  result.placed = { ...(await page.evaluate(nodeState)), dialog: await dialog() };
  await shot(`track_dialog_${result.vueNodes ? "vue" : "classic"}.png`);
  await page.keyboard.press("Escape");
  result.trackClosed = await page.evaluate(nodeState);
  await shot(`graph_after_${result.vueNodes ? "vue" : "classic"}.png`);

  // ---- save and reload the workflow: both widgets come back, and the editors show them ----
  result.reloaded = await page.evaluate(async () => {
    const saved = JSON.parse(JSON.stringify(window.app.graph.serialize()));
    await window.app.loadGraphData(saved);
    return saved.nodes.filter((n) => ["H3_MaskDraw", "H3_TrackMask"].includes(n.type)).map((n) => [n.type, n.widgets_values]);
  });
  await page.waitForTimeout(300);
  result.afterReload = await page.evaluate(nodeState);
  result.reopened = await page.evaluate(() => {
    const track = window.app.graph.nodes.find((n) => n.type === "H3_TrackMask");
    track.h3OpenVideoEditor();
    const d = track.h3VideoEditor;
    const seen = { current: d.current, objects: d.model.objects.map((o) => o.id) };
    d.close();
    return seen;
  });

  // ---- the prompt: what graphToPrompt makes, and (optionally) what the Run button posts ----
  result.prompt = await page.evaluate(async () => {
    const { output } = await window.app.graphToPrompt();
    const id = (type) => String(window.app.graph.nodes.find((n) => n.type === type).id);
    return { drawId: id("H3_MaskDraw"), trackId: id("H3_TrackMask"), output };
  });
  if (config.run) {
    const posted = page.waitForResponse((r) => r.url().endsWith("/prompt") && r.request().method() === "POST", WAIT);
    // The Run button: inside the queue-button group up to frontend 1.4x, the element itself from 1.5x on.
    await page.locator('[data-testid="queue-button"] button, button[data-testid="queue-button"]').first().click();
    const response = await posted;
    result.queued = { status: response.status(), reply: await response.json(), sent: response.request().postDataJSON().prompt };
  }
} catch (err) {
  result.error = String(err?.stack || err);
  if (config.shots) await page.screenshot({ path: path.join(config.shots, "failure.png") }).catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(result));
process.exitCode = result.error ? 1 : 0;
