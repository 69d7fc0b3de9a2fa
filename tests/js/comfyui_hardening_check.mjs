// Driven by tests/test_comfyui_hardening_ui.py (not a node --test file): the pack's UI in the real ComfyUI frontend,
// as a newcomer meets it. Runs the checks named in the config and prints one JSON object on stdout (the pytest side
// judges it).
// usage: node tests/js/comfyui_hardening_check.mjs <chromium> '<config JSON>'
//   config: {url, checks: [...], screenshot (written on failure), ...per check:}
//     "maskStatus": {workflow (UI JSON path)}: the Mask Draw editor's status line with frames, a missing file, no link
//     "templates": {pack}: the template browser's cards of the pack (thumbnails), each opened in turn
import fs from "node:fs";
import { chromium } from "playwright-core";

const executablePath = process.argv[2];
const config = JSON.parse(process.argv[3]);
const WAIT = { timeout: 30000 };

const browser = await chromium.launch({ executablePath, args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
const result = { pageErrors: [] };
page.on("pageerror", (e) => result.pageErrors.push(e.message));
page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) result.pageErrors.push(m.text()); });

async function openApp() {
  await page.goto(config.url);
  await page.waitForFunction(() => window.app?.vueAppReady && window.app.graph
    && window.app.extensions.some((e) => e.name === "comfyui_h3.MaskDraw"), null, { timeout: 60000 });
}

async function loadWorkflow(file) {
  const workflow = JSON.parse(fs.readFileSync(file, "utf8"));
  await page.evaluate(async (wf) => { await window.app.loadGraphData(wf); }, workflow);
}

// -- the Mask Draw editor says in the node why it shows no frames ---------------------------------------------------
function statusView() {
  const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
  const status = node.h3MaskEditor.status;
  const box = status.getBoundingClientRect();
  const ds = window.app.canvas.ds;
  const nodeBottom = window.app.canvas.canvas.getBoundingClientRect().top + ds.convertOffsetToCanvas([node.pos[0], node.pos[1] + node.size[1]])[1];
  const editorBottom = Math.max(...[...node.h3MaskEditor.root.children].map((row) => row.getBoundingClientRect().bottom));
  return { text: status.textContent, visible: status.offsetParent !== null && box.height > 0,
    frameCount: node.h3MaskEditor.frameCount, fits: editorBottom <= nodeBottom + 1 };
}

const nextFrames = () => page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
const statusIs = async (pattern) => {
  await page.waitForFunction((p) => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
    return new RegExp(p).test(node.h3MaskEditor.status.textContent);
  }, pattern, WAIT);
  await nextFrames();  // the node has grown to fit the line
};

async function maskStatus({ workflow }) {
  await loadWorkflow(workflow);
  const out = {};
  // With the shipped sample clip in the input folder: frames, no status line.
  await page.waitForFunction(() => window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw").h3MaskEditor.frameCount > 1, null, WAIT);
  out.withFrames = await page.evaluate(statusView);
  // A file that is not there: the server's reason, in the node.
  await page.evaluate(() => {
    const w = window.app.graph.nodes.find((n) => n.type === "H3_LoadVideo").widgets.find((x) => x.name === "video");
    w.value = "no_such_clip.mp4";
    w.callback?.(w.value);
  });
  await statusIs("no_such_clip");
  out.missingFile = await page.evaluate(statusView);
  // Nothing connected to the video input.
  await page.evaluate(() => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_MaskDraw");
    node.disconnectInput(node.inputs.findIndex((i) => i.name === "video"));
  });
  await statusIs("connect an H3 Load Video");
  out.unlinked = await page.evaluate(statusView);
  return out;
}

// -- the template browser opens every template the pack lists --------------------------------------------------------
async function openPackTemplates(pack) {
  await page.evaluate(() => window.app.extensionManager.command.execute("Comfy.BrowseTemplates"));
  await page.getByText(pack, { exact: true }).first().click();
  await page.waitForFunction(() => document.querySelectorAll("[data-testid^='template-workflow-']").length > 0, null, WAIT);
}

function cardViews() {
  return [...document.querySelectorAll("[data-testid^='template-workflow-']")].map((card) => {
    const img = card.querySelector("img");
    return { name: card.getAttribute("data-testid").slice("template-workflow-".length),
      thumbnail: img ? { width: img.naturalWidth, height: img.naturalHeight, complete: img.complete } : null };
  });
}

function graphView() {
  const nodes = window.app.graph.nodes;
  const dialogs = [...document.querySelectorAll("[role=dialog], [role=alert], .p-toast-message")]
    .filter((e) => e.offsetParent !== null).map((e) => e.textContent.trim().slice(0, 300));
  return { types: nodes.map((n) => n.type).sort(),
    unknown: nodes.filter((n) => !window.LiteGraph.registered_node_types[n.type]).map((n) => n.type),
    withErrors: nodes.filter((n) => n.has_errors).map((n) => n.type), dialogs };
}

async function templates({ pack }) {
  await openPackTemplates(pack);
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid^='template-workflow-'] img")]
    .every((img) => img.complete && img.naturalWidth > 0), null, WAIT).catch(() => {});
  const cards = await page.evaluate(cardViews);
  const opened = {};
  for (const { name } of cards) {
    if (!(await page.locator(`[data-testid="template-workflow-${name}"]`).isVisible())) await openPackTemplates(pack);
    const before = result.pageErrors.length;
    await page.locator(`[data-testid="template-workflow-${name}"]`).click();
    // the browser closes once the workflow is loaded; then give any error dialog or toast time to show
    await page.waitForFunction(() => !document.querySelector("[data-testid^='template-workflow-']"), null, WAIT);
    await page.waitForTimeout(1500);
    opened[name] = { ...(await page.evaluate(graphView)), errors: result.pageErrors.slice(before) };
    await page.keyboard.press("Escape");
  }
  return { cards, opened };
}

const CHECKS = { maskStatus, templates };

try {
  await openApp();
  for (const name of config.checks) result[name] = await CHECKS[name](config[name] ?? {});
} catch (err) {
  result.error = String(err?.stack || err);
  if (config.screenshot) await page.screenshot({ path: config.screenshot }).catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(result));
process.exitCode = result.error ? 1 : 0;
