"""`python -m comfyui_h3 generate`: one request through the engine (same worker path as the nodes), saved as MP4."""

from __future__ import annotations

import os
import sys
from pathlib import Path

AUDIO_EXT = (".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".opus")


def _open_image(path: str):
    from .backend.media.images import open_rgb_image

    return open_rgb_image(path)


def reference_from_file(path: str):
    from .backend.media.decode import decode_reference_audio, decode_reference_video
    from .backend.media.images import IMAGE_EXTENSIONS
    from .backend.pipelines.h3.request import ReferenceInput

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Reference file not found: {path}")
    ext = Path(path).suffix.lower()
    if ext in IMAGE_EXTENSIONS:
        return ReferenceInput("image", image=_open_image(path))
    # Read as the reference pipeline reads a reference (the whole soundtrack, every decoded sample).
    if ext in AUDIO_EXT:
        wave, rate = decode_reference_audio(path)
        if wave is None:
            raise ValueError(f"no audio stream in {path!r}")
        return ReferenceInput("audio", audio=wave, sample_rate=rate)
    clip = decode_reference_video(path)
    return ReferenceInput("video", frames=clip.frames.numpy(), fps=float(clip.frame_rate), audio=clip.audio,
                          sample_rate=clip.sample_rate)


def sampling_plan(args) -> tuple[str, int]:
    """(schedule, steps) of a generate command: --schedule auto is fasth3 with --fasth3, turbo with a Turbo --lora;
    --steps defaults to 50, to the ladder's 4 steps on the fasth3 schedule, or to the Turbo file's steps."""
    from .backend.models.lora import parse_lora_arg
    from .backend.models.turbo_lora import turbo_contract
    from .backend.pipelines.h3.schedule import FASTH3_STEPS

    from .tiny_model import TINY_TURBO_FILE

    files = [parse_lora_arg(text)[0] for text in getattr(args, "lora", None) or []]
    contracts = [c for c in (turbo_contract(TINY_TURBO_FILE if f == "tiny-turbo" else f) for f in files) if c]
    schedule = getattr(args, "schedule", "auto")
    if schedule == "auto":
        schedule = "fasth3" if getattr(args, "fasth3", None) else "turbo" if contracts else "default"
    default_steps = {"fasth3": FASTH3_STEPS, "turbo": contracts[0].passes if contracts else 50}.get(schedule, 50)
    return schedule, args.steps if args.steps is not None else default_steps


def sampling_fields(args, **given) -> dict:
    """The request's sampling fields (pipelines/h3/options.py SAMPLING: steps, shifts, seed, ...) from the flags
    _sampling_options made; `given`: fields a command computes itself (generate's steps)."""
    from .backend.pipelines.h3.options import SAMPLING

    return {**{o.name: o.value(getattr(args, o.name)) for o in SAMPLING if hasattr(args, o.name)}, **given}


def build_request(args):
    from .backend.pipelines.h3.geometry import FPS, MIN_SECONDS, check_duration, check_frame_count, frames_for_seconds
    from .backend.pipelines.h3.request import H3Request

    # The node's rule (its widget's 5..15 s, then frames_for_seconds): 14.5 and 15 s give the longest clip (345
    # frames), not an error; --frames N follows the same rule as N / 24 s.
    if args.seconds is not None:
        check_duration(args.seconds)
    if args.frames is not None:
        check_frame_count(args.frames)  # the user's count in the message, not the one it snaps to
    seconds = args.frames / FPS if args.frames is not None else (args.seconds if args.seconds is not None
                                                                  else MIN_SECONDS)
    frames = frames_for_seconds(seconds)
    schedule, steps = sampling_plan(args)
    return H3Request(
        prompt=args.prompt, num_frames=frames, width=args.width, height=args.height, schedule=schedule,
        **sampling_fields(args, steps=steps),
        first_frame=_open_image(args.first_frame) if args.first_frame else None,
        last_frame=_open_image(args.last_frame) if args.last_frame else None,
        references=[reference_from_file(p) for p in args.reference],
        decode=not args.no_decode,
    )


def generate(args, model_dir, build=None) -> int:
    """`model_dir`: the model folder, or a callable that finds it (called once the inputs and outputs check out);
    `build(args)`: the request (default: generate's own, build_request; refine passes its own)."""
    from .backend.media.save import write_mp4
    from .cli_manifest import finish_manifest, plan_manifest, timed_save, write_manifest
    from .cli_outputs import CliOutputs

    if args.no_decode and not args.save_latents:
        raise ValueError("--no-decode produces only latents: add --save-latents FILE.safetensors.")
    outputs = CliOutputs()  # every output checked now, written to temporaries, published together at the end
    latents = outputs.add(args.save_latents) if args.save_latents else None
    video = None
    if not args.no_decode:
        video = outputs.add(args.out) if args.out else outputs.add_numbered("output", "h3", ".mp4")
    manifest = plan_manifest(args, outputs, video or latents)
    request = (build or build_request)(args)
    request.validate()
    result = run_on_engine(args, model_dir() if callable(model_dir) else model_dir, request, "denoise")
    if result is None:
        return 130
    with outputs:
        if latents:
            outputs.write(latents, lambda tmp: save_latents_file(tmp, result))
        if video:
            with timed_save(result):
                outputs.write(video, lambda tmp: write_mp4(tmp, result.frames, result.fps, result.audio,
                                                           result.sample_rate, reserved=True))
        write_manifest(outputs, manifest, result)
        paths = outputs.publish()
    extra = finish_manifest(args, paths, result, manifest)
    for path in paths + ([extra] if extra else []):
        print(path)
    print(f"task {result.task}; timings " + ", ".join(f"{k} {v:.2f}s" for k, v in result.timings.items()),
          file=sys.stderr)
    return 0


def attention_flags(args) -> dict:
    """--attention, --vsa-topk, --vsa-dense-steps, --attention-precision as the engine config builder's arguments.
    Unlike the loader's widgets, which always carry a value, a VSA flag given without --attention vsa is a mistake
    worth naming."""
    name = getattr(args, "attention", "sdpa")
    vsa = {key: getattr(args, key, None) for key in ("vsa_topk", "vsa_dense_steps", "attention_precision")}
    if name != "vsa" and any(value is not None for value in vsa.values()):
        raise ValueError(f"--vsa-topk / --vsa-dense-steps / --attention-precision need --attention vsa (got "
                         f"--attention {name}).")
    return {"attention": name, **vsa}


def attention_spec(args):
    """The engine config's attention for the command's flags (checked by the options' rules)."""
    from .backend.pipelines.h3 import options

    return options.engine_attention(**attention_flags(args))


def lora_choices(args) -> list:
    """--lora FILE[:STRENGTH] (repeatable; 'tiny' / 'tiny-turbo' the built-in test LoRAs) -> (file, strength)
    pairs, in order."""
    from .backend.models.lora import parse_lora_arg

    pairs = []
    for text in getattr(args, "lora", None) or ():
        path, strength = parse_lora_arg(text)
        if path in ("tiny", "tiny-turbo"):
            from .tiny_model import ensure_tiny_lora

            path = str(ensure_tiny_lora(turbo=path == "tiny-turbo"))
        pairs.append((path, strength))
    return pairs


def student_file(args) -> str | None:
    """--fasth3: None, the built-in tiny student ('tiny'), or the adapter file / folder given."""
    student = getattr(args, "fasth3", None)
    if not student:
        return None
    if student == "tiny":
        from .tiny_model import ensure_tiny_student

        return str(ensure_tiny_student())
    return student


NATIVE_FILE_FLAGS = {"transformer": "transformer", "transformer_ref": "transformer_ref",
                     "text_encoder": "text_encoder", "vae": "vae", "audio_vae": "audio_vae"}  # engine part -> arg


def native_file_args(args) -> dict[str, str]:
    """--transformer / --transformer-ref / --text-encoder / --vae / --audio-vae -> {component: file} (given ones)."""
    return {part: getattr(args, flag) for part, flag in NATIVE_FILE_FLAGS.items() if getattr(args, flag, None)}


def run_on_engine(args, model_dir: str, request, desc: str, status=None, on_cancelled=None, finished=None):
    """Run a request through the engine (the nodes' worker path) with progress on stderr; Ctrl-C finishes the step
    and stops. Returns the result, or None when stopped (then `on_cancelled(extra)` gets what the job kept;
    `finished(result)` -> that `extra` for a job that completed although a Stop was asked meanwhile).
    `status(done, total)` -> the text in front of each progress line."""
    from . import comfy_services as services
    from .cli_signals import stop_requested
    from .backend.engine import EngineCancelled, get_engine
    from .backend.pipelines.h3.family import engine_config

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    engine = get_engine(engine_config(
        model_dir, **attention_flags(args), adaln_cache=getattr(args, "adaln_cache", False),
        weights="fp8" if getattr(args, "fp8", False) else "bf16",
        resident_blocks=getattr(args, "resident_blocks", "all"), device=args.device, dtype=dtype,
        student=student_file(args), files=native_file_args(args), loras=lora_choices(args)))
    reporter = services.ProgressReporter(request.steps, desc=desc)
    try:
        def progress(done, total):
            if status is not None:
                reporter.set_text(status(done, total))
            reporter.update_absolute(done, total)

        # Ctrl-C / SIGTERM (cli_signals.py): the first finishes the step, then stops; a second quits at once
        result = engine.generate(request, progress=progress, should_cancel=stop_requested)
        if stop_requested():  # the Stop came after the last step boundary (decoding, encoding): still a Stop
            raise EngineCancelled("Stopped after the last step.", finished(result) if finished else None)
        return result
    except EngineCancelled as exc:
        if on_cancelled is not None:
            on_cancelled(exc.extra)
        else:
            print("Stopped at a step boundary; nothing was written.", file=sys.stderr)
        return None
    finally:
        engine.shutdown()


def save_latents_file(path: str, result) -> None:
    """The result's latents as safetensors at `path` (a temporary of CliOutputs: published with the other outputs)."""
    from safetensors.torch import save_file

    save_file({"video": result.video_latents.contiguous(), "audio": result.audio_latents.contiguous()}, path,
              metadata={"task": result.task, "fps": str(result.fps)})
