"""`python -m comfyui_h3 edit`: mask editing of one video through the engine (the node's worker path), saved as MP4.

Mask files: an image (PNG, ...) applies to every frame; a video (mp4, ...) is read as luma, one mask frame per video
frame; an .npz holds array 'mask' ([T, H, W] or [H, W], float 0..1 or uint8 0..255). 1 / white = regenerate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np


def load_mask(path: str) -> np.ndarray:
    """-> float32 [T, H, W] or [H, W] in 0..1."""
    from .backend.media.images import IMAGE_EXTENSIONS

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Mask file not found: {path}")
    ext = Path(path).suffix.lower()
    if ext == ".npz":
        with np.load(path) as data:
            if "mask" not in data:
                raise ValueError(f"{path} has no array named 'mask' (it has {', '.join(data.files) or 'none'}).")
            mask = np.asarray(data["mask"])
    elif ext in IMAGE_EXTENSIONS:
        from PIL import Image

        with Image.open(path) as image:
            mask = np.asarray(image.convert("L"))
    else:
        from .backend.media.decode import decode_video

        frames = decode_video(path).frames.numpy().astype(np.float32)
        mask = frames @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # BT.601 luma, 0..255
    from .backend.finite import check_finite

    check_finite(mask, f"mask in {path}")  # np.clip keeps NaN: refuse it here, naming the file
    if mask.dtype == np.uint8 or (mask.size and mask.max() > 1.0):
        mask = mask.astype(np.float32) / 255.0
    if mask.ndim not in (2, 3):
        raise ValueError(f"The mask must be [frames, height, width] or [height, width], got {mask.shape} from {path}.")
    return np.clip(mask.astype(np.float32), 0.0, 1.0)


def build_request(args):
    from .backend.media.decode import decode_video
    from .backend.pipelines.h3.request import H3Request
    from .cli_generate import sampling_fields

    if not os.path.isfile(args.video):
        raise FileNotFoundError(f"Video not found: {args.video}")
    clip = decode_video(args.video)
    return H3Request(
        prompt=args.prompt, **sampling_fields(args), source_frames=clip.frames.numpy(),
        source_fps=float(clip.frame_rate),
        source_audio=clip.audio, source_sample_rate=clip.sample_rate, mask=load_mask(args.mask), preset=args.mode,
        audio_mode=args.audio_mode, audio_level=args.audio_level, mask_grow=args.mask_grow,
        mask_feather=args.mask_feather, denoise=args.denoise, decode=True,
    )


def edit(args, model_dir) -> int:
    """`model_dir`: the model folder, or a callable that finds it (called once the inputs and outputs check out)."""
    from .backend.media.save import write_mp4
    from .cli_generate import run_on_engine, save_latents_file
    from .cli_manifest import plan_manifest, timed_save, write_manifest
    from .cli_outputs import CliOutputs

    outputs = CliOutputs()  # checked now, written to temporaries, published together
    latents = outputs.add(args.save_latents) if args.save_latents else None
    video = outputs.add(args.out)
    manifest = plan_manifest(args, outputs, video)
    request = build_request(args)
    request.validate()
    result = run_on_engine(args, model_dir() if callable(model_dir) else model_dir, request, "edit")
    if result is None:
        return 130
    with outputs:
        if latents:
            outputs.write(latents, lambda tmp: save_latents_file(tmp, result))
        with timed_save(result):
            outputs.write(video, lambda tmp: write_mp4(tmp, result.frames, result.fps, result.audio,
                                                       result.sample_rate, reserved=True))
        write_manifest(outputs, manifest, result)
        paths = outputs.publish()
    for path in paths:
        print(path)
    info = result.edit or {}
    print(f"edit ({args.mode}): grow {info.get('mask_grow')} px, feather {info.get('mask_feather')} px, audio "
          f"{info.get('audio_mode')} {info.get('audio_level')}; {info.get('width')}x{info.get('height')}, "
          f"{info.get('num_frames')} frames; timings "
          + ", ".join(f"{k} {v:.2f}s" for k, v in result.timings.items()), file=sys.stderr)
    return 0
