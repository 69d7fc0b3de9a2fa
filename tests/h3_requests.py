"""Small H3 requests the pipeline-level tests share: a t2va / fl2va / edit / extend set on 64x96 sources (the AdaLN cache,
VSA and pruned-file tests run the same requests), and an extension source with motion and sound."""

import numpy as np
import torch

from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest, H3Request

def t2va(**kw):
    base = dict(prompt="thunder over hills", num_frames=124, steps=3, seed=9, width=64, height=64, decode=False)
    base.update(kw)
    return H3Request(**base)


def source_media():
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    wave = torch.from_numpy(rng.standard_normal((2, 32000 * 5)).astype(np.float32) * 0.1)
    return frames, wave


def edit():
    """A left-to-right ramp mask, no grow / feather: every token column regenerates by its own amount, so each step
    has several per-row timesteps (and the audio blends at its own level)."""
    frames, wave = source_media()
    mask = np.tile(np.linspace(0.0, 1.0, 96, dtype=np.float32), (64, 1))
    return H3Request(prompt="a boat", steps=2, seed=3, source_frames=frames, mask=mask, preset="replace",
                     mask_grow=0, mask_feather=0, audio_mode="blend", audio_level=0.5, source_audio=wave,
                     source_sample_rate=32000, decode=False)


def extend():
    frames, wave = source_media()
    return H3ExtendRequest(prompts=["waves"], added_frames=51, window_frames=56, overlap_frames=22, steps=2, seed=1,
                           source_frames=frames, source_audio=wave, source_sample_rate=32000)


REQUESTS = {"t2va": t2va, "fl2va": lambda: t2va(first_frame=keyframe(), width=None, height=None),
            "edit": edit, "extend": extend}


def keyframe():
    from PIL import Image

    return Image.new("RGB", (96, 64), (200, 80, 10))


def extension_source(seed=0, frames=130):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:64, 0:96]
    base = np.stack([x * 2, y * 3, x + y], -1).astype(np.int64)
    video = np.stack([(base + 4 * t + rng.integers(0, 16, base.shape)) % 256 for t in range(frames)]).astype(np.uint8)
    wave = torch.from_numpy(rng.standard_normal((2, 32000 * 6)).astype(np.float32) * 0.1)
    return video, wave


def extension_request(**kw):
    video, wave = extension_source()
    args = dict(prompts=["a red kite over the sea, wind"], added_frames=17 * 7, window_frames=56, overlap_frames=22,
                source_frames=video, source_audio=wave, source_sample_rate=32000, steps=2, seed=5)
    args.update(kw)
    return H3ExtendRequest(**args)


def on_two_gloo_ranks(model_dir, request):
    """`request` through an engine of two CPU ranks (gloo, one thread each) on the model folder: the result."""
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    engine = Engine(h3_config(str(model_dir), dtype="float32", world_size=2, cpu_threads=1))
    try:
        return engine.generate(request)
    finally:
        engine.shutdown()
