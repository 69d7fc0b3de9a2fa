"""H3 Extend: continue a video far past one pass, window by window on one timeline, with the sound carried on.

Thin: adapts VIDEO / H3_LATENTS / AUDIO to an H3ExtendRequest (method: backend/pipelines/h3/tasks/extend.py). The
worker streams the result into a file in ComfyUI's temp folder while it is made (memory stays that of one window);
the node returns it as a VIDEO read from that file, plus the latents of the whole result for chaining. On Stop the
finished windows are kept in the output folder as H3/extend_partial_NNNNN.mp4."""

from __future__ import annotations

import os

import torch

from .. import comfy_services as services
from ..backend.media.encode import next_free_path, release_placeholder
from ..backend.pipelines.h3.extension_plan import (CLIP, KEEP, LONGEST_WINDOW, MAX_ADDED_SECONDS,
                                                   check_window_settings, frames_to_add)
from ..backend.pipelines.h3.geometry import FPS, RequestError
from ..backend.pipelines.h3.request import H3ExtendRequest
from ..extend_job import keep_in_output, split_prompts, window_status
from ..types import H3Latents
from ..video_file import H3FileVideo
from . import native_latent_io as native_io
from .adapters import audio_to_waveform
from .sample import run_engine, run_summary, shift, with_manifest
from .widgets import sampling_extras, sampling_fields, sampling_inputs

PARTIAL_PREFIX = "H3/extend_partial"


class H3Extend:
    CATEGORY = "H3"
    FUNCTION = "extend"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = native_io.outputs(
        ("VIDEO", "H3_LATENTS"), ("video", "latents"), (
            "The whole result, source + continuation, with its sound (read from the file it was streamed into).",
            "The latents of the whole result: connect another H3 Extend to continue further.",
        ))
    DESCRIPTION = ("Continue a video with MiniMax-H3 past 15 s: each window sees the last frames and sound of what "
                   "exists as frozen guide rows on one continuous timeline, so motion and music carry on. Connect a "
                   "video, or the latents of an earlier H3 node (nothing re-encoded).")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": ("H3_ENGINE", {"tooltip": "From H3 Model Loader (uses transformer_ref/ when present)."}),
                "prompt": ("STRING", {"multiline": True, "default": "",
                                      "tooltip": "What happens next, and how it sounds. One prompt for every window, "
                                                 "or one per window separated by lines holding only ---."}),
                "seconds": ("FLOAT", {"default": 10.0, "min": 0.5, "max": MAX_ADDED_SECONDS, "step": 0.5,
                                      "tooltip": "Seconds to add, rounded up to whole 17-frame chunks (0.71 s). "
                                                 "Ignored when windows > 0."}),
                "windows": ("INT", {"default": 0, "min": 0, "max": 200,
                                    "tooltip": "Add this many full windows instead (each adds window_frames - "
                                               "overlap_frames frames); 0 = use seconds."}),
                "window_frames": ("INT", {"default": 277, "min": 2 * CLIP + KEEP, "max": LONGEST_WINDOW,
                                          "step": CLIP,
                                          "tooltip": "Frames per window, 17n+5 (277 = 11.5 s, 345 = 14.4 s, the "
                                                     "longest). Longer windows: fewer seams, more memory."}),
                "overlap_frames": ("INT", {"default": 22, "min": KEEP, "max": LONGEST_WINDOW - CLIP, "step": CLIP,
                                           "tooltip": "Frames of what exists each window sees as its guide, 17n+5 "
                                                      "(22 = 7 latent frames, 0.9 s). More: smoother, slower."}),
                "audio_mode": (["continue", "lock"],
                               {"default": "continue",
                                "tooltip": "continue: the soundtrack goes on, generated with the picture. lock: "
                                           "the driving audio (or the source's own soundtrack, when long enough) "
                                           "is kept as is from the start, and the picture follows it."}),
                **sampling_inputs("steps", "video_shift", "audio_shift", "seed",
                                  steps_tooltip="Denoising steps per window.",
                                  seed_tooltip="Same seed and settings -> the same result."),
            },
            "optional": {
                "video": ("VIDEO", {"tooltip": "The video to continue (24 fps or resampled; cut down to 17n+5 "
                                               "frames; encoded once). Or connect latents."}),
                "latents": ("H3_LATENTS", {"tooltip": "Latents of an earlier H3 Sample / Edit / Extend: continued "
                                                      "without re-encoding."}),
                "driving_audio": ("AUDIO", {"tooltip": "audio_mode lock: the soundtrack to keep, aligned with the "
                                                       "start of the source; it must last the whole result."}),
                **native_io.input_spec("Or a native MiniMax-H3 AV LATENT (a native sampler's result) to continue, "
                                       "without re-encoding: the same latents as H3_LATENTS."),
                **sampling_extras(),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, prompt=None):
        # Names only `prompt`: ComfyUI skips its own min/max checks for the inputs named here, and reports a refusal
        # once per named input. window_frames / overlap_frames keep ComfyUI's range checks; their 17n+5 grid and how
        # they fit together are checked first thing when the node runs (check_window_settings).
        if isinstance(prompt, str) and not any(p for p in split_prompts(prompt)):
            return "The prompt is empty: describe what happens next (and its sound)."
        return True

    def extend(self, engine, prompt, seconds, windows, window_frames, overlap_frames, audio_mode, steps,
               video_shift, audio_shift, seed, video=None, latents=None, driving_audio=None, native_latent=None,
               unique_id=None, **more):
        check_window_settings(window_frames, overlap_frames)  # before `added` is computed from them
        if sum(x is not None for x in (video, latents, native_latent)) != 1:
            raise ValueError("H3 Extend needs one source: connect a video, or the latents of an earlier H3 node "
                             "(ours, or a native MiniMax-H3 LATENT).")
        if native_latent is not None:
            try:
                latents = native_io.from_native(native_latent)
            except RequestError as exc:
                raise ValueError(str(exc)) from None
        added = frames_to_add(windows, seconds, window_frames, overlap_frames)
        source = _source_fields(video, latents)
        drive = audio_to_waveform(driving_audio)
        path = next_free_path(services.temp_directory(), "h3_extend/extend", "mp4")
        request = H3ExtendRequest(
            prompts=split_prompts(prompt), added_frames=added, window_frames=window_frames,
            overlap_frames=overlap_frames, audio_mode=audio_mode, steps=steps, video_shift=shift(video_shift),
            audio_shift=shift(audio_shift), seed=seed, output_path=path,
            driving_audio=drive[0] if drive else None, driving_sample_rate=drive[1] if drive else None, **source,
            **sampling_fields(more))
        try:
            result = run_engine(engine, request, steps, unique_id, status=window_status(steps),
                                on_cancelled=_keep_what_finished, summary=extend_summary)
        finally:
            release_placeholder(path)  # reserved but never published (an error, or Stop before any window)
        clip = with_manifest(H3FileVideo(path), result)
        out = H3Latents(result.video_latents, result.audio_latents, result.fps)
        return {"ui": {"text": [run_summary(result, extend_summary)]},
                "result": native_io.with_native((clip, out), out)}


def extend_summary(result) -> str:
    """Frames before and after, windows and size: shown in the node when it is done (it replaces the window status)."""
    info = result.extend or {}
    summary = (f"{info.get('source_frames')} + {info.get('added_frames')} frames = "
               f"{info.get('total_frames')} ({info.get('total_frames', 0) / FPS:.2f} s) in "
               f"{len(info.get('windows', []))} windows; {info.get('width')}x{info.get('height')}")
    if info.get("given_frames", 0) > info.get("source_frames", 0):
        summary += f"; source cut from {info['given_frames']} to {info['source_frames']} frames (17n+5)"
    return summary


def _source_fields(video, latents) -> dict:
    if latents is not None:
        return {"source_video_latents": latents.video, "source_audio_latents": latents.audio}
    from ..video_types import video_to_frames_audio

    frames, rate, wave, sample_rate = video_to_frames_audio(video)
    return {"source_frames": frames.cpu().numpy(), "source_fps": float(rate),
            "source_audio": None if wave is None else torch.as_tensor(wave), "source_sample_rate": sample_rate}


def _keep_what_finished(exc) -> str:
    extra = getattr(exc, "extra", {}) or {}
    path = extra.get("path")
    if not extra.get("windows_done") or not path or not os.path.isfile(path):
        return "Stopped by the user before the first window finished; nothing was kept."
    kept = keep_in_output(path, PARTIAL_PREFIX)
    message = (f"Stopped by the user after {extra['windows_done']} of {extra['windows']} windows; the finished part "
               f"({extra.get('seconds', 0):.2f} s) is saved as {kept}.")
    services.log.warning(message)
    return message
