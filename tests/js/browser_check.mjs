// Driven by tests/js/test_mask_widget_browser.py (not a node --test file): mounts the MaskEditor (js/mask_canvas.js) on a
// bare page in headless Chromium, draws a brush stroke with the mouse and prints {state, mask} as JSON.
// usage: node tests/js/browser_check.mjs <chromium executable>
import http from "node:http";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const PAGE = `<!doctype html><html><body style="margin:0;width:400px">
<div id="root"></div>
<script type="module">
import { MaskEditor } from "/js/mask_canvas.js";
import { renderFrame, parseState } from "/js/mask_logic.js";
window.saved = null;
const editor = new MaskEditor(document.getElementById("root"), {
  state: JSON.stringify({ version: 1, width: 200, height: 100, keyframes: [] }), frameCount: 5,
  onChange: (json) => { window.saved = json; },
});
window.editor = editor;
window.maskOf = (json, t) => Array.from(renderFrame(parseState(json), t, 200, 100));
window.ready = true;
</script></body></html>`;

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  if (url.pathname === "/test.html") { res.writeHead(200, { "content-type": "text/html" }); res.end(PAGE); return; }
  const file = path.join(repo, path.normalize(url.pathname));
  if (!file.startsWith(path.join(repo, "js")) || !fs.existsSync(file)) { res.writeHead(404); res.end(); return; }
  res.writeHead(200, { "content-type": "text/javascript" });
  res.end(fs.readFileSync(file));
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const port = server.address().port;
const browser = await chromium.launch({ executablePath: process.argv[2], args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
try {
  const page = await browser.newPage({ viewport: { width: 600, height: 600 } });
  await page.goto(`http://127.0.0.1:${port}/test.html`);
  await page.waitForFunction(() => window.ready === true);
  await page.click('button[data-tool="brush"]');
  await page.$eval('input[data-role="size"]', (el) => { el.value = "10"; el.dispatchEvent(new Event("input")); });
  await page.evaluate(() => window.editor.setFrame(2));
  const box = await page.locator("canvas.h3-mask-canvas").boundingBox();
  // state space is 200 x 100 over the canvas box: from (40, 50) to (160, 50)
  const at = (x, y) => [box.x + x / 200 * box.width, box.y + y / 100 * box.height];
  await page.mouse.move(...at(40, 50));
  await page.mouse.down();
  for (let k = 1; k <= 12; k++) await page.mouse.move(...at(40 + 10 * k, 50));
  await page.mouse.up();
  const saved = await page.evaluate(() => window.saved);
  const mask = await page.evaluate((json) => window.maskOf(json, 2), saved);
  const label = await page.evaluate(() => document.querySelector("#root > div:last-child").textContent);
  process.stdout.write(JSON.stringify({ state: JSON.parse(saved), mask, label }));
} finally {
  await browser.close();
  server.close();
}
