"""Extension memory and speed on a GPU: 1 vs 6 windows, streamed into a file (the shipped path) vs the naive peer that
collects every frame on the host and encodes at the end. Tiny model (its DiT is cheap) at the release canvas
1344x768, so the VAE decode and the frames are real-sized; source = 124 frames of random latents, 124-frame windows
with a 22-frame overlap (102 new frames each), 1 denoising step per window. Each run in a fresh process.

    python bench/extension_stream.py [--out-json FILE] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def one_run(model_dir: str, out_dir: str, windows: int, mode: str, dtype: str) -> dict:
    import torch

    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.media.encode import next_free_path
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    torch.set_grad_enabled(False)
    pipe = h3_config(model_dir, device="cuda", dtype=dtype, compile="off").build_pipeline(0)
    c = pipe.c
    gen = torch.Generator().manual_seed(0)
    video = torch.randn(1, c.latent_channels, 37, 48, 84, generator=gen)
    audio = torch.randn(2, c.audio_channels, 207, generator=gen)
    c.transformer_for("extend")
    torch.cuda.synchronize()
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    torch.cuda.reset_peak_memory_stats()
    path = next_free_path(out_dir, f"{mode}{windows}", "mp4")
    request = H3ExtendRequest(prompts=["waves"], added_frames=102 * windows, window_frames=124, overlap_frames=22,
                              steps=1, source_video_latents=video, source_audio_latents=audio,
                              output_path=path if mode == "stream" else None)
    t0 = time.perf_counter()
    result = run_extend(pipe, request)
    if mode == "whole":  # the peer: every frame on the host, then one encode
        write_mp4(path, result.frames, 24, result.audio, result.sample_rate, reserved=True)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    frames = 124 + 102 * windows
    return {"mode": mode, "windows": windows, "frames": frames, "wall_s": round(wall, 3),
            "fps_out": round(frames / wall, 1),
            "peak_device_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "loaded_rss_gib": round(loaded_rss / 1024, 3),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "file_mb": round(os.path.getsize(path) / 2**20, 1), "denoise_s": round(result.timings["denoise_s"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-json")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model_dir, out_dir, windows, mode = args.child
        print(json.dumps(one_run(model_dir, out_dir, int(windows), mode, args.dtype)))
        return
    from comfyui_h3.backend.models.tiny import make_tiny_h3

    work = tempfile.mkdtemp()
    folder = str(make_tiny_h3(os.path.join(work, "tiny-h3")))
    rows = []
    for mode in ("stream", "whole"):
        for windows in (1, 6):
            run = subprocess.run([sys.executable, __file__, "--dtype", args.dtype, "--child", folder, work,
                                  str(windows), mode], capture_output=True, text=True, cwd=REPO)
            if run.returncode:
                raise SystemExit(run.stderr[-4000:])
            rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    by = {(r["mode"], r["windows"]): r for r in rows}
    summary = {}
    for mode in ("stream", "whole"):
        one, six = by[(mode, 1)], by[(mode, 6)]
        summary[mode] = {"device_6_over_1": round(six["peak_device_gib"] / one["peak_device_gib"], 3),
                         "host_growth_6_over_1": round((six["peak_rss_gib"] - six["loaded_rss_gib"])
                                                       / max(1e-9, one["peak_rss_gib"] - one["loaded_rss_gib"]), 3)}
    summary["stream_vs_whole_wall_6"] = round(by[("stream", 6)]["wall_s"] / by[("whole", 6)]["wall_s"], 3)
    print(json.dumps(summary))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
