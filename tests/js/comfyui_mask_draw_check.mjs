// Driven by tests/lane/test_mask_draw_in_comfyui.py (not a node --test file): the H3 Mask Draw node (js/mask_draw.js) in the
// real ComfyUI frontend. Loads a UI workflow, points its H3 Load Video at a clip, checks the editor, changes the
// loader's frame cap and back, scrubs the timeline, draws a rectangle with the mouse, sets a grow, reads the state
// back (widget, graphToPrompt, saved workflow) and optionally presses Run. Prints one JSON object on stdout; the pytest
// side judges it.
// usage: node tests/js/comfyui_mask_draw_check.mjs <chromium> '<config JSON>'
//   config: {url, workflow (path), clip, frame, rect: [x0, y0, x1, y1] in video pixels, grow, steps (null: no Run),
//            screenshot (written on failure)}
import fs from "node:fs";
import { chromium } from "playwright-core";

const executablePath = process.argv[2];
const config = JSON.parse(process.argv[3]);
const WAIT = { timeout: 30000 };

// -- in the page (serialised by playwright: no closures over this file) ----------------------------------------------
function editorView() {
  const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
  const editor = node.h3MaskEditor;
  const state = node.widgets.find((w) => w.name === "mask_state");
  const { canvas } = editor;
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const red = [], green = [];
  for (let k = 0; k < pixels.length; k += 4) { red.push(pixels[k]); green.push(pixels[k + 1]); }
  // Bottom edges in page pixels (the editor must fit in its node): the Vue renderer's node element, else the
  // litegraph node's box mapped through the canvas transform.
  const vueNode = document.querySelector(`[data-node-id="${node.id}"]`);
  const ds = window.app.canvas.ds;
  const nodeBottom = vueNode ? vueNode.getBoundingClientRect().bottom
    : window.app.canvas.canvas.getBoundingClientRect().top + ds.convertOffsetToCanvas([node.pos[0], node.pos[1] + node.size[1]])[1];
  return {
    frame: editor.frame, frameCount: editor.frameCount, imageFrame: editor.imageFrame, imageSrc: editor.image?.src ?? null,
    scrubber: { value: editor.scrubber.value, max: editor.scrubber.max }, label: editor.label.textContent,
    canvas: { width: canvas.width, height: canvas.height, red, green },
    maskState: state.value, stateHidden: state.hidden === true,
    // a field on the page showing the raw JSON (the Vue renderer draws widgets as inputs)
    stateShown: [...document.querySelectorAll("input, textarea")].some((el) => el.value.startsWith('{"version"')),
    editorMounted: editor.root.isConnected && editor.root.offsetParent !== null,
    editorBottom: Math.max(...[...editor.root.children].map((row) => row.getBoundingClientRect().bottom)), nodeBottom,
  };
}

// -- driver ----------------------------------------------------------------------------------------------------------
const browser = await chromium.launch({ executablePath, args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
const result = { routeCalls: [], pageErrors: [] };
page.on("pageerror", (e) => result.pageErrors.push(e.message));
page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) result.pageErrors.push(m.text()); });
page.on("request", (r) => { if (r.url().includes("/h3/video_")) result.routeCalls.push(r.url()); });

const showsFrame = (n) => page.waitForFunction(
  (n) => { const e = window.app.graph.nodes.find((x) => x.type === "H3_MaskDraw").h3MaskEditor; return e.imageFrame === n && e.image?.complete; },
  n, WAIT);
const timelineIs = (n) => page.waitForFunction(
  (n) => window.app.graph.nodes.find((x) => x.type === "H3_MaskDraw").h3MaskEditor.frameCount === n, n, WAIT);
// Set a loader widget as its menu / field does: the value, then the widget's callback.
const setLoader = (name, value) => page.evaluate(([name, value]) => {
  const widget = window.app.graph.nodes.find((n) => n.type === "H3_LoadVideo").widgets.find((w) => w.name === name);
  widget.value = value;
  widget.callback?.(value);
}, [name, value]);

try {
  await page.goto(config.url);
  await page.waitForFunction(() => window.app?.vueAppReady && window.app.graph
    && window.app.extensions.some((e) => e.name === "comfyui_h3.MaskDraw"), null, { timeout: 60000 });
  result.vueNodes = await page.evaluate(() => window.app.extensionManager.setting.get("Comfy.VueNodes.Enabled"));

  const workflow = JSON.parse(fs.readFileSync(config.workflow, "utf8"));
  await page.evaluate(async (wf) => { await window.app.loadGraphData(wf); }, workflow);
  result.loaded = await page.evaluate(() => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
    return { hasEditor: Boolean(node?.h3MaskEditor), widgets: node?.widgets.map((w) => [w.name, w.type]) };
  });

  await setLoader("video", config.clip);
  // the clip's own length: the workflow's sample input (in the input folder too) has other frames, and may show first
  await timelineIs(config.frames);
  await showsFrame(0);
  result.first = await page.evaluate(editorView);

  // The timeline follows the loader's options (frame_load_cap here), and comes back when they are undone.
  await setLoader("frame_load_cap", 30);
  await timelineIs(30);
  result.capped = await page.evaluate(() => {
    const e = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw").h3MaskEditor;
    return { frameCount: e.frameCount, max: e.scrubber.max };
  });
  await setLoader("frame_load_cap", 0);
  await timelineIs(result.first.frameCount);

  // Scrub with the keyboard on the timeline slider.
  const scrubTo = async (n) => {
    await page.locator('input[data-role="scrubber"]').focus();
    await page.keyboard.press("Home");
    for (let k = 0; k < n; k++) await page.keyboard.press("ArrowRight");
    await showsFrame(n);
  };
  await scrubTo(config.frame);
  result.scrubbed = await page.evaluate(editorView);

  // Draw a rectangle with real mouse events (video pixels -> page pixels over the canvas box).
  await page.locator('button[data-tool="rect"]').click();
  const box = await page.locator("canvas.h3-mask-canvas").boundingBox();
  const size = await page.evaluate(() => {
    const s = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw").h3MaskEditor.state;
    return [s.width, s.height];
  });
  const at = (x, y) => [box.x + x / size[0] * box.width, box.y + y / size[1] * box.height];
  const [x0, y0, x1, y1] = config.rect;
  result.hitTest = await page.evaluate((points) => points.map(([x, y]) => document.elementFromPoint(x, y)?.className ?? null),
    [at(x0, y0), at(x1, y1)]);
  const where = () => page.evaluate(() => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
    return JSON.stringify([[...node.pos], [...window.app.canvas.ds.offset]]);
  });
  const before = await where();
  await page.mouse.move(...at(x0, y0));
  await page.mouse.down();
  for (let k = 1; k <= 8; k++) await page.mouse.move(...at(x0 + (x1 - x0) * k / 8, y0 + (y1 - y0) * k / 8));
  await page.mouse.up();
  // ... and drag the timeline thumb back and forth (a slider drag must not move the node either)
  const bar = await page.locator('input[data-role="scrubber"]').boundingBox();
  await page.mouse.move(bar.x + 4, bar.y + bar.height / 2);
  await page.mouse.down();
  await page.mouse.move(bar.x + bar.width / 2, bar.y + bar.height / 2, { steps: 4 });
  await page.mouse.move(bar.x + 4, bar.y + bar.height / 2, { steps: 4 });
  await page.mouse.up();
  result.graphUnmoved = (await where()) === before;
  await scrubTo(config.frame);

  // Grow / feather / invert live in the node's widgets only (the editor has no copies of them); a grow set on the
  // widget, as its field does, reaches the preview and the saved state.
  result.settingsInEditor = await page.evaluate(() => {
    const root = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw").h3MaskEditor.root;
    return root.querySelectorAll('[data-role="grow"], [data-role="feather"], [data-role="invert"]').length;
  });
  await page.evaluate((grow) => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
    const widget = node.widgets.find((w) => w.name === "grow");
    widget.value = grow;
    widget.callback?.(grow);
  }, config.grow);
  result.growWidget = await page.evaluate(() => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
    return { widget: node.widgets.find((w) => w.name === "grow").value, preview: node.h3MaskEditor.state.grow };
  });
  result.drawn = await page.evaluate(editorView);

  // What the browser's own rasteriser makes of the saved state (the preview's source of truth).
  result.jsMasks = await page.evaluate(async ([json, frames]) => {
    const { parseState, renderFrame } = await import("/extensions/comfyui-h3/mask_logic.js");
    const state = parseState(json);
    return Object.fromEntries(frames.map((t) => [t, Array.from(renderFrame(state, t, state.width, state.height))]));
  }, [result.drawn.maskState, [0, config.frame, result.drawn.frameCount - 1]]);

  // The API prompt and the saved workflow carry the drawing.
  result.prompt = await page.evaluate(async () => {
    const { output, workflow } = await window.app.graphToPrompt();
    const id = String(window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw").id);
    return { nodeId: id, inputs: output[id]?.inputs ?? null,
      widgetsValues: workflow.nodes.find((n) => String(n.id) === id)?.widgets_values ?? null };
  });

  if (config.steps != null) {
    // Fewer steps (as typed into the field), then the Run button; the POST it sends is what ComfyUI runs.
    await page.evaluate((steps) => {
      window.app.graph.nodes.find((n) => n.type === "H3_Edit").widgets.find((w) => w.name === "steps").value = steps;
    }, config.steps);
    const posted = page.waitForResponse((r) => r.url().endsWith("/prompt") && r.request().method() === "POST", WAIT);
    // The Run button: inside the queue-button group up to frontend 1.4x, the element itself from 1.5x on.
    await page.locator('[data-testid="queue-button"] button, button[data-testid="queue-button"]').first().click();
    const response = await posted;
    result.queued = { status: response.status(), reply: await response.json(), sent: response.request().postDataJSON().prompt };
  }
} catch (err) {
  result.error = String(err?.stack || err);
  if (config.screenshot) await page.screenshot({ path: config.screenshot }).catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(result));
process.exitCode = result.error ? 1 : 0;
