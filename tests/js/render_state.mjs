// Helper for tests/nodes/test_mask_nodes.py: node tests/js/render_state.mjs <state.json> <frames> <width> <height>
// prints the JS masks ([frames][height*width], state's grow / feather / invert) as JSON.
import fs from "node:fs";
import { parseState, renderFrame } from "../../js/mask_logic.js";

const [file, frames, width, height] = process.argv.slice(2);
const state = parseState(fs.readFileSync(file, "utf8"));
const out = [];
for (let t = 0; t < Number(frames); t++) out.push(Array.from(renderFrame(state, t, Number(width), Number(height))));
process.stdout.write(JSON.stringify(out));
