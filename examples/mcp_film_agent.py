"""An agent's side of the pack's MCP server (the official SDK's client): it starts `python -m comfyui_h3 mcp` over
stdio, asks for a 3-shot film (a cut, a continue, a cut), then removes an object from the film's second shot, and
prints what it got. --model names the MiniMax-H3 model (H3 Model Loader's list; the files in ComfyUI's models
folders, or $COMFYUI_H3_MODELS); --tiny runs it on the pack's built-in tiny models instead (noise-like video, a
minute on a CPU).

    pip install "comfyui-h3[mcp]"
    python examples/mcp_film_agent.py --tiny
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
from mcp import Client, StdioServerParameters

SHOTS = [
    {"prompt": "A red fox pads along the edge of a snowy wood at dawn; crunching snow, a distant crow.",
     "seconds": 5},
    {"prompt": "The fox trots into the clearing and stops to listen; wind in the pines.", "seconds": 5,
     "transition": "continue"},
    {"prompt": "An owl on a bare branch turns its head; a soft hoot, night wind.", "seconds": 5, "transition": "cut"},
]


async def main(args) -> int:
    server = StdioServerParameters(command=sys.executable, args=["-m", "comfyui_h3", "mcp"])
    fast = {"loader": {"dtype": "float32"}, "steps": 2, "width": 64, "height": 64} if args.tiny else {}
    if args.model:
        fast["model"] = args.model

    async def progress(done, total, message):
        print(f"  {done:.2f}/{total:.0f} {message or ''}", file=sys.stderr)

    async with Client(server) as client:
        print("tools:", ", ".join(t.name for t in (await client.list_tools()).tools))
        film = await client.call_tool("storyboard", {"shots": SHOTS, "seed": 7, **fast}, progress_callback=progress)
        if film.is_error:
            print("storyboard failed:", film.content[0].text)
            return 1
        (saved,) = film.structured_content["files"]
        second = film.structured_content["film"]["shots"][1]
        print("film:", saved["ref"], f"({film.structured_content['film']['seconds']:.2f} s)")
        edit_fast = {k: v for k, v in fast.items() if k in ("model", "loader", "steps")}
        edit = await client.call_tool("edit", {
            "video": saved["ref"], "skip_first_frames": second["start_frame"], "frame_load_cap": second["frames"],
            "preset": "removal", "mask_text": "the fox", "prompt": "An empty snowy clearing; wind in the pines.",
            **edit_fast}, progress_callback=progress)
        if edit.is_error:
            print("edit failed:", edit.content[0].text)
            return 1
        (edited,) = edit.structured_content["files"]
        print("shot 2 without the fox:", edited["ref"])
        print(json.dumps({"film": saved["ref"], "edited_shot": edited["ref"]}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="The H3 model, as H3 Model Loader lists it.")
    parser.add_argument("--tiny", action="store_true", help="The built-in tiny models, 2 steps, 64 x 64.")
    sys.exit(anyio.run(main, parser.parse_args()))
