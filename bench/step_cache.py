"""Step caching at the released size with random weights (bench/e2e.py's skeleton and loaders): one t2va request per
setting, same prompt, seed and shape, in one process: request time, DiT forwards computed, time per forward, and the
final latents' relative error against `off` (the exact path) -- and the same on the tiny model on the CPU.

    python bench/step_cache.py --seconds 5 --steps 50 --settings off,quality,balanced,fast --json sc.json
    python bench/step_cache.py --tiny            # the tiny model, every preset, on the CPU
    # split over two device calls (a 50-step `off` run alone is ~5 minutes): the reference saved, then compared
    python bench/step_cache.py --settings off,fast --save-reference off.pt
    python bench/step_cache.py --settings quality,balanced --reference off.pt

Random weights make the residual criterion atypical (their residuals change differently from step to step than a
trained model's), so the presets' speed and error here are provisional; trained-weight quality cannot be measured
here. The text encoder keeps --text-layers layers (bench/refine.py's reason: one 80-GiB card); the prompt's encode is
not what a cache changes. A warm-up request (2 steps) first: CUDA context, cuDNN plans, the blocks' compile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--settings", default="off,quality,balanced,fast")
    ap.add_argument("--text-layers", type=int, default=4)
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--save-reference", help="torch.save the `off` run's final latents here")
    ap.add_argument("--reference", help="compare with a --save-reference file instead of running `off` again "
                                        "(same seeded random weights, shape and steps)")
    args = ap.parse_args()

    from comfyui_h3.backend.executor.worker import setup_rank
    from comfyui_h3.backend.pipelines.h3 import text
    from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    width, height = (64, 64) if args.tiny else (1344, 768)
    if not args.tiny:
        text.TEXT_LAYER = args.text_layers
    args.dtype = "float32" if args.tiny else "bfloat16"
    args.adaln_cache, args.fasth3 = True, False
    settings = args.settings.split(",")
    reference = None
    if args.reference:
        reference = torch.load(args.reference, map_location="cpu", weights_only=True)
        if (reference["steps"], reference["seconds"]) != (args.steps, args.seconds):
            raise SystemExit(f"{args.reference} was made at {reference['steps']} steps, {reference['seconds']} s")
        settings = [s for s in settings if s != "off"]
    elif settings[0] != "off":
        settings.insert(0, "off")  # the reference
    root = tempfile.mkdtemp(prefix="h3-step-cache-")
    records = []
    try:
        folder = e2e.make_skeleton(root, args.tiny)
        e2e.patch_our_loaders(device)
        config = e2e.our_config(args, folder, device)
        pipe, _ = setup_rank(0, 1, config)

        def request(steps, setting):
            return H3Request(prompt=e2e.PROMPT, num_frames=frames_for_seconds(args.seconds), steps=steps, seed=42,
                             width=width, height=height, decode=False, step_cache=setting)

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize()

        pipe.run(request(2, "off"), should_stop=lambda: False)
        sync()
        for setting in settings:
            t0 = time.perf_counter()
            result = pipe.run(request(args.steps, setting), should_stop=lambda: False)
            sync()
            total = time.perf_counter() - t0
            report = result.manifest.get("step_cache") or {}
            latents = {key: getattr(result, key).float().cpu() for key in ("video_latents", "audio_latents")}
            if reference is None:
                reference = dict(latents, steps=args.steps, seconds=args.seconds)
                if args.save_reference:
                    torch.save(reference, args.save_reference)
            err = {key: float((latents[key].double() - reference[key].double()).norm()
                              / reference[key].double().norm()) for key in latents}
            record = {"setting": setting, "request_s": total, "denoise_s": result.timings.get("denoise_s"),
                      "forwards_computed": report.get("forwards_computed", args.steps),
                      "steps_cached": report.get("steps_cached", 0),
                      "seconds_per_forward": report.get("seconds_per_forward",
                                                        (result.timings.get("denoise_s") or 0) / args.steps),
                      "cached_steps": (report.get("plans") or [{}])[0].get("cached_steps", []),
                      "rel_err_vs_off": err, "steps": args.steps, "seconds": args.seconds,
                      "size": f"{width}x{height}",
                      "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
            records.append(record)
            print(json.dumps(record), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write("\n".join(json.dumps(r) for r in records) + "\n")


if __name__ == "__main__":
    main()
