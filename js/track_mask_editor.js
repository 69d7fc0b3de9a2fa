// ComfyUI glue of H3 Track Mask's prompts: on any node of that class with a `prompts` widget, the JSON widget is
// hidden and replaced by a summary line ("2 objects · 3 clicks · frames 0, 12") and an "open editor" button; the
// full-size dialog (mask_dialog.js, mode "prompts") places clicks + / - and boxes on the frames of the upstream H3
// Load Video and writes the prompts JSON (editor_logic.js) into the widget, so the workflow saves it and the prompt
// carries it.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { parsePrompts, promptSummary } from "./editor_logic.js";
import { VideoEditorDialog } from "./mask_dialog.js";
import { fetchVideoInfo, frameUrl, hideWidget, holdGraphUndoWhileEditing, upstreamLoader, widget } from "./video_source.js";

const TRACK_CLASSES = new Set(["H3TrackMask", "H3_TrackMask"]);

function summaryOf(text) {
  try {
    return promptSummary(parsePrompts(text));
  } catch (err) {
    return `prompts not readable: ${err.message}`;
  }
}

function attach(node) {
  const promptsWidget = widget(node, "prompts");
  if (!promptsWidget || node.h3OpenVideoEditor) return;
  hideWidget(promptsWidget);
  const root = document.createElement("div");
  root.style.cssText = "display:flex;gap:6px;align-items:center;width:100%;font:11px sans-serif;color:#ccc";
  root.addEventListener("pointerdown", (e) => e.stopPropagation());  // the Vue renderer drags nodes from any pointerdown
  const summary = document.createElement("span");
  summary.setAttribute("data-role", "prompt-summary");
  summary.style.cssText = "flex:1;overflow:hidden;max-height:2.6em;line-height:1.3em";  // up to two lines
  const open = document.createElement("button");
  open.textContent = "open editor";
  open.title = "Place clicks and boxes on the video's frames (full-size editor)";
  open.setAttribute("data-action", "open-editor");
  open.style.cssText = "flex:none";
  root.append(summary, open);
  const showSummary = () => { summary.textContent = summaryOf(promptsWidget.value); summary.title = summary.textContent; };

  const openDialog = () => {
    if (node.h3VideoEditor) return;
    const upstream = upstreamLoader(node);
    const source = upstream.params ? upstream.params.toString() : null;
    const dialog = new VideoEditorDialog({
      mode: "prompts",
      title: `${node.title || "H3 Track Mask"} — clicks and boxes`,
      value: promptsWidget.value ?? "",
      video: null,
      status: source ? "Reading the video's size…" : upstream.why,
      frameUrl: (n, maxSize) => frameUrl(api, source, n, maxSize),
      onChange: (json) => { promptsWidget.value = json; showSummary(); node.setDirtyCanvas?.(true, true); },
      onClose: () => { node.h3VideoEditor = null; },
    });
    node.h3VideoEditor = dialog;
    if (source) {
      fetchVideoInfo(api, source).then(({ video, why }) => {
        if (!dialog.closed) dialog.setVideo(video || null, why || "");
      });
    }
  };
  node.h3OpenVideoEditor = openDialog;
  open.addEventListener("click", openDialog);
  node.addDOMWidget("prompt_editor", "h3_prompt_editor", root, { serialize: false, hideOnZoom: false, getMinHeight: () => 40 });
  showSummary();

  const onConfigure = node.onConfigure;
  node.onConfigure = function () {
    const r = onConfigure?.apply(this, arguments);
    showSummary();
    return r;
  };
  const callback = promptsWidget.callback;
  promptsWidget.callback = function () {
    const r = callback?.apply(this, arguments);
    showSummary();
    return r;
  };
  const onRemoved = node.onRemoved;
  node.onRemoved = function () {
    node.h3VideoEditor?.close();
    return onRemoved?.apply(this, arguments);
  };
}

app.registerExtension({
  name: "comfyui_h3.TrackMaskEditor",
  setup() {
    holdGraphUndoWhileEditing(app);
  },
  nodeCreated(node) {
    if (TRACK_CLASSES.has(node.comfyClass) || TRACK_CLASSES.has(node.type)) attach(node);
  },
});
