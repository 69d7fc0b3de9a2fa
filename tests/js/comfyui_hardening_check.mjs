// Driven by tests/lane/test_comfyui_hardening_ui.py (not a node --test file): the pack's UI in the real ComfyUI frontend,
// as a newcomer meets it. Runs the checks named in the config and prints one JSON object on stdout (the pytest side
// judges it).
// usage: node tests/js/comfyui_hardening_check.mjs <chromium> '<config JSON>'
//   config: {url, checks: [...], screenshot (written on failure), ...per check:}
//     "maskStatus": {workflow (UI JSON path)}: the Mask Draw editor's status line with frames, a missing file, no link
//     "templates": {pack}: the template browser's cards of the pack (thumbnails), each opened in turn
//     "templateOrder": {pack}: the pack's cards in the order the browser shows them (and each card's text)
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
  // Dialogs, alerts and toasts a user sees: shown, with a box and something in it. Frontend 1.58 keeps an empty
  // aria-live "Notification" region (role=alert) on the page for screen readers: it shows nothing until it is given
  // content, so an empty one is no dialog.
  const shown = [...document.querySelectorAll("[role=dialog], [role=alert], .p-toast-message")].filter((e) => {
    const r = e.getBoundingClientRect();
    return e.offsetParent !== null && r.width > 0 && r.height > 0 && (e.textContent.trim() || e.querySelector("*"));
  });
  const dialogs = shown.map((e) => e.textContent.trim().slice(0, 300));
  const dialogHtml = shown.map((e) => e.outerHTML.slice(0, 1500));
  return { types: nodes.map((n) => n.type).sort(),
    unknown: nodes.filter((n) => !window.LiteGraph.registered_node_types[n.type]).map((n) => n.type),
    withErrors: nodes.filter((n) => n.has_errors).map((n) => n.type), dialogs, dialogHtml,
    // what each node with an error has that this server lacks: combo values (model files) not among its choices
    absentValues: nodes.filter((n) => n.has_errors).map((n) => ({ type: n.type, values: (n.widgets ?? [])
      .filter((w) => Array.isArray(w.options?.values) && !w.options.values.includes(w.value)).map((w) => [w.name, w.value]) })) };
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
    // the browser closes once the workflow is loaded; then give any error dialog or toast time to show. A click that
    // lands while the list re-renders (a thumbnail arriving, on a loaded machine) is lost: click again, then say which
    let closed = false;
    for (let attempt = 0; attempt < 3 && !closed; attempt++) {
      const card = page.locator(`[data-testid="template-workflow-${name}"]`);
      if (await card.isVisible()) await card.click();
      closed = await page.waitForFunction(() => !document.querySelector("[data-testid^='template-workflow-']"), null,
        { timeout: 30000 }).then(() => true, () => false);
    }
    if (!closed) throw new Error(`the template browser stayed open after clicking the card ${name} (3 tries)`);
    await page.waitForTimeout(1500);
    opened[name] = { ...(await page.evaluate(graphView)), errors: result.pageErrors.slice(before) };
    if (opened[name].dialogs.length && config.screenshot) await page.screenshot({ path: config.screenshot.replace(/\.png$/, `-${name}.png`) }).catch(() => {});
    await page.keyboard.press("Escape");
  }
  return { cards, opened };
}

// -- the order the browser shows the pack's cards in (and the title each card shows) ----------------------------------
async function templateOrder({ pack }) {
  await openPackTemplates(pack);
  return page.evaluate(() => [...document.querySelectorAll("[data-testid^='template-workflow-']")].map((card) => ({
    name: card.getAttribute("data-testid").slice("template-workflow-".length),
    text: card.textContent.trim().slice(0, 200) })));
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

// `playing`: an input folder's clip name: each output video node is then also shown as after a run (the "executed"
// message the server sends, with the clip as its output), and its boxes and players noted under `${file}#playing`.
const VIDEO_OUTPUTS = new Set(["H3_SaveVideo", "H3_PreviewVideo"]);
async function layout({ workflows, vueNodes = false, playing = null }) {
  await page.evaluate(async (on) => { await window.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", on); }, vueNodes);
  const out = {};
  for (const file of workflows) {
    await loadWorkflow(file);
    out[file] = await settledBoxes();
    if (!playing) continue;
    const played = await page.evaluate(({ clip, types }) => window.app.graph.nodes.filter((n) => types.includes(n.type)).map((n) => {
      const output = { images: [{ filename: clip, subfolder: "", type: "input" }], animated: [true] };
      window.app.api.dispatchCustomEvent("executed", { node: String(n.id), display_node: String(n.id), output, prompt_id: "layout" });
      return n.id;
    }), { clip: playing, types: [...VIDEO_OUTPUTS] });
    if (!played.length) continue;
    // the players of the clip, loaded (its size known); a short bound per workflow (a miss is judged from the boxes)
    const loaded = (clip) => [...document.querySelectorAll("video")].filter((v) => (v.currentSrc || v.src).includes(clip));
    await page.waitForFunction(({ clip, n, f }) => {
      const videos = new Function(`return (${f})`)()(clip);
      return videos.length >= n && videos.every((v) => v.readyState >= 1);
    }, { clip: playing, n: played.length, f: loaded.toString() }, { timeout: 8000 }).catch(() => {});
    out[`${file}#playing`] = { boxes: await settledBoxes(), players: await page.evaluate(playerViews) };
  }
  return out;
}

// Each output video player's page box against its node's (title bar included): where a user sees it drawn.
function playerViews() {
  const ds = window.app.canvas.ds;
  const top = window.app.canvas.canvas.getBoundingClientRect();
  return window.app.graph.nodes.flatMap((n) => {
    const videos = (n.widgets ?? []).flatMap((w) => (w.element ? [w.element, ...w.element.querySelectorAll("video")] : []))
      .filter((e) => e.tagName === "VIDEO");
    const el = document.querySelector(`[data-node-id="${n.id}"]`);
    const [x0, y0] = ds.convertOffsetToCanvas([n.pos[0], n.pos[1] - window.LiteGraph.NODE_TITLE_HEIGHT]);
    const [x1, y1] = ds.convertOffsetToCanvas([n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
    const node = el ? el.getBoundingClientRect() : { left: top.left + x0, top: top.top + y0, right: top.left + x1, bottom: top.top + y1 };
    return [...videos, ...(el ? el.querySelectorAll("video") : [])].filter((v) => v.offsetParent !== null).map((v) => {
      const r = v.getBoundingClientRect();
      return { type: n.type, video: [r.left, r.top, r.right, r.bottom], node: [node.left, node.top, node.right, node.bottom],
        fits: r.left >= node.left - 1 && r.top >= node.top - 1 && r.right <= node.right + 1 && r.bottom <= node.bottom + 1 };
    });
  });
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
    // js/run_summary.js keeps the end-of-run line (the node's ui text) in node.h3RunSummary; frontend 1.58 clears
    // its own progress text when the job ends, so the line is read once the job is over, as a user reads it then
    const text = node.h3RunSummary?.textContent;
    return text ? { value: text, widgets: node.widgets.map((x) => x.name) } : null;
  };
  await page.waitForFunction((f) => new Function(`return (${f})()`)()?.value?.startsWith("preset "), shown.toString(), { timeout: 300000 });
  // the job has ended (the queue is empty): the line must still be there
  await page.waitForFunction(async () => {
    const queue = await (await fetch("/queue")).json();
    return !queue.queue_running.length && !queue.queue_pending.length;
  }, null, { timeout: 300000, polling: 500 });
  await page.waitForTimeout(1000);
  const out = await page.evaluate(shown);
  // ... and it is on the page, inside the node (what a user reads)
  out.onPage = await page.evaluate((text) => [...document.querySelectorAll("body *")].some((e) => e.children.length === 0
    && e.offsetParent !== null && e.textContent.includes(text)), out.value.slice(0, 30));
  out.before = before;
  out.after = await settledBoxes();  // the text's widget must fit in the node's saved size: nothing moves or overlaps
  // Save Video's player is built from the "executed" message, after the job ends: give it time on a loaded machine
  // (a timeout leaves it to the judge)
  await page.waitForFunction((f) => new Function(`return (${f})`)()().some((p) => p.type === "H3_SaveVideo"),
    playerViews.toString(), { timeout: 30000 }).catch(() => {});
  out.players = await page.evaluate(playerViews);
  return out;
}

const CHECKS = { maskStatus, templates, templateOrder, layout, editSummary };

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
