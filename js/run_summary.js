// The end-of-run line of H3 Sample / Edit / Extend / SeedVR2 Upscale ("preset removal: grow 40 px ... · 12.3 s,
// 3.0 s/step"), shown in the node from its ui "text" output. The frontend's progress text (the per-step status line)
// is cleared when the job ends on frontend 1.58+, so the line is kept in a read-only DOM widget of ours that lasts
// until the next run; the room is there from the start, so a run never grows the node over its neighbours.
import { app } from "../../scripts/app.js";

const SUMMARY_NODES = new Set(["H3_Sample", "H3_Edit", "H3_Extend", "H3_SeedVR2Upscale"]);
const PROGRESS_TEXT = "$$node-text-preview";  // the frontend's status-line widget (same text, would show twice)
const HEIGHT = 46;  // three 11-px lines; a longer line scrolls

app.registerExtension({
  name: "comfyui_h3.RunSummary",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!SUMMARY_NODES.has(nodeData?.name)) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = onNodeCreated?.apply(this, arguments);
      const box = document.createElement("div");
      box.setAttribute("data-role", "h3-run-summary");
      box.style.cssText = `box-sizing:border-box;width:100%;height:${HEIGHT}px;overflow:auto;font:11px/15px sans-serif;`
        + "color:#9aa0ad;white-space:pre-wrap;word-break:break-word;user-select:text;padding:0 2px";
      box.textContent = "";
      box.title = "What the last run resolved and how long it took";
      box.addEventListener("pointerdown", (e) => e.stopPropagation());  // select text; the Vue renderer drags nodes
      this.h3RunSummary = box;
      this.addDOMWidget("h3_run_summary", "h3_run_summary", box, {
        serialize: false, hideOnZoom: false, getMinHeight: () => HEIGHT, getMaxHeight: () => HEIGHT,
        getValue: () => box.textContent, setValue: (v) => { box.textContent = v ?? ""; },
      });
      return result;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      const result = onExecuted?.apply(this, arguments);
      const text = Array.isArray(output?.text) ? output.text.join("\n") : output?.text;
      if (text && this.h3RunSummary) {
        this.h3RunSummary.textContent = text;
        this.h3RunSummary.style.color = "#d6d9e0";
        const k = this.widgets?.findIndex((w) => w.name === PROGRESS_TEXT) ?? -1;
        if (k > -1) { this.widgets[k].onRemove?.(); this.widgets.splice(k, 1); }
        this.setDirtyCanvas?.(true, true);
      }
      return result;
    };
  },
});
