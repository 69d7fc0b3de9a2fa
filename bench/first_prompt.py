"""Time to the first result after a ComfyUI start, on the embedded tiny model (CPU), and where the time goes.

    COMFYUI_DIR=/path/to/ComfyUI [COMFYUI_PYTHON=...] python bench/first_prompt.py [--steps 8] [--runs 2]
    python bench/first_prompt.py --breakdown      # one fresh worker-like process, stage by stage (no ComfyUI)

Before/after the forkserver (mp_executor.prewarm): COMFYUI_H3_WORKER_START=spawn (workers spawned, as before) or
COMFYUI_H3_PREWARM=0 (forkserver started by the first prompt) in the environment.

The first mode starts a real ComfyUI (tests/comfyui_lane.py: --cpu, this pack only), submits the shipped text-to-video
API workflow `--runs` times (seed changed so nothing is cached) and prints the wall time of each prompt from POST
/prompt to its /history entry, plus the server's start time. The second imports and builds what a worker does, in the
order it does, in a fresh interpreter, and prints each stage's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

_BREAKDOWN = r"""
import json, sys, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
import torch
mark("import torch")
from comfyui_h3.backend.pipelines.h3.family import h3_config
mark("import engine_config")
from comfyui_h3.backend.executor import worker
mark("import worker")
torch.set_grad_enabled(False)
pipe = h3_config(sys.argv[1], device="cpu", dtype="float32").build_pipeline(0)
mark("build pipeline (imports + weights)")
from comfyui_h3.backend.pipelines.h3.request import H3Request
req = dict(prompt="a drum solo", num_frames=124, steps=int(sys.argv[2]), width=64, height=64)
pipe.run(H3Request(seed=1, **req))
mark("first request")
pipe.run(H3Request(seed=2, **req))
mark("second request")
print(json.dumps({name: round(t - marks[i][1], 3) for i, (name, t) in enumerate(marks[1:])}))
print(json.dumps({"heavy_modules_loaded": sorted(m for m in ("diffusers", "transformers", "accelerate", "av", "torch._dynamo", "torch._inductor") if m in sys.modules)}))
"""


def breakdown(steps: int) -> dict:
    from comfyui_h3.backend.models.tiny import make_tiny_h3

    folder = make_tiny_h3(Path(tempfile.mkdtemp()) / "tiny-h3")
    out = subprocess.run([sys.executable, "-c", _BREAKDOWN, str(folder), str(steps)], capture_output=True,
                         text=True, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    lines = [json.loads(line) for line in out.stdout.strip().splitlines()[-2:]]
    return {"stages_s": lines[0], **lines[1]}


def _workflow() -> dict:
    """The shipped text-to-video API workflow, wherever the pack keeps it."""
    found = sorted(REPO.rglob("h3_text_to_video.api.json"))
    found = [p for p in found if "node_modules" not in p.parts and ".venv" not in p.parts]
    if not found:
        raise SystemExit("h3_text_to_video.api.json not found in the repo")
    return json.loads(found[0].read_text())


def comfy_prompts(steps: int, runs: int, idle_s: float) -> dict:
    from comfyui_lane import running_comfyui

    prompt = _workflow()
    sample = next(k for k, node in prompt.items() if node["class_type"] == "H3_Sample")
    prompt[sample]["inputs"]["steps"] = steps
    report = {"steps": steps, "prompt_s": []}
    t0 = time.monotonic()
    with running_comfyui(Path(tempfile.mkdtemp())) as comfy:
        report["server_start_s"] = round(time.monotonic() - t0, 2)
        time.sleep(idle_s)  # a user opening the editor and queueing a prompt
        for run in range(runs):
            prompt[sample]["inputs"]["seed"] = 1000 + run
            t1 = time.monotonic()
            status, reply = comfy.request("/prompt", {"prompt": prompt})
            assert status == 200, reply
            entry = comfy.wait_for_prompt(reply["prompt_id"])
            assert entry["status"]["status_str"] == "success", comfy.why(json.dumps(entry["status"]))
            report["prompt_s"].append(round(time.monotonic() - t1, 2))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds between the server answering and the first prompt")
    ap.add_argument("--breakdown", action="store_true")
    args = ap.parse_args()
    if args.breakdown:
        print(json.dumps(breakdown(args.steps), indent=1))
        return
    if not os.environ.get("COMFYUI_DIR"):
        raise SystemExit("set COMFYUI_DIR to a ComfyUI checkout (or use --breakdown)")
    print(json.dumps(comfy_prompts(args.steps, args.runs, args.idle), indent=1))


if __name__ == "__main__":
    main()
