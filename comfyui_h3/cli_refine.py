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
    from .backend.pipelines.h3.refine import refine_clip_request, refine_request
    from .cli_generate import sampling_fields, sampling_plan

    width, height = parse_size(args.size)
    schedule, steps = sampling_plan(args)
    fields = {**sampling_fields(args, steps=steps), "schedule": schedule, "decode": True}
    common = dict(width=width, height=height, denoise=args.denoise, init_audio_mode=args.source_audio)
    if args.latents:
        video, audio = load_latents(args.latents)
        return refine_request(video, audio, args.prompt, **common, **fields)
    from .backend.media.decode import decode_video

    if not os.path.isfile(args.video):
        raise FileNotFoundError(f"Video not found: {args.video}")
    clip = decode_video(args.video)
    return refine_clip_request(clip.frames.numpy(), float(clip.frame_rate), clip.audio, clip.sample_rate,
                               args.prompt, **common, **fields)


def refine(args, model_dir) -> int:
    from .cli_generate import generate

    args.no_decode = False
    return generate(args, model_dir, build=build_request)
