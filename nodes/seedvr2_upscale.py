"""SeedVR2 Upscale: restore and upscale a video (or an IMAGE batch) in one diffusion step per batch of frames.

Thin: adapts VIDEO / IMAGE to an UpscaleRequest (method: backend/pipelines/seedvr2/). A VIDEO input, or an output too
big to hold in memory, is streamed by the worker into a file in ComfyUI's temp folder as batches finish, and comes
back as a VIDEO read from that file (as H3 Extend does); a small IMAGE batch comes back in memory (no lossy encode).
The input video's sound is carried to the output unchanged. On Stop the finished frames of a streamed output are kept
in the output folder as H3/upscale_partial_NNNNN.mp4."""

from __future__ import annotations

from fractions import Fraction

import torch

from .. import comfy_services as services
from ..backend.media.encode import as_fraction, next_free_path, release_placeholder
from ..backend.pipelines.seedvr2 import options
from ..backend.pipelines.seedvr2.request import UpscaleRequest
from ..extend_job import keep_in_output
from ..video_file import H3FileVideo
from ..video_types import H3Video
from .sample import run_engine, run_summary, with_manifest
from .seedvr2_loader import SEEDVR2_ENGINE

MEMORY_OUTPUT_BYTES = 1 << 30  # an IMAGE input whose uint8 result is larger than this is streamed to a file
PARTIAL_PREFIX = "H3/upscale_partial"
ENCODE_OPTIONS = {"crf": 18, "preset": "veryfast"}  # H3 Save Video's defaults: saving it then copies the file


class H3SeedVR2Upscale:
    CATEGORY = "H3"
    FUNCTION = "upscale"
    RETURN_TYPES = ("VIDEO",)
    RETURN_NAMES = ("video",)
    OUTPUT_TOOLTIPS = ("The upscaled video: the input's frame count and frame rate, with the input video's sound "
                       "unchanged. To H3 Save Video, or H3 Video To Images for an IMAGE batch.",)
    DESCRIPTION = ("Upscale and restore a video or images with SeedVR2 (one diffusion step per batch of frames). "
                   "Long videos run in overlapping batches, cross-faded; the result streams into a file as batches "
                   "finish, so memory stays that of one batch.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": (SEEDVR2_ENGINE, {"tooltip": "From SeedVR2 Model Loader."}),
                **options.UPSCALE.node_inputs("required"),
            },
            "optional": {
                "video": ("VIDEO", {"tooltip": "The video to upscale (its sound is carried over unchanged). Connect "
                                               "this or images."}),
                "images": ("IMAGE", {"tooltip": "Frames to upscale instead of a VIDEO (an IMAGE batch, in order; one "
                                                "image works too), at the fps below."}),
                **options.UPSCALE.node_inputs("optional"),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, batch_frames):
        # Names only `batch_frames` (ComfyUI then leaves its range to us, and reports a refusal once): its rule.
        return check_batch_frames(batch_frames)

    def upscale(self, engine, target, scale, short_side, width, height, batch_frames, overlap, color_fix, seed,
                edge, video=None, images=None, fps=24.0, vae_tile=0, unique_id=None, **more):
        family = getattr(getattr(engine, "config", None), "family", None)
        if family != "seedvr2":
            raise ValueError("SeedVR2 Upscale needs the engine of a SeedVR2 Model Loader.")
        if (video is None) == (images is None):
            raise ValueError("SeedVR2 Upscale needs one input: connect a video or images (not both).")
        # every widget by its option's rule, before int() / Fraction() of them (the request checks its own fields
        # again: it is the boundary the CLI and API callers share). `more`: options declared after these, each a
        # request field of its name.
        options.UPSCALE.check(dict(target=target, scale=scale, short_side=short_side, width=width, height=height,
                                   batch_frames=batch_frames, overlap=overlap, color_fix=color_fix, seed=seed,
                                   edge=edge, fps=fps, vae_tile=vae_tile or 0, **more))
        if video is not None:
            from ..video_file import video_frame_source

            # workers on this machine read H3 Load Video's file batch by batch; Ray's may run elsewhere
            frames, rate, wave, sample_rate = video_frame_source(video, from_file=engine.config.executor == "mp")
        else:
            frames, rate, wave, sample_rate = images_to_frames(images), as_fraction(float(fps)), None, None
        request = UpscaleRequest(frames=frames, **target_fields(target, scale, short_side, width, height),
                                 batch_frames=int(batch_frames), overlap=int(overlap), color_fix=color_fix,
                                 seed=int(seed), edge=edge, vae_tile=int(vae_tile or 0), fps=Fraction(rate),
                                 audio=None if wave is None else torch.as_tensor(wave).float().cpu(),
                                 sample_rate=sample_rate, encode_options=dict(ENCODE_OPTIONS), **more)
        request.validate()  # here too: the size estimate below reads the target
        streamed = video is not None or output_bytes(request) > MEMORY_OUTPUT_BYTES
        path = next_free_path(services.temp_directory(), "h3_upscale/upscale", "mp4") if streamed else None
        request.output_path = path
        try:
            result = run_engine(engine, request, 1, unique_id, status=batch_status,
                                on_cancelled=lambda exc: _keep_what_finished(exc, path), summary=upscale_summary(
                                    request), desc="SeedVR2 upscale", label="SeedVR2")
        finally:
            if path is not None:
                release_placeholder(path)  # reserved but never published (an error, or Stop before any frame)
        ui = {"text": [run_summary(result, upscale_summary(request))]}  # shown in the node (js/run_summary.js)
        if path is not None:
            clip = H3FileVideo(path)
            if wave is not None:  # the input's sound itself, not its AAC copy in the file (which a save copies)
                clip._audio, clip._sample_rate = request.audio, int(sample_rate)
            return {"ui": ui, "result": (with_manifest(clip, result),)}
        return {"ui": ui, "result": (with_manifest(H3Video(result.frames, rate), result),)}


def check_batch_frames(batch_frames) -> bool | str:
    """True for a batch size the request takes (the option's one rule), else what to change."""
    return options.UPSCALE["batch_frames"].error(batch_frames) or True


def target_fields(target: str, scale: float, short_side: int, width: int, height: int) -> dict:
    """The request's target size fields for the node's `target` choice (the others stay None; `target` is checked)."""
    if target == "scale":
        return {"scale": float(scale)}
    if target == "short side":
        return {"scale": None, "short_side": int(short_side)}
    return {"scale": None, "width": int(width), "height": int(height)}


def images_to_frames(images: torch.Tensor) -> torch.Tensor:
    """IMAGE [B, H, W, C] float 0..1 (C = 1, 3 or 4; alpha dropped, grey repeated) -> uint8 [B, H, W, 3] on the CPU,
    converted in chunks (no float copy of the batch). NaN / inf are refused: the conversion would hide them."""
    from ..backend.media.frames import video_to_uint8
    from ..backend.finite import check_finite

    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3, 4) or images.shape[0] < 1:
        raise ValueError(f"images must be an IMAGE [frames, height, width, 1/3/4 channels], got "
                         f"{tuple(images.shape)}.")
    check_finite(images, "images")
    images = images.expand(-1, -1, -1, 3) if images.shape[-1] == 1 else images[..., :3]
    return video_to_uint8(images).cpu()


def output_bytes(request: UpscaleRequest) -> int:
    """Bytes of the uint8 result (an estimate: the exact size rounds to the model's grid)."""
    frames, height, width = (int(s) for s in request.frames.shape[:3])
    if request.scale is not None:
        area = height * width * float(request.scale) ** 2
    elif request.short_side is not None:
        area = height * width * (int(request.short_side) / min(height, width)) ** 2
    else:
        area = int(request.width) * int(request.height)
    return int(frames * area * 3)


def batch_status(done: int, total: int) -> str:
    return f"batch {done}/{total}"


def upscale_summary(request: UpscaleRequest):
    def summary(result) -> str:
        height, width = int(request.frames.shape[1]), int(request.frames.shape[2])
        return (f"{result.frames_done} frames {width}x{height} -> {result.width}x{result.height} in {result.batches} "
                f"batch{'es' if result.batches != 1 else ''}")

    return summary


def _keep_what_finished(exc, path: str | None) -> str:
    import os

    extra = getattr(exc, "extra", {}) or {}
    done, total = extra.get("batches_done", 0), extra.get("batches", 0)
    if not extra.get("frames_done") or not path or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return "Stopped by the user before the first frames were final; nothing was kept."
    kept = keep_in_output(path, PARTIAL_PREFIX)
    message = (f"Stopped by the user after {done} of {total} batches; the {extra['frames_done']} finished frames are "
               f"saved as {kept}.")
    services.log.warning(message)
    return message
