// ComfyUI glue of H3 Mask Draw: mounts the MaskEditor (mask_canvas.js) in the node as a DOM widget, shows the frames
// of the upstream H3 Load Video (served by the pack's /h3/video_info and /h3/video_frame routes) and keeps the drawing
// in the node's `mask_state` STRING widget (hidden), so the workflow saves it.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { MaskEditor } from "./mask_canvas.js";
import { clampSetting, serializeState } from "./mask_logic.js";

const LOADER_OPTIONS = ["video", "path", "force_rate", "skip_first_frames", "frame_load_cap", "select_every_nth",
  "max_seconds", "resize", "fit", "width", "height"];

function widget(node, name) {
  return node.widgets?.find((w) => w.name === name);
}

// The upstream H3 Load Video's options as route parameters, or why there are no frames to show.
function upstreamLoader(node) {
  const input = node.inputs?.find((i) => i.name === "video");
  const link = input?.link != null ? node.graph?.links?.[input.link] ?? node.graph?.links?.get?.(input.link) : null;
  const origin = link ? node.graph.getNodeById(link.origin_id) : null;
  if (!origin) return { why: "No frames to show: connect an H3 Load Video to this node's video input." };
  if (origin.type !== "H3_LoadVideo") {
    return { why: `No frames to show: the editor shows the frames of an H3 Load Video, and video comes from ${origin.title || origin.type}. The drawing still applies to that video.` };
  }
  const params = new URLSearchParams();
  for (const name of LOADER_OPTIONS) {
    const w = widget(origin, name);
    if (w && w.value !== undefined && w.value !== null && w.value !== "") params.set(name, String(w.value));
  }
  if (!params.get("video") && !params.get("path")) return { why: "No frames to show: pick a video in the H3 Load Video node." };
  return { params };
}

app.registerExtension({
  name: "comfyui_h3.MaskDraw",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== "H3_MaskDraw") return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = onNodeCreated?.apply(this, arguments);
      const node = this;
      const stateWidget = widget(node, "mask_state");
      if (stateWidget) {  // keep it (it is what the workflow saves) but out of sight
        stateWidget.hidden = true;
        stateWidget.options = { ...stateWidget.options, hidden: true };  // what the Vue ("Nodes 2.0") renderer reads
        stateWidget.computeSize = () => [0, -4];
        if (stateWidget.element) stateWidget.element.style.display = "none";
      }
      const root = document.createElement("div");
      root.style.cssText = "display:flex;flex-direction:column;gap:3px;width:100%";
      // The Vue node renderer ("Nodes 2.0") drags the node from any pointerdown inside it: keep strokes and slider
      // drags in the editor.
      root.addEventListener("pointerdown", (e) => e.stopPropagation());
      let source = null;
      const settingsWidgets = ["grow", "feather", "invert"].map((n) => widget(node, n));
      // The ranges come from the node definition (INPUT_TYPES), as the widgets carry them.
      const limitsOf = (w) => ({ min: Number(w?.options?.min), max: Number(w?.options?.max) });
      const limits = { grow: limitsOf(settingsWidgets[0]), feather: limitsOf(settingsWidgets[1]) };
      // Grow the node when the editor's rows need more height than it has (e.g. a status line appeared).
      const fitNode = () => requestAnimationFrame(() => {
        const min = node.computeSize?.();
        if (min && node.size[1] < min[1]) node.setSize([node.size[0], min[1]]);
        node.setDirtyCanvas?.(true, true);
      });
      const editor = new MaskEditor(root, {
        limits,
        onResize: fitNode,
        state: stateWidget?.value || "",
        frameCount: 1,
        frameUrl: (n) => (source ? api.apiURL(`/h3/video_frame?${source}&frame=${n}&max_size=512`) : null),
        onChange: (json) => { if (stateWidget) stateWidget.value = json; node.setDirtyCanvas?.(true, true); },
        onSettings: ({ grow, feather, invert }) => {
          if (settingsWidgets[0]) settingsWidgets[0].value = clampSetting(grow, limits.grow);
          if (settingsWidgets[1]) settingsWidgets[1].value = clampSetting(feather, limits.feather);
          if (settingsWidgets[2]) settingsWidgets[2].value = invert;
        },
      });
      node.h3MaskEditor = editor;
      for (const w of settingsWidgets) {
        if (!w) continue;
        const callback = w.callback;
        w.callback = function () {
          const r = callback?.apply(this, arguments);
          editor.setSettings({ grow: settingsWidgets[0]?.value, feather: settingsWidgets[1]?.value, invert: settingsWidgets[2]?.value });
          if (stateWidget) stateWidget.value = serializeState(editor.state);
          return r;
        };
      }
      // The frontend grows a node only to its DOM widgets' minimum height (50 px by default), so a node loaded at a
      // small saved size would let the editor spill out of it: ask for the editor's height at the widget's width
      // (computed, not measured: the element is laid out at another width before the frontend places it).
      let editorWidget = null;
      const minHeight = () => {
        const margin = editorWidget?.margin ?? 10;
        const inner = editor.contentHeight((editorWidget?.width ?? node.size[0]) - 2 * margin);
        return inner ? Math.ceil(inner) + 2 * margin : 200;
      };
      editorWidget = node.addDOMWidget("mask_editor", "h3_mask_editor", root, {
        serialize: false, hideOnZoom: false, getMinHeight: minHeight,
      });
      // Follow the upstream loader: refresh the timeline when its file or options change.
      let key = null;
      // Why the editor shows no frames is written in the node (the status line), not only in the console.
      const poll = async () => {
        const { params, why } = upstreamLoader(node);
        const next = params ? params.toString() : `none:${why}`;
        if (next === key) return;
        key = next;
        source = params ? next : null;
        if (!source) { editor.setVideo({ frameCount: 1 }); editor.setStatus(why); return; }
        try {
          const info = await (await api.fetchApi(`/h3/video_info?${source}`)).json();
          if (key !== next) return;
          if (info.error) {
            console.warn("H3 Mask Draw:", info.error);
            source = null;
            editor.setVideo({ frameCount: 1 });
            editor.setStatus(`No frames to show: ${info.error}`);
            return;
          }
          editor.setStatus("");
          // Only an adopted size is written back: re-serialising an unchanged state would rewrite a loaded workflow's
          // mask_state (and mark it modified) for nothing.
          if (editor.setVideo({ width: info.width, height: info.height, frameCount: info.frame_count }) && stateWidget) {
            stateWidget.value = serializeState(editor.state);
          }
        } catch (err) {
          console.warn("H3 Mask Draw: no frame info", err);
          if (key === next) editor.setStatus(`No frames to show: the server did not answer (${err?.message || err}).`);
        }
      };
      const timer = setInterval(poll, 1000);
      const onRemoved = node.onRemoved;
      node.onRemoved = function () { clearInterval(timer); editor.destroy(); return onRemoved?.apply(this, arguments); };
      const onConfigure = node.onConfigure;
      node.onConfigure = function () {
        const r = onConfigure?.apply(this, arguments);
        if (stateWidget?.value) editor.setState(stateWidget.value);
        key = null;
        return r;
      };
      node.setSize?.([Math.max(node.size?.[0] ?? 0, 420), Math.max(node.size?.[1] ?? 0, 520)]);
      return result;
    };
  },
});
