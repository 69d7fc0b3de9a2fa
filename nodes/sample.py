"""H3 Sample: text (+ optional keyframes or references) -> video with its soundtrack.

The task follows what is connected: nothing -> t2va; first and/or last frame -> fl2va; reference images / video /
audio -> ref2va (against the transformer_ref partition)."""

from __future__ import annotations

from .. import comfy_services as services
from ..backend.engine import EngineCancelled, EngineError, shutdown_all
from ..backend.manifest import summary as manifest_summary
from ..backend.pipelines.h3.geometry import MAX_SECONDS, MIN_SECONDS, RequestError, frames_for_seconds
from ..backend.pipelines.h3.options import SAMPLING, STRENGTH
from ..backend.pipelines.h3.request import H3Request
from ..backend.pipelines.h3.schedule import SCHEDULES
from ..types import H3Latents
from ..video_types import H3Video
from . import native_latent_io as native_io
from .adapters import build_references, single_image, waveform_to_audio
from .sources import start_fields
from .widgets import sampling_extras, sampling_fields, sampling_inputs

def shift(value):
    """A shift widget's value for the request: None for its unset 0 (the model folder's)."""
    return SAMPLING["video_shift"].value(value)


def seconds_to_frames(seconds: float) -> int:
    return frames_for_seconds(seconds)


class H3Sample:
    CATEGORY = "H3"
    FUNCTION = "sample"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = native_io.outputs(
        ("VIDEO", "AUDIO", "H3_LATENTS"), ("video", "audio", "latents"), (
            "The generated video (uint8 frames at 24 fps) with its soundtrack: to H3 Save Video, or core video nodes.",
            "The soundtrack alone (AUDIO, 32 kHz stereo), as long as the video.",
            "The final video and audio latents: continue them with H3 Extend (nothing re-encoded).",
        ))
    DESCRIPTION = ("Generate a video with sound with MiniMax-H3. Connect a first/last frame for keyframe-to-video, "
                   "or reference images/video/audio for reference-to-video.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": ("H3_ENGINE", {"tooltip": "From H3 Model Loader."}),
                "prompt": ("STRING", {"multiline": True, "default": "",
                                      "tooltip": "What happens, what it sounds like. Required."}),
                "seconds": ("FLOAT", {"default": 5.0, "min": MIN_SECONDS, "max": MAX_SECONDS, "step": 0.5,
                                      "tooltip": "Duration at 24 fps. Frame counts snap up to 17n+5 (5 s = 124 "
                                                 "frames); above 14.375 s the longest valid clip (345 frames) "
                                                 "is made."}),
                "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32,
                                  "tooltip": "Multiple of 32; 0 with height 0 = automatic (first keyframe's "
                                             "aspect, else 16:9 at 768 short edge)."}),
                "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32,
                                   "tooltip": "Multiple of 32; 0 with width 0 = automatic."}),
                **sampling_inputs("steps", "video_shift", "audio_shift", "seed", seed_tooltip=(
                    "Same seed, same inputs -> same result (matches the diffusers reference with "
                    "torch.Generator('cpu').manual_seed(seed)).")),
            },
            "optional": {
                "first_frame": ("IMAGE", {"tooltip": "Keyframe the video starts on (stretched onto the canvas)."}),
                "last_frame": ("IMAGE", {"tooltip": "Keyframe the video ends on (cover-cropped if a first frame "
                                                    "sets the canvas)."}),
                "reference_images": ("IMAGE", {"tooltip": "Up to 9 reference images (a batch; order matters). "
                                                          "Cannot be combined with first/last frame."}),
                "reference_video": ("VIDEO", {"tooltip": "A reference video (its soundtrack counts as a reference "
                                                         "too), read after the images."}),
                "reference_audio": ("AUDIO", {"tooltip": "A reference soundtrack, read last; needs an image or "
                                                         "video reference beside it."}),
                "schedule": (list(SCHEDULES), {
                    "default": "default",
                    "tooltip": "default: `steps` steps on the model's shifted schedule. fasth3: the 4-step ladder "
                               "the FastH3 student was distilled on (set steps to 4; load the student in H3 Model "
                               "Loader). Text-to-video only with the student. turbo: the grid the engine's "
                               "LightX2V Turbo LoRA (H3 LoRA) was distilled for: its steps (4 or 8; set steps to "
                               "them) and its shifts (leave the shifts 0)."}),
                **native_io.input_spec(
                    "A native MiniMax-H3 AV LATENT (e.g. Empty MiniMax H3 AV Latent's, or a native sampler's) giving "
                    "the size and length: its frames replace seconds, its size width/height (leave them 0). At "
                    "denoise 1 its values are not used (sampling starts from noise, as a native sampler's does); "
                    "below 1 sampling starts from them."),
                # appended after every saved widget: workflows saved before keep their order (the sampling
                # options declared later come after these, with sampling_extras)
                "source_latents": ("H3_LATENTS", {"tooltip": (
                    "Latents to start from (an earlier H3 Sample's): their frames and size replace seconds and "
                    "width/height. Used below denoise 1 (restyle, clean up, re-time the sound).")}),
                "source_video": ("VIDEO", {"tooltip": (
                    "A video to start from (video-to-video): held onto 24 fps, cut to 17n+5 frames (its length "
                    "replaces seconds), stretched to width x height when they are set, else fitted to a 32-multiple "
                    "canvas; encoded by the VAE. Used below denoise 1.")}),
                **STRENGTH.node_inputs("optional"),
                **sampling_extras(),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, prompt=None):
        # Names only `prompt` (None when linked): ComfyUI skips its own min/max checks for every input named here
        # and reports a refusal once per named input, so seconds / width / height / steps / seed keep ComfyUI's
        # range checks. How width and height fit together (both or neither, multiples of 32, aspect) is checked by
        # the request when the node runs, before any model work (run_engine).
        if isinstance(prompt, str) and not prompt.strip():
            return "The prompt is empty: describe the video (and its sound)."
        return True

    def sample(self, engine, prompt, seconds, width, height, steps, video_shift, audio_shift, seed,
               first_frame=None, last_frame=None, reference_images=None, reference_video=None,
               reference_audio=None, schedule="default", native_latent=None, unique_id=None, source_latents=None,
               source_video=None, denoise=1.0, source_audio="same", **more):
        frames = seconds_to_frames(seconds)
        try:
            native = None if native_latent is None else native_io.from_native(native_latent)
            frames, width, height, start = start_fields(frames, width, height, denoise, source_audio, source_latents,
                                                        source_video, native)
        except RequestError as exc:
            raise ValueError(str(exc)) from None
        request = H3Request(
            prompt=prompt, num_frames=frames, width=width or None, height=height or None,
            steps=steps, video_shift=shift(video_shift), audio_shift=shift(audio_shift), seed=seed,
            first_frame=single_image(first_frame, "first_frame"), last_frame=single_image(last_frame, "last_frame"),
            references=build_references(reference_images, reference_video, reference_audio), schedule=schedule,
            **sampling_fields(more), **start,
        )
        return h3_outputs(run_engine(engine, request, steps, unique_id))


def h3_outputs(result, summary=None) -> dict:
    """An H3 node's return: its summary line as ui text, and (VIDEO with the manifest, AUDIO, H3_LATENTS[, the
    native LATENT]) of `result`."""
    video = with_manifest(H3Video(result.frames, result.fps, result.audio, result.sample_rate), result)
    latents = H3Latents(result.video_latents, result.audio_latents, result.fps)
    return {"ui": {"text": [run_summary(result, summary)]},
            "result": native_io.with_native((video, waveform_to_audio(result.audio, result.sample_rate), latents),
                                            latents)}


def run_engine(handle, request, total_steps: int, node_id=None, status=None, on_cancelled=None, summary=None,
               desc: str = "H3 denoise", label: str = "MiniMax-H3"):
    """Run a request on the handle's engine with ComfyUI progress and Stop; errors become node errors ("`label`
    failed: ..."; `desc` names the progress on a headless terminal).
    `status(done, total)` -> a text shown on the node with each step; `summary(result)` -> the text shown on the node
    when the run is done (ComfyUI's frontend shows this progress text in the node itself; a node's ui "text" output
    it shows only for its own nodes); `on_cancelled(EngineCancelled)` -> the message of the interrupt raised on Stop
    (e.g. naming what was kept). A request with `preview_every` gets ComfyUI's preview setting: the workers then send
    a live preview with every N-th step, shown on the node through ComfyUI's preview channel."""
    try:  # the checks VALIDATE_INPUTS leaves (inputs that fit together), before any engine is made or memory freed
        if hasattr(request, "preview_every"):
            request.preview_every = services.preview_every()
        request.validate()
    except RequestError as exc:
        raise ValueError(str(exc)) from None
    services.register_free_memory_hook(shutdown_all)  # ComfyUI's Unload Models / POST /free stops the workers
    engine = handle.engine()
    if not engine.started and handle.config.device.startswith("cuda"):
        services.free_comfy_device_memory(handle.config.device)
    reporter = services.ProgressReporter(total_steps, node_id=node_id, desc=desc)
    stop = {"requested": False}

    def progress(done, total, preview=None):
        try:
            if status is not None:
                reporter.set_text(status(done, total))
            reporter.update_absolute(done, total, None if preview is None else services.preview_image(preview))
        except services.interrupt_exception_types():
            stop["requested"] = True  # finish the step on the workers, then stop them cleanly

    def should_cancel():
        return stop["requested"] or services.interrupt_requested()

    try:
        # the config this prompt's handle names (its LoRAs), whatever another prompt retargeted the engine to
        chosen = {"config": handle.config} if hasattr(handle, "config") else {}
        result = engine.generate(request, progress=progress, should_cancel=should_cancel, **chosen)
    except EngineCancelled as exc:
        message = on_cancelled(exc) if on_cancelled is not None else "Stopped by the user."
        raise services.interrupt_exception_types()[-1](message) from None
    except RequestError as exc:
        raise ValueError(str(exc)) from None
    except EngineError as exc:
        raise RuntimeError(f"{label} failed: {exc}") from None
    text = run_summary(result, summary)
    if text:
        reporter.set_text(text)
    return result


def run_summary(result, summary=None) -> str:
    """The node's end-of-run line: `summary(result)` and the manifest's timings. Nodes also return it as their ui
    "text" (js/run_summary.js shows it in the node): a frontend that clears progress texts when the job ends (1.58)
    keeps outputs."""
    return " · ".join(t for t in (summary(result) if summary is not None else "",
                                  manifest_summary(getattr(result, "manifest", None))) if t)


def with_manifest(video, result):
    """The result's stage manifest attached to our VIDEO (`video.manifest`: H3 Save Video writes it beside the
    file; core's video nodes ignore the attribute)."""
    video.manifest = getattr(result, "manifest", None)
    return video
