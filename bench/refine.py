"""H3 Refine at the released size with random weights (bench/e2e.py's skeleton and loaders): a clip's latents
(1344x768) upscaled in latent space to 1920x1088 and denoised again from --denoise (pipelines/h3/refine.py), the
request timed end to end (second pass + 1080p decode), with its rows, stages and peak. Its peer route, SeedVR2 x1.43
of the same-shaped clip, is bench/seedvr2.py pipeline --scale 1.43 on the same machine (the content does not change
either route's time):

    python bench/refine.py --seconds 5 --json refine.json          # dense attention, AdaLN cache, compiled blocks
    python bench/refine.py --seconds 10 --attention vsa --json r.json   # VSA (top-k 0.1, dense steps 0.25)
    python bench/seedvr2.py pipeline --frames 121 --scale 1.43 --json seedvr2.json
    python bench/refine.py --tiny                                  # tiny configs on the CPU: the script end to end

The text encoder keeps --text-layers decoder layers of the released width (H3 reads hidden_states[50]; the bench
reads the last of the kept layers instead) so the DiT, the VAEs and the activations of 1080p fit one 80-GiB card; the
prompt's encode is one forward and not part of what the two routes differ in. Warm-up first (the base clip: 2 steps
at 1344x768, then a 1-step refine at 1920x1088: CUDA context, cuDNN plans, the blocks' compile at both shapes), then
the timed refine.
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

import e2e  # noqa: E402  (the skeleton, the random-weight loaders, our engine config)


def log(text: str) -> None:
    print(f"[refine] {text}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=50, help="the full schedule; the pass runs the last --denoise")
    ap.add_argument("--denoise", type=float, default=None, help="default: H3 Refine's (refine.REFINE_DENOISE)")
    ap.add_argument("--size", default="1920x1088")
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "vsa"])
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--text-layers", type=int, default=4)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()

    from comfyui_h3.backend.executor.worker import setup_rank
    from comfyui_h3.backend.pipelines.h3 import text
    from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds
    from comfyui_h3.backend.pipelines.h3.refine import REFINE_DENOISE, refine_request
    from comfyui_h3.backend.pipelines.h3.request import H3Request
    from comfyui_h3.backend.pipelines.h3.strength import skipped_steps

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    denoise = REFINE_DENOISE if args.denoise is None else args.denoise
    width, height = (int(v) for v in args.size.split("x"))
    base = (1344, 768)
    if args.tiny:
        (width, height), base, args.steps = (128, 64), (64, 32), min(args.steps, 10)
    else:
        text.TEXT_LAYER = args.text_layers  # the bench's short text stack (module docstring)
    frames = frames_for_seconds(args.seconds)
    # e2e's engine config reads these
    args.dtype = "float32" if args.tiny else "bfloat16"
    args.adaln_cache, args.fasth3 = True, False
    root = tempfile.mkdtemp(prefix="h3-refine-")
    try:
        folder = e2e.make_skeleton(root, args.tiny)
        e2e.patch_our_loaders(device)
        config = e2e.our_config(args, folder, device)
        if args.attention == "vsa":
            from dataclasses import replace

            from comfyui_h3.backend.attention.vsa import spec

            config = replace(config, attention=spec(0.1, 0.25))
        t0 = time.perf_counter()
        pipe, _ = setup_rank(0, 1, config)
        log(f"pipeline built in {time.perf_counter() - t0:.1f} s")

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize()

        t0 = time.perf_counter()
        clip = pipe.run(H3Request(prompt=e2e.PROMPT, num_frames=frames, steps=2, seed=42, width=base[0],
                                  height=base[1], decode=False), should_stop=lambda: False)
        warm_one = pipe.run(refine_request(clip.video_latents, clip.audio_latents, e2e.PROMPT, width, height,
                                           denoise=0.5, steps=2, seed=43), should_stop=lambda: False)
        sync()
        log(f"warm-up (base clip 2 steps, 1-step refine, compile) {time.perf_counter() - t0:.1f} s")
        del warm_one
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        request = refine_request(clip.video_latents, clip.audio_latents, e2e.PROMPT, width, height, denoise=denoise,
                                 steps=args.steps, seed=43)
        t0 = time.perf_counter()
        result = pipe.run(request, on_step=lambda done, total, **_: log(
            f"step {done}/{total} at {time.perf_counter() - t0:.1f} s"), should_stop=lambda: False)
        sync()
        total = time.perf_counter() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    steps_run = args.steps - skipped_steps(args.steps, denoise)
    record = {
        "route": "h3_refine", "e2e_s": total, "source": f"{base[0]}x{base[1]}", "size": f"{width}x{height}",
        "frames": frames, "seconds": args.seconds, "denoise": denoise, "steps": args.steps, "steps_run": steps_run,
        "latents": list(request.init_video.shape), "attention": str(config.attention), "fp8": args.fp8,
        "timings": result.timings, "video": list(result.frames.shape),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        "manifest_stages": (result.manifest or {}).get("stages"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "text_layers": None if args.tiny else args.text_layers,
    }
    line = json.dumps(record, default=str)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
