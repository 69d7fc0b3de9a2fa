"""`python -m comfyui_h3 upscale`: SeedVR2 restoration / upscaling of a video through the engine (the node's worker
path). The worker streams the result into --out while batches finish (published whole at the end, never over an
existing file); Ctrl-C finishes the current batch and keeps the finished frames as <out>_partial_NNNNN.mp4."""

from __future__ import annotations

import os
import sys


def parse_size(text: str) -> tuple[int, int]:
    """"1920x1080" -> (1920, 1080)."""
    width, sep, height = text.lower().partition("x")
    try:
        if not sep:
            raise ValueError
        return int(width), int(height)
    except ValueError:
        raise ValueError(f"--size wants WIDTHxHEIGHT (e.g. 1920x1080), got {text!r}.") from None


def build_request(args):
    from fractions import Fraction

    from .backend.media.audio_decode import decode_planned_audio
    from .backend.media.decode import plan_frames
    from .backend.media.planned_frames import PlannedFrames
    from .backend.pipelines.seedvr2.request import UpscaleRequest

    if not os.path.isfile(args.video):
        raise FileNotFoundError(f"Video not found: {args.video}")
    target: dict = {"scale": args.scale if args.scale is not None else 2.0}
    if args.short_side is not None:
        target = {"scale": None, "short_side": args.short_side}
    elif args.size is not None:
        width, height = parse_size(args.size)
        target = {"scale": None, "width": width, "height": height}
    # The frames are read from the file batch by batch in the worker (host memory bounded by a batch, not the clip);
    # the sound, small, is decoded here.
    plan = plan_frames(args.video)
    audio, sample_rate = decode_planned_audio(args.video, plan)
    return UpscaleRequest(frames=PlannedFrames(args.video, plan), **target, batch_frames=args.batch_frames,
                          overlap=args.overlap,
                          color_fix=args.color_fix, seed=args.seed, edge=args.edge, vae_tile=args.vae_tile,
                          vae_tile_stats=args.vae_tile_stats, scene_cuts=args.scene_cuts,
                          fps=Fraction(plan.frame_rate), audio=audio, sample_rate=sample_rate,
                          encode_options={"crf": args.crf, "preset": "veryfast",
                                          "metadata": {"comment": "comfyui-h3 upscale"}})


def engine_config(args, files):
    """The SeedVR2 engine config of the command's model options; `files()` -> (DiT, VAE, text embedding) paths."""
    from .backend.pipelines.seedvr2.family import seedvr2_engine_config

    dit, vae, text = files()
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    config = seedvr2_engine_config(dit, vae, text, variant=args.variant, dtype=dtype,
                                   vae_dtype="float32" if dtype == "float32" else "bfloat16", device=args.device,
                                   world_size=args.sp_degree, attention=args.attention,
                                   weights="fp8" if getattr(args, "fp8", False) else "bf16",
                                   resident_blocks=getattr(args, "resident_blocks", "all"))
    config.validate()  # the file's variant, the VAE, the devices: before any process starts
    return config


def upscale(args, files) -> int:
    """`files`: a callable giving the (DiT, VAE, text embedding) paths (called once the input and output check out:
    the tiny set may need building)."""
    from .cli_manifest import plan_manifest, write_manifest
    from .cli_outputs import CliOutputs
    from .extend_job import keep_partial, partial_prefix_for

    outputs = CliOutputs()  # checked now (the partial file goes beside --out), published at the end
    out = outputs.add(args.out)
    manifest = plan_manifest(args, outputs, out)
    request = build_request(args)
    request.timings = request.timings or bool(manifest)  # the manifest's stage seconds (syncs at stage borders)
    request.validate()
    config = engine_config(args, files)
    with outputs:
        request.output_path = outputs.stage(out)  # the worker streams into it and publishes it complete there
        stopped: dict = {}
        with outputs.naming_failures():  # a full disk names --out, not the hidden file the worker writes
            result = run_upscale(config, request, stopped)
        if result is None:
            staged = request.output_path
            if stopped.get("frames_done") and os.path.isfile(staged) and os.path.getsize(staged) > 0:
                folder, prefix = partial_prefix_for(out)
                kept = keep_partial(staged, folder, prefix)
                print(f"Stopped after {stopped.get('batches_done')} of {stopped.get('batches')} batches; kept "
                      f"{stopped['frames_done']} frames as {kept}", file=sys.stderr)
                print(kept)
            else:
                print("Stopped before the first frames were final; nothing was written.", file=sys.stderr)
            return 130
        write_manifest(outputs, manifest, result)
        paths = outputs.publish()
    for path in paths:
        print(path)
    height, width = int(request.frames.shape[1]), int(request.frames.shape[2])
    print(f"upscale: {result.frames_done} frames {width}x{height} -> {result.width}x{result.height} in "
          f"{result.batches} batches; timings "
          + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.timings.items()),
          file=sys.stderr)
    return 0


def run_upscale(config, request, stopped: dict):
    """Run the request with "batch k/K" progress on stderr; the first Ctrl-C / SIGTERM finishes the batch and stops
    (what the job kept goes into `stopped`, the result is None; a run that finished meanwhile keeps all its frames),
    a second quits at once (cli_signals.py)."""
    from . import comfy_services as services
    from .backend.engine import EngineCancelled, get_engine
    from .cli_signals import stop_requested

    engine = get_engine(config)
    reporter = services.ProgressReporter(1, desc="SeedVR2 upscale")

    def progress(done, total):
        reporter.set_text(f"batch {done}/{total}")
        reporter.update_absolute(done, total)

    try:
        result = engine.generate(request, progress=progress, should_cancel=stop_requested)
        if stop_requested():  # after the last batch's boundary (its decode, the file's end): still a Stop
            stopped.update(batches_done=result.batches, batches=result.batches, frames_done=result.frames_done)
            return None
        return result
    except EngineCancelled as exc:
        stopped.update(exc.extra or {})
        return None
    finally:
        engine.shutdown()
