// ComfyUI glue of H3 Mask Draw: mounts the MaskEditor (mask_canvas.js) in the node as a DOM widget, shows the frames
// of the upstream H3 Load Video (served by the pack's /h3/video_info and /h3/video_frame routes) and keeps the drawing
// in the node's `mask_state` STRING widget (hidden), so the workflow saves it. Its "open editor" button opens the
// full-size dialog (mask_dialog.js) on the same widget.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { MaskEditor } from "./mask_canvas.js";
import { VideoEditorDialog } from "./mask_dialog.js";
import { serializeState } from "./mask_logic.js";
import { frameUrl, hideWidget, holdGraphUndoWhileEditing, upstreamLoader, widget } from "./video_source.js";

app.registerExtension({
  name: "comfyui_h3.MaskDraw",
  setup() {
    holdGraphUndoWhileEditing(app);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== "H3_MaskDraw") return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = onNodeCreated?.apply(this, arguments);
      const node = this;
      const stateWidget = widget(node, "mask_state");
      hideWidget(stateWidget);  // kept (it is what the workflow saves) but out of sight
      const root = document.createElement("div");
      root.style.cssText = "display:flex;flex-direction:column;gap:3px;width:100%";
      // The Vue node renderer ("Nodes 2.0") drags the node from any pointerdown inside it: keep strokes and slider
      // drags in the editor.
      root.addEventListener("pointerdown", (e) => e.stopPropagation());
      let source = null;
      let video = null;  // {width, height, frameCount, fps} of the upstream loader's clip, once known
      let why = "";  // ... or why there are no frames
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
      const save = (json) => { if (stateWidget) stateWidget.value = json; node.setDirtyCanvas?.(true, true); };
      // The preview shows the drawing with the node's grow / feather / invert (the widgets are what the node uses;
      // the state's copies of them may be older).
      const settings = () => ({ grow: settingsWidgets[0]?.value, feather: settingsWidgets[1]?.value, invert: settingsWidgets[2]?.value });
      const showState = (json) => { editor.setState(json); editor.setSettings(settings()); };
      // The full-size editor on the same widget: each edit lands in mask_state and in the node's preview at once.
      const openDialog = () => {
        if (node.h3VideoEditor) return;
        node.h3VideoEditor = new VideoEditorDialog({
          mode: "mask",
          title: `${node.title || "H3 Mask Draw"} — mask editor`,
          value: stateWidget?.value ?? "",
          video: source ? video : null,
          status: source ? "" : why,
          frameUrl: (n, maxSize) => frameUrl(api, source, n, maxSize),
          onChange: (json) => { save(json); showState(json); },
          onClose: () => {
            const frame = node.h3VideoEditor?.frame;
            node.h3VideoEditor = null;
            if (frame != null) editor.setFrame(frame);
          },
        });
      };
      const editor = new MaskEditor(root, {
        limits,
        onResize: fitNode,
        onOpen: openDialog,
        state: stateWidget?.value || "",
        frameCount: 1,
        frameUrl: (n) => frameUrl(api, source, n, 512),
        onChange: save,
      });
      node.h3MaskEditor = editor;
      node.h3OpenVideoEditor = openDialog;
      for (const w of settingsWidgets) {
        if (!w) continue;
        const callback = w.callback;
        w.callback = function () {
          const r = callback?.apply(this, arguments);
          editor.setSettings(settings());
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
        const upstream = upstreamLoader(node);
        const next = upstream.params ? upstream.params.toString() : `none:${upstream.why}`;
        if (next === key) return;
        key = next;
        source = upstream.params ? next : null;
        video = null;
        why = upstream.why || "";
        if (!source) { editor.setVideo({ frameCount: 1 }); editor.setStatus(why); return; }
        try {
          const info = await (await api.fetchApi(`/h3/video_info?${source}`)).json();
          if (key !== next) return;
          if (info.error) {
            console.warn("H3 Mask Draw:", info.error);
            source = null;
            why = `No frames to show: ${info.error}`;
            editor.setVideo({ frameCount: 1 });
            editor.setStatus(why);
            return;
          }
          video = { width: info.width, height: info.height, frameCount: info.frame_count, fps: info.fps };
          editor.setStatus("");
          // Only an adopted size is written back: re-serialising an unchanged state would rewrite a loaded workflow's
          // mask_state (and mark it modified) for nothing.
          if (editor.setVideo({ width: info.width, height: info.height, frameCount: info.frame_count }) && stateWidget) {
            stateWidget.value = serializeState(editor.state);
          }
        } catch (err) {
          console.warn("H3 Mask Draw: no frame info", err);
          if (key === next) {
            why = `No frames to show: the server did not answer (${err?.message || err}).`;
            editor.setStatus(why);
          }
        }
      };
      const timer = setInterval(poll, 1000);
      const onRemoved = node.onRemoved;
      node.onRemoved = function () {
        clearInterval(timer);
        editor.destroy();
        node.h3VideoEditor?.close();
        return onRemoved?.apply(this, arguments);
      };
      const onConfigure = node.onConfigure;
      node.onConfigure = function () {
        const r = onConfigure?.apply(this, arguments);
        if (stateWidget?.value) showState(stateWidget.value);
        key = null;
        return r;
      };
      node.setSize?.([Math.max(node.size?.[0] ?? 0, 420), Math.max(node.size?.[1] ?? 0, 520)]);
      return result;
    };
  },
});
