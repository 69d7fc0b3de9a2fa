// Driven by tests/test_comfyui_hardening_ui.py (not a node --test file): the pack's UI in the real ComfyUI frontend,
// as a newcomer meets it. Runs the checks named in the config and prints one JSON object on stdout (the pytest side
// judges it).
// usage: node tests/js/comfyui_hardening_check.mjs <chromium> '<config JSON>'
//   config: {url, checks: [...], screenshot (written on failure), ...per check:}
//     "maskStatus": {workflow (UI JSON path)}: the Mask Draw editor's status line with frames, a missing file, no link
//     "templates": {pack}: the template browser's cards of the pack (thumbnails), each opened in turn
//     "layout": {workflows: [UI JSON paths], vueNodes}: each node's box (title bar included; with the Vue renderer also
//               its element's page box) once the frontend has laid it out
//     "editSummary": {workflow, steps}: runs an editing workflow (Run, as a user) and reads the text H3 Edit shows
import fs from "node:fs";
import { chromium } from "playwright-core";

const executablePath = process.argv[2];
const config = JSON.parse(process.argv[3]);
const WAIT = { timeout: 60000 };  // a 2-core machine running other suites beside the lane needed more than 30 s

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
  // The browser shows a card's thumbnail only while the card is in view (more cards than fit: scrolled): bring each
  // into view in turn and note what it shows then.
  const cardsInBrowser = page.locator("[data-testid^='template-workflow-']");
  const shown = {};
  for (let k = 0; k < (await cardsInBrowser.count()); k++) {
    await cardsInBrowser.nth(k).scrollIntoViewIfNeeded();
    await page.waitForFunction((i) => {
      const img = document.querySelectorAll("[data-testid^='template-workflow-']")[i]?.querySelector("img");
      return img && img.complete && img.naturalWidth > 0;
    }, k, WAIT).catch(() => {});
    for (const view of await page.evaluate(cardViews)) if (view.thumbnail || !shown[view.name]) shown[view.name] = view;
  }
  // Thumbnails arrive as blobs after the cards: wait for each card's image (a timeout leaves it to the judge)
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid^='template-workflow-']")].every((card) => {
    const img = card.querySelector("img");
    return img && img.complete && img.naturalWidth > 0;
  }), null, WAIT).catch(() => {});
  const cards = (await page.evaluate(cardViews)).map((view) => (view.thumbnail ? view : shown[view.name] ?? view));
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

// -- node boxes of each workflow as the frontend lays them out ---------------------------------------------------------
// Once sizes stop changing (DOM widgets measured, video previews loaded): each node's box with its title bar, and the
// size its content asks for (computeSize).
// With the Vue ("Nodes 2.0") renderer the node is a DOM element: its page box too.
function nodeBoxes() {
  const title = window.LiteGraph.NODE_TITLE_HEIGHT;
  return window.app.graph.nodes.map((n) => {
    const el = document.querySelector(`[data-node-id="${n.id}"]`);
    const r = el?.getBoundingClientRect();
    const scale = window.app.canvas.ds.scale;
    return { id: n.id, type: n.type, pos: [...n.pos], size: [...n.size], wants: [...n.computeSize()],
      box: [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title], dom: r ? [r.x, r.y, r.width, r.height] : null,
      domGraph: r ? [r.width / scale, r.height / scale] : null };  // the element's size in graph units
  });
}

async function settledBoxes() {
  let last = "", same = 0;
  for (let k = 0; k < 60 && same < 4; k++) {
    await page.waitForTimeout(250);
    const now = JSON.stringify(await page.evaluate(nodeBoxes));
    same = now === last ? same + 1 : 0;
    last = now;
  }
  return JSON.parse(last);
}

async function layout({ workflows, vueNodes = false }) {
  await page.evaluate(async (on) => { await window.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", on); }, vueNodes);
  const out = {};
  for (const file of workflows) {
    await loadWorkflow(file);
    out[file] = await settledBoxes();
  }
  return out;
}

// -- H3 Edit shows what it resolved in the node when it is done ------------------------------------------------------
async function editSummary({ workflow, steps }) {
  await loadWorkflow(workflow);
  await page.evaluate((steps) => {
    window.app.graph.nodes.find((n) => n.type === "H3_Edit").widgets.find((w) => w.name === "steps").value = steps;
  }, steps);
  const before = await settledBoxes();
  await page.evaluate(() => window.app.queuePrompt(0, 1));
  const shown = () => {
    const node = window.app.graph.nodes.find((n) => n.type === "H3_Edit");
    const w = node.widgets?.find((x) => x.name === "$$node-text-preview");
    return w?.value ? { value: w.value, widgets: node.widgets.map((x) => x.name) } : null;
  };
  await page.waitForFunction((f) => new Function(`return (${f})()`)()?.value?.startsWith("preset "), shown.toString(), { timeout: 300000 });
  const out = await page.evaluate(shown);
  // ... and it is on the page, inside the node (what a user reads)
  out.onPage = await page.evaluate((text) => [...document.querySelectorAll("body *")].some((e) => e.children.length === 0
    && e.offsetParent !== null && e.textContent.includes(text)), out.value.slice(0, 30));
  out.before = before;
  out.after = await settledBoxes();  // the text's widget must fit in the node's saved size: nothing moves or overlaps
  return out;
}

const CHECKS = { maskStatus, templates, layout, editSummary };

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
