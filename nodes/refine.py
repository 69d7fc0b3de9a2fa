"""H3 Refine: the latent route to 1080p -- a clip's latents upscaled in latent space and denoised again by H3 at the
target size from a strength (pipelines/h3/refine.py has the method, its interpolation and its defaults)."""

from __future__ import annotations

from ..backend.pipelines.h3.geometry import RequestError
from ..backend.pipelines.h3.options import REFINE, STRENGTH
from ..backend.pipelines.h3.refine import REFINE_AUDIO, REFINE_DENOISE, refine_request, refine_size, source_size
from ..backend.pipelines.h3.schedule import SCHEDULES
from ..types import H3Latents
from . import native_latent_io as native_io
from .sample import h3_outputs, run_engine, shift
from .widgets import sampling_extras, sampling_fields, sampling_inputs


def refine_summary(source: H3Latents, width: int, height: int, denoise: float):
    def summary(result):
        w, h = source_size(source.video)
        return f"refined {w}x{h} -> {width}x{height} at denoise {denoise:g}"
    return summary


class H3Refine:
    CATEGORY = "H3"
    FUNCTION = "refine"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = native_io.outputs(
        ("VIDEO", "AUDIO", "H3_LATENTS"), ("video", "audio", "latents"), (
            "The refined video (uint8 frames at 24 fps) with its soundtrack: to H3 Save Video.",
            "The soundtrack alone (AUDIO, 32 kHz stereo).",
            "The refined latents at the new size.",
        ))
    DESCRIPTION = ("Upscale an H3 clip to 1080p (or another size) in latent space and let H3 denoise it again there: "
                   "the second route to high resolution besides SeedVR2 -- one model, H3's own look. Connect "
                   "H3 Sample's latents (or a native MiniMax-H3 AV LATENT).")

    @classmethod
    def INPUT_TYPES(cls):
        denoise = STRENGTH["denoise"].with_(default=REFINE_DENOISE, tooltip=(
            "How much the second pass re-makes. 0.2 (default): 10 of 50 steps, restarting at sigma 0.75 on H3's "
            "shift-12 schedule -- replaces the upscale's blur with detail and keeps composition and motion. Higher "
            "re-invents more (0.5 restarts at 0.92)."))
        source_audio = STRENGTH["source_audio"].with_(default=REFINE_AUDIO, tooltip=(
            "keep (default): the source's soundtrack exactly. same: re-made at the strength. regenerate: new."))
        return {
            "required": {
                "engine": ("H3_ENGINE", {"tooltip": "From H3 Model Loader (the model that made the latents)."}),
                "prompt": ("STRING", {"multiline": True, "default": "",
                                      "tooltip": "The prompt of the clip (the second pass is conditioned on it)."}),
                **REFINE.inputs("target", "short_side", "scale", "width", "height"),
                "denoise": denoise.input_spec(),
                **sampling_inputs("steps", "video_shift", "audio_shift", "seed", steps_tooltip=(
                    "Steps of the full schedule; the pass runs the last denoise x steps of them.")),
            },
            "optional": {
                "latents": ("H3_LATENTS", {"tooltip": "The clip to refine: H3 Sample's (or H3 Extend's) latents."}),
                "source_audio": source_audio.input_spec(),
                "schedule": (list(SCHEDULES), {"default": "default", "tooltip": (
                    "default: the shifted grid of `steps`. fasth3: the FastH3 student's 4-step ladder (load the "
                    "student; steps 4). turbo: the grid the engine's LightX2V Turbo LoRA was distilled for (its "
                    "steps and shifts; add it with H3 LoRA).")}),
                **native_io.input_spec("A native MiniMax-H3 AV LATENT to refine instead of latents."),
                **sampling_extras(),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, prompt=None):
        if isinstance(prompt, str) and not prompt.strip():
            return "The prompt is empty: give the clip's prompt (the second pass is conditioned on it)."
        return True

    def refine(self, engine, prompt, target, short_side, scale, width, height, denoise, steps, video_shift,
               audio_shift, seed, latents=None, source_audio=REFINE_AUDIO, schedule="default", native_latent=None,
               unique_id=None, **more):
        try:
            if (latents is None) == (native_latent is None):
                raise RequestError("Connect the clip to refine: latents (H3 Sample's) or native_latent, one of them.")
            source = latents if latents is not None else native_io.from_native(native_latent)
            width, height = refine_size(source_size(source.video), target, short_side, scale, width, height)
            request = refine_request(source.video, source.audio, prompt, width, height, denoise, source_audio,
                                     steps=steps, video_shift=shift(video_shift), audio_shift=shift(audio_shift),
                                     seed=seed, schedule=schedule, **sampling_fields(more))
        except RequestError as exc:
            raise ValueError(str(exc)) from None
        summary = refine_summary(source, width, height, denoise)
        return h3_outputs(run_engine(engine, request, steps, unique_id, desc="H3 refine", summary=summary), summary)
