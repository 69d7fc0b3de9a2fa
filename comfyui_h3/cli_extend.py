"""`python -m comfyui_h3 extend`: continue a video through the engine (the node's worker path). The worker streams
the result into --out while it is made; Ctrl-C finishes the current step and keeps the finished windows as
<out>_partial_NNNNN.mp4."""

from __future__ import annotations

import os
import sys


def build_request(args, out_path: str):
    from .backend.media.decode import decode_audio, decode_video
    from .backend.pipelines.h3.extension_plan import frames_to_add
    from .backend.pipelines.h3.request import H3ExtendRequest
    from .cli_generate import sampling_fields

    if not os.path.isfile(args.video):
        raise FileNotFoundError(f"Video not found: {args.video}")
    clip = decode_video(args.video)
    drive = rate = None
    if args.driving_audio:
        if not os.path.isfile(args.driving_audio):
            raise FileNotFoundError(f"Driving audio not found: {args.driving_audio}")
        drive, rate = decode_audio(args.driving_audio)
    added = frames_to_add(args.windows, args.seconds, args.window_frames, args.overlap_frames)
    return H3ExtendRequest(
        prompts=args.prompt or [""], added_frames=added, window_frames=args.window_frames,
        overlap_frames=args.overlap_frames, source_frames=clip.frames.numpy(), source_fps=float(clip.frame_rate),
        source_audio=clip.audio, source_sample_rate=clip.sample_rate, audio_mode=args.audio_mode,
        driving_audio=drive, driving_sample_rate=rate, **sampling_fields(args), output_path=out_path, crf=args.crf,
        metadata={"comment": "comfyui-h3 extend"})


def finished_windows(result, request) -> dict:
    """What a run that finished every window although Ctrl-C came meanwhile kept (as a Stop's report says it)."""
    info = result.extend or {}
    windows, frames = len(info.get("windows", [])), int(info.get("total_frames") or 0)
    return {"windows_done": windows, "windows": windows, "frames": frames, "path": request.output_path,
            "seconds": frames / float(result.fps)}


def extend(args, model_dir) -> int:
    """`model_dir`: the model folder, or a callable that finds it (called once the inputs and outputs check out)."""
    from .cli_generate import run_on_engine, save_latents_file
    from .cli_manifest import plan_manifest, write_manifest
    from .cli_outputs import CliOutputs
    from .extend_job import keep_partial, partial_prefix_for, window_status

    if args.windows is None and args.seconds is None:
        raise ValueError("Say how much to add: --seconds S or --windows N.")
    outputs = CliOutputs()  # checked now (the partial file goes beside --out), published together at the end
    latents = outputs.add(args.save_latents) if args.save_latents else None
    out = outputs.add(args.out)
    manifest = plan_manifest(args, outputs, out)
    request = build_request(args, out)
    request.validate()
    model_dir = model_dir() if callable(model_dir) else model_dir
    with outputs:
        request.output_path = outputs.stage(out)  # the worker streams into it and publishes it complete there
        stopped = {}
        with outputs.naming_failures():  # a full disk names --out, not the hidden file the worker writes
            result = run_on_engine(args, model_dir, request, "extend", status=window_status(args.steps),
                                   on_cancelled=stopped.update, finished=lambda done: finished_windows(done, request))
        if result is None:
            if stopped.get("windows_done") and os.path.isfile(stopped.get("path") or ""):
                folder, prefix = partial_prefix_for(out)
                kept = keep_partial(stopped["path"], folder, prefix)
                print(f"Stopped after {stopped['windows_done']} of {stopped['windows']} windows; kept "
                      f"{stopped.get('seconds', 0):.2f} s as {kept}", file=sys.stderr)
                print(kept)
            return 130
        if latents:
            outputs.write(latents, lambda tmp: save_latents_file(tmp, result))
        write_manifest(outputs, manifest, result)  # the file was streamed on the worker (its time: the stages)
        paths = outputs.publish()
    for path in paths:
        print(path)
    info = result.extend or {}
    print(f"extend: {info.get('source_frames')} + {info.get('added_frames')} = {info.get('total_frames')} frames in "
          f"{len(info.get('windows', []))} windows, {info.get('width')}x{info.get('height')}; timings "
          + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items()), file=sys.stderr)
    return 0
