"""Host memory of a SeedVR2 upscale against the clip's length: the peak RSS of one process that plans, restores and
streams a clip to an MP4 on the tiny model (CPU, float32), the frames read from the file batch by batch
(media/planned_frames.py) or, with --in-memory, decoded whole first (what the node and CLI did before).

    python bench/seedvr2_host_memory.py                       # 1344x768, 10 s and 60 s at 24 fps, scale 1
    python bench/seedvr2_host_memory.py --seconds 2 12 --width 640 --height 360 --json OUT
    python bench/seedvr2_host_memory.py --in-memory           # the same with the whole clip in host memory

Each length runs in a fresh subprocess (`--one SECONDS`), so one run's allocations do not raise the next one's
peak. The clip is a drifting pattern written once per length; batches of 21 frames, overlap 4, scale 1 (the point
is the host's memory, not the model). Prints one JSON line per length: seconds, frames, peak RSS in MiB, the clip's
size as uint8 in MiB, and the run's seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _clip(path: str, frames: int, width: int, height: int, fps: int) -> None:
    import torch

    from comfyui_h3.backend.media.encode import Mp4Writer

    y = torch.arange(height).view(1, height, 1).float()
    x = torch.arange(width).view(1, 1, width).float()
    with Mp4Writer(path, width, height, fps, preset="ultrafast") as writer:
        for start in range(0, frames, 48):
            t = torch.arange(start, min(frames, start + 48)).view(-1, 1, 1).float()
            wave = 0.5 + 0.5 * torch.sin(2 * math.pi * (x / 97.0 + y / 61.0) + 0.05 * t)
            rgb = torch.stack([wave, wave.flip(-1), 1 - wave], dim=-1)
            writer.write_frames((rgb * 255).round().to(torch.uint8))


def _one(args) -> dict:
    import torch

    from comfyui_h3.backend.media.decode import decode_video, plan_frames
    from comfyui_h3.backend.media.planned_frames import PlannedFrames
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work = Path(args.work)
    frames = round(args.one * args.fps)
    clip = str(work / f"clip_{frames}.mp4")
    if not os.path.isfile(clip):
        _clip(clip, frames, args.width, args.height, args.fps)
    root = work / "tiny"
    if not (root / VAE_FILE).is_file():
        make_tiny_seedvr2(root, "3b")
    config = seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE, dtype="float32",
                            vae_dtype="float32")
    pipe = config.build_pipeline(0)
    started = time.perf_counter()
    source = decode_video(clip, load_audio=False).frames if args.in_memory else PlannedFrames(clip, plan_frames(clip))
    from comfyui_h3.backend.media.encode import next_free_path

    out = next_free_path(str(work), f"out_{frames}", "mp4")  # a reserved placeholder, as the node and CLI make
    result = pipe.run(UpscaleRequest(source, scale=1.0, batch_frames=21, overlap=4, output_path=out))
    seconds = time.perf_counter() - started
    os.remove(out)
    return {"seconds": args.one, "frames": frames, "size": f"{args.width}x{args.height}",
            "source": "in memory" if args.in_memory else "file, per batch", "batches": result.batches,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "clip_uint8_mib": round(frames * args.width * args.height * 3 / 2**20, 1), "run_s": round(seconds, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, nargs="+", default=[10.0, 60.0])
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--fps", type=int, default=24)
    parser.add_argument("--in-memory", action="store_true", help="decode the whole clip first (the old path)")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a child: one length
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print("ROW " + json.dumps(_one(args)), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for seconds in args.seconds:
            cmd = [sys.executable, __file__, "--one", str(seconds), "--work", work, "--width", str(args.width),
                   "--height", str(args.height), "--fps", str(args.fps)] + (["--in-memory"] if args.in_memory else [])
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print(run.stderr[-3000:], file=sys.stderr)
                return run.returncode
            row = json.loads([line for line in run.stdout.splitlines() if line.startswith("ROW ")][-1][4:])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
