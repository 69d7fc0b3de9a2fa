"""`python -m comfyui_h3 refine`: H3 Refine from the shell -- a clip's latents (generate --save-latents) or a video
file taken to a larger size and denoised again there (pipelines/h3/refine.py), saved as MP4 like generate."""

from __future__ import annotations

import os


def parse_size(text: str) -> tuple[int, int]:
    """'1920x1088' -> (1920, 1088)."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size must be WIDTHxHEIGHT, e.g. 1920x1088, got {text!r}.") from None
    return width, height


def load_latents(path: str):
    """generate --save-latents' file -> (video [1, 24, T, h, w], audio [2, 32, Ta] or None), float32."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Latents file not found: {path}")
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        if "video" not in keys:
            raise ValueError(f"{path} holds no 'video' latents (it has {', '.join(sorted(keys)) or 'nothing'}); "
                             "write them with generate --save-latents.")
        return f.get_tensor("video").float(), f.get_tensor("audio").float() if "audio" in keys else None


def build_request(args):
    from .backend.pipelines.h3.refine import refine_clip_request, refine_request, source_size
    from .cli_generate import sampling_fields, sampling_plan

    schedule, steps = sampling_plan(args)
    fields = {**sampling_fields(args, steps=steps), "schedule": schedule, "decode": True}
    strength = dict(denoise=args.denoise, init_audio_mode=args.source_audio)
    if args.latents:
        video, audio = load_latents(args.latents)
        width, height = target_size(args, source_size(video))
        return refine_request(video, audio, args.prompt, width, height, **strength, **fields)
    from .backend.media.decode import decode_video
    from .backend.pipelines.h3.init_clip import fitted_size

    if not os.path.isfile(args.video):
        raise FileNotFoundError(f"Video not found: {args.video}")
    clip = decode_video(args.video)
    frames, fps = clip.frames.numpy(), float(clip.frame_rate)
    width, height = target_size(args, fitted_size(frames))  # the clip's own canvas
    return refine_clip_request(frames, fps, clip.audio, clip.sample_rate, args.prompt, width, height, **strength,
                               **fields)


def target_size(args, source: tuple[int, int]) -> tuple[int, int]:
    """--size WxH, --scale X or --short-side N (default: short side 1088) for a source of (width, height)."""
    from .backend.pipelines.h3.refine import refine_size

    if args.size:
        width, height = parse_size(args.size)
        return refine_size(source, "size", width=width, height=height)
    if args.scale is not None:
        return refine_size(source, "scale", scale=args.scale)
    if args.short_side is not None:
        return refine_size(source, "short_side", short_side=args.short_side)
    return refine_size(source)  # the node's default target: short side 1088


def refine(args, model_dir) -> int:
    from .cli_generate import generate

    args.no_decode = False
    return generate(args, model_dir, build=build_request)
