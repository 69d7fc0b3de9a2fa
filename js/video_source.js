// Shared by the ComfyUI glue of the mask editors (mask_draw.js, track_mask_editor.js): where a node's frames come
// from (the upstream H3 Load Video, served by the pack's /h3/video_info and /h3/video_frame routes) and hiding the JSON
// widget an editor writes. No ComfyUI imports: the callers pass `api`.

const LOADER_OPTIONS = ["video", "path", "force_rate", "skip_first_frames", "frame_load_cap", "select_every_nth",
  "max_seconds", "resize", "fit", "width", "height"];

export function widget(node, name) {
  return node.widgets?.find((w) => w.name === name);
}

// Keep a widget (it is what the workflow saves and the prompt sends) but out of sight, in both node renderers.
export function hideWidget(w) {
  if (!w) return;
  w.hidden = true;
  w.options = { ...w.options, hidden: true };  // what the Vue ("Nodes 2.0") renderer reads
  w.computeSize = () => [0, -4];
  if (w.element) w.element.style.display = "none";
}

// The upstream H3 Load Video's options as route parameters ({params}), or why there are no frames to show ({why}).
// `title` names the node in the messages.
export function upstreamLoader(node, inputName = "video") {
  const input = node.inputs?.find((i) => i.name === inputName);
  const link = input?.link != null ? node.graph?.links?.[input.link] ?? node.graph?.links?.get?.(input.link) : null;
  const origin = link ? node.graph.getNodeById(link.origin_id) : null;
  if (!origin) return { why: `No frames to show: connect an H3 Load Video to this node's ${inputName} input.` };
  if (origin.type !== "H3_LoadVideo") {
    return { why: `No frames to show: the editor shows the frames of an H3 Load Video, and ${inputName} comes from ${origin.title || origin.type}.` };
  }
  const params = new URLSearchParams();
  for (const name of LOADER_OPTIONS) {
    const w = widget(origin, name);
    if (w && w.value !== undefined && w.value !== null && w.value !== "") params.set(name, String(w.value));
  }
  if (!params.get("video") && !params.get("path")) return { why: "No frames to show: pick a video in the H3 Load Video node." };
  return { params };
}

// {video: {width, height, frameCount, fps}} of the loader's output, or {why} it is not known.
export async function fetchVideoInfo(api, source) {
  try {
    const info = await (await api.fetchApi(`/h3/video_info?${source}`)).json();
    if (info.error) return { why: `No frames to show: ${info.error}` };
    return { video: { width: info.width, height: info.height, frameCount: info.frame_count, fps: info.fps } };
  } catch (err) {
    return { why: `No frames to show: the server did not answer (${err?.message || err}).` };
  }
}

export function frameUrl(api, source, n, maxSize) {
  return source ? api.apiURL(`/h3/video_frame?${source}&frame=${n}&max_size=${maxSize}`) : null;
}

// ComfyUI's change tracker undoes the graph on Ctrl+Z from a window capture listener registered before any of ours (so
// the dialog cannot stop it); it stands aside while `ComfyApp.maskeditor_is_opended()` answers true, the hook its own
// mask editor uses. Answer true there while one of our dialogs is open, so Ctrl+Z / Ctrl+Y undo the drawing only.
export function holdGraphUndoWhileEditing(app) {
  const ComfyApp = app?.constructor;
  if (!ComfyApp || ComfyApp.h3HoldsGraphUndo) return;
  const previous = ComfyApp.maskeditor_is_opended;
  ComfyApp.maskeditor_is_opended = function () {
    return Boolean(document.querySelector(".h3-ve-overlay")) || Boolean(previous?.apply(this, arguments));
  };
  ComfyApp.h3HoldsGraphUndo = true;
}
