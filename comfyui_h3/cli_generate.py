"""`python -m comfyui_h3 generate`: one request through the engine (same worker path as the nodes), saved as MP4."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

AUDIO_EXT = (".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".opus")


def _open_image(path: str):
    from .backend.media.images import open_rgb_image

    return open_rgb_image(path)


def reference_from_file(path: str):
    from .backend.media.decode import decode_audio, decode_video
    from .backend.media.images import IMAGE_EXTENSIONS
    from .backend.pipelines.h3.request import ReferenceInput

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Reference file not found: {path}")
    ext = Path(path).suffix.lower()
    if ext in IMAGE_EXTENSIONS:
        return ReferenceInput("image", image=_open_image(path))
    if ext in AUDIO_EXT:
        wave, rate = decode_audio(path)
        return ReferenceInput("audio", audio=wave, sample_rate=rate)
    clip = decode_video(path)
    return ReferenceInput("video", frames=clip.frames.numpy(), fps=float(clip.frame_rate), audio=clip.audio,
                          sample_rate=clip.sample_rate)


def build_request(args):
    from .backend.pipelines.h3.geometry import FPS
    from .backend.pipelines.h3.request import H3Request

    frames = args.frames if args.frames else int(round((args.seconds or 5.0) * FPS))
    return H3Request(
        prompt=args.prompt, num_frames=frames, width=args.width, height=args.height, steps=args.steps,
        video_shift=args.video_shift, audio_shift=args.audio_shift, seed=args.seed,
        first_frame=_open_image(args.first_frame) if args.first_frame else None,
        last_frame=_open_image(args.last_frame) if args.last_frame else None,
        references=[reference_from_file(p) for p in args.reference],
        decode=not args.no_decode,
    )


def generate(args, model_dir: str) -> int:
    from .backend.media.save import save_new_mp4, write_mp4

    refuse_existing(args.out, args.save_latents)
    if args.no_decode and not args.save_latents:
        raise ValueError("--no-decode produces only latents: add --save-latents FILE.safetensors.")
    request = build_request(args)
    request.validate()
    result = run_on_engine(args, model_dir, request, "denoise")
    if result is None:
        return 130
    if args.save_latents:
        _save_latents(args.save_latents, result)
        print(args.save_latents)
    if result.frames is not None:
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            path = write_mp4(os.path.abspath(args.out), result.frames, result.fps, result.audio, result.sample_rate)
        else:
            path = save_new_mp4(os.path.abspath("output"), "h3", result.frames, result.fps, result.audio,
                            result.sample_rate)
        print(path)
    print(f"task {result.task}; timings " + ", ".join(f"{k} {v:.2f}s" for k, v in result.timings.items()),
          file=sys.stderr)
    return 0


def refuse_existing(*paths) -> None:
    """Outputs are never overwritten: fail before any work when one of `paths` (None: not asked for) exists."""
    for path in paths:
        if path and os.path.exists(path):
            raise FileExistsError(f"{path} exists; choose another name (outputs are never overwritten).")


def run_on_engine(args, model_dir: str, request, desc: str, status=None, on_cancelled=None):
    """Run a request through the engine (the nodes' worker path) with progress on stderr; Ctrl-C finishes the step
    and stops. Returns the result, or None when stopped (then `on_cancelled(extra)` gets what the job kept).
    `status(done, total)` -> the text in front of each progress line."""
    from . import comfy_services as services
    from .backend.engine import EngineCancelled, get_engine
    from .backend.engine_config import EngineConfig

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    engine = get_engine(EngineConfig(model_dir=model_dir, device=args.device, dtype=dtype))
    reporter = services.ProgressReporter(args.steps, desc=desc)
    stop = {"flag": False}
    previous = signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("flag", True))  # finish the step, then stop
    try:
        def progress(done, total):
            if status is not None:
                reporter.set_text(status(done, total))
            reporter.update_absolute(done, total)

        return engine.generate(request, progress=progress, should_cancel=lambda: stop["flag"])
    except EngineCancelled as exc:
        if on_cancelled is not None:
            on_cancelled(exc.extra)
        else:
            print("Stopped at a step boundary; nothing was written.", file=sys.stderr)
        return None
    finally:
        signal.signal(signal.SIGINT, previous)
        engine.shutdown()


def _save_latents(path: str, result) -> None:
    from safetensors.torch import save_file

    tmp = f"{path}.partial"
    save_file({"video": result.video_latents.contiguous(), "audio": result.audio_latents.contiguous()}, tmp,
              metadata={"task": result.task, "fps": str(result.fps)})
    try:
        os.link(tmp, path)  # never a half-written file under the final name, and never over an existing one
    finally:
        os.unlink(tmp)
