"""H3 Edit: remove / replace / inpaint what a mask covers in a video, keeping the rest of it (and its sound).

Thin: adapts VIDEO / MASK / AUDIO to an H3Request with task "edit"; the math lives in backend/pipelines/h3/editing.py."""

from __future__ import annotations

import numpy as np
import torch

from ..backend.pipelines.h3.editing import AUDIO_MODES, MAX_MASK_SHAPING, PRESETS
from ..backend.pipelines.h3.options import STRENGTH
from ..backend.pipelines.h3.request import H3Request
from ..types import mask_shaping
from . import native_latent_io as native_io
from .adapters import audio_to_waveform
from .sample import h3_outputs, run_engine, shift
from .widgets import sampling_extras, sampling_fields, sampling_inputs


def mask_to_array(mask) -> np.ndarray:
    """MASK [T, H, W] or [H, W] (float 0..1, 1 = regenerate) -> float32 numpy, same shape."""
    if mask is None:
        raise ValueError("H3 Edit needs a mask (1 = regenerate, 0 = keep).")
    m = torch.as_tensor(mask).detach().float().cpu()
    if m.ndim not in (2, 3):
        raise ValueError(f"MASK must be [frames, height, width] or [height, width], got {tuple(m.shape)}.")
    return m.clamp(0.0, 1.0).numpy()


def edit_mask_shaping(mask, mask_grow: int, mask_feather: int) -> tuple[int | None, int | None]:
    """The request's (mask_grow, mask_feather): a mask is grown and feathered once. A widget set (>= 0) applies; at
    -1 the preset's applies (None), except to a MASK that H3 Mask Draw already grew or feathered: that one is used
    as it is (0)."""
    default = None if mask_shaping(mask) is None else 0
    return (default if mask_grow == -1 else mask_grow), (default if mask_feather == -1 else mask_feather)


def edit_summary(preset: str, result, shaped: tuple[int, int] | None = None) -> str:
    """What the edit resolved (preset values, size), shown in the node when it is done."""
    info = result.edit or {}
    where = f" (on H3 Mask Draw's grow {shaped[0]} px, feather {shaped[1]} px)" if shaped else ""
    return (f"preset {preset}: grow {info.get('mask_grow')} px, feather {info.get('mask_feather')} px{where}, audio "
            f"{info.get('audio_mode')} {info.get('audio_level')}; {info.get('width')}x{info.get('height')}, "
            f"{info.get('num_frames')} frames")


def edit_request(video, mask, preset, prompt, steps, seed, video_shift=0.0, audio_shift=0.0, audio_mode="preset",
                 audio_level=-1.0, mask_grow=-1, mask_feather=-1, audio=None, denoise=1.0, **more) -> H3Request:
    """H3 Edit's inputs -> the engine's request (the node's widgets' conventions: 0 shift / -1 = the default)."""
    from ..video_types import video_to_frames_audio

    frames, rate, wave, sr = video_to_frames_audio(video)
    override = audio_to_waveform(audio)
    if override is not None:
        wave, sr = override
    grow, feather = edit_mask_shaping(mask, mask_grow, mask_feather)
    return H3Request(
        prompt=prompt, steps=steps, seed=seed, video_shift=shift(video_shift), audio_shift=shift(audio_shift),
        source_frames=frames.cpu().numpy(), source_fps=float(rate), source_audio=wave, source_sample_rate=sr,
        mask=mask_to_array(mask), preset=preset, audio_mode=audio_mode,
        audio_level=None if audio_level < 0 else audio_level, mask_grow=grow, mask_feather=feather,
        denoise=denoise, **sampling_fields(more),
    )


class H3Edit:
    CATEGORY = "H3"
    FUNCTION = "edit"
    # No native LATENT input: the edit composites pixels with its source video (and shapes the mask in pixels).
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = native_io.outputs(
        ("VIDEO", "AUDIO", "H3_LATENTS"), ("video", "audio", "latents"), (
            "The edited video (at the edit size: 24 fps, 17n+5 frames, multiples of 32) with its soundtrack.",
            "The soundtrack of the edit (kept, blended or regenerated, as audio_mode says).",
            "The final video and audio latents: continue them with H3 Extend (nothing re-encoded).",
        ))
    DESCRIPTION = ("Edit a video with MiniMax-H3: regenerate what the mask covers (white = regenerate, black = keep) "
                   "following the prompt, and keep everything else as the source. Presets: "
                   + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()) + ".")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": ("H3_ENGINE", {"tooltip": "From H3 Model Loader (needs the transformer/ partition)."}),
                "video": ("VIDEO", {"tooltip": "The source: brought onto 24 fps, cut down to 17n+5 frames (5-15 s) "
                                               "and centre-cropped to multiples of 32 (the mask likewise)."}),
                "mask": ("MASK", {"tooltip": "What to regenerate: [frames, H, W] (one per video frame) or a single "
                                             "frame for all; 1 = regenerate, 0 = keep, between = blend. Same size "
                                             "as the video."}),
                "preset": (list(PRESETS), {"default": "removal",
                                           "tooltip": "removal: take the masked object out; replace: put the "
                                                      "prompt's object there; inpaint: fill the hole to fit. Sets "
                                                      "the mask growth / feather / audio defaults."}),
                "prompt": ("STRING", {"multiline": True, "default": "",
                                      "tooltip": "The whole edited video, as you want it (for removal: the scene "
                                                 "without the object). Required."}),
                **sampling_inputs("steps", "seed", "video_shift", "audio_shift"),
                "audio_mode": (["preset"] + list(AUDIO_MODES),
                               {"default": "preset",
                                "tooltip": "keep: the source soundtrack stays; regenerate: new sound from the "
                                           "prompt; blend: partly regenerated (audio_level); preset: the preset's."}),
                "audio_level": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 1.0, "step": 0.05,
                                          "tooltip": "For blend: 0 = keep .. 1 = regenerate; -1 = the preset's."}),
                "mask_grow": ("INT", {"default": -1, "min": -1, "max": MAX_MASK_SHAPING,
                                      "tooltip": "Grow the mask by this many pixels (at the edit size; a disk, as "
                                                 "H3 Mask Draw's grow); -1 = the preset's (removal 40, replace "
                                                 "22, inpaint 13), or none for a mask H3 Mask Draw already grew "
                                                 "or feathered."}),
                "mask_feather": ("INT", {"default": -1, "min": -1, "max": MAX_MASK_SHAPING,
                                         "tooltip": "Soft edge around the grown mask, in pixels (as H3 Mask Draw's "
                                                    "feather), for the final pixel composite; -1 = the preset's "
                                                    "(removal 16, replace 12, inpaint 8), or none for a mask H3 "
                                                    "Mask Draw already grew or feathered."}),
            },
            "optional": {
                "audio": ("AUDIO", {"tooltip": "Use this soundtrack as the source instead of the video's own."}),
                # appended after every saved widget: workflows saved before keep their order (the sampling
                # options declared later come after it, with sampling_extras)
                "denoise": STRENGTH["denoise"].with_(tooltip=(
                    "1 = the masked region from noise (the edit as always). Below 1 it is re-made from the source "
                    "itself, noised to where the remaining steps begin: keeps its shapes and changes its look "
                    "(H3's schedule is shifted: 0.5 restarts at sigma 0.92, 0.2 at 0.75).")).input_spec(),
                **sampling_extras(),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, prompt=None):
        if isinstance(prompt, str) and not prompt.strip():
            return "The prompt is empty: describe the edited video (and its sound)."
        return True

    def edit(self, engine, video, mask, preset, prompt, steps, seed, video_shift=0.0, audio_shift=0.0,
             audio_mode="preset", audio_level=-1.0, mask_grow=-1, mask_feather=-1, audio=None, unique_id=None,
             denoise=1.0, **more):
        request = edit_request(video, mask, preset, prompt, steps, seed, video_shift, audio_shift, audio_mode,
                               audio_level, mask_grow, mask_feather, audio, denoise=denoise, **more)
        shaped = mask_shaping(mask)
        summary = lambda r: edit_summary(preset, r, shaped)  # noqa: E731
        return h3_outputs(run_engine(engine, request, steps, unique_id, summary=summary), summary)
