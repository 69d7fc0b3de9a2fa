// Small DOM helpers shared by the in-node mask preview (mask_canvas.js) and the full-window editor (mask_dialog.js).
// Plain DOM, no ComfyUI imports.

// el("div", {style: "...", onclick: fn, title: "..."}, [children]): an element with its attributes, listeners
// (keys starting with "on") and children.
export function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}
