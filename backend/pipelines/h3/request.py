"""What a caller asks the H3 pipeline for, and what it gets back. Plain data; validation lives in `validate`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from ...finite import check_finite
from . import options as h3_options
from .options import MAX_STEPS  # noqa: F401 - the nodes' and the CLI's steps bound
from .geometry import AUDIO_LATENTS_PER_SECOND, FPS, RequestError, resolve_geometry

RELEASE_AUDIO_RATE = 32000  # the released audio VAE's rate: the early checks' assumption (the worker uses its own)
def check_sampling(steps: int, video_shift: float | None, audio_shift: float | None, seed: int) -> None:
    """The settings every task shares, by their options' rules (options.py): steps, the two schedule shifts (None:
    the model folder's), the seed. A request checks every SAMPLING field it has (check_fields)."""
    h3_options.SAMPLING.check({"steps": steps, "video_shift": video_shift, "audio_shift": audio_shift, "seed": seed})


def check_preview_every(every) -> None:
    """Live previews every N denoise steps (pipelines/h3/preview.py); 0 = none."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise RequestError(f"preview_every must be a whole number of steps >= 0 (0 = no previews), got {every!r}.")


def check_schedule(schedule: str, steps: int) -> None:
    """A named schedule (schedule.py): "default", or "fasth3" -- the FastH3 student's ladder, 4 steps exactly."""
    from .schedule import FASTH3_STEPS, SCHEDULES

    if schedule not in SCHEDULES:
        raise RequestError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}.")
    if schedule == "fasth3" and steps != FASTH3_STEPS:
        raise RequestError(f"The fasth3 schedule is the FastH3 student's {FASTH3_STEPS}-step ladder: set steps to "
                           f"{FASTH3_STEPS} (got {steps}).")


@dataclass
class ReferenceInput:
    """One ref2va reference as decoded media. kind image: `image`. kind video: `frames` uint8 [T, H, W, 3] at `fps`,
    optional soundtrack `audio` [C, N] at `sample_rate`. kind audio: `audio` + `sample_rate`."""

    kind: str
    image: Image.Image | None = None
    frames: np.ndarray | None = None
    fps: float = float(FPS)
    audio: torch.Tensor | None = None
    sample_rate: int | None = None


@dataclass
class H3Request:
    prompt: str
    num_frames: int = 124
    width: int | None = None  # None: from the first keyframe's aspect, else 16:9 at 768 short edge
    height: int | None = None
    steps: int = 50  # denoising steps = model evaluations (the reference's num_inference_steps is steps + 1)
    video_shift: float | None = None  # None: the model folder's (scheduler/scheduler_config.json; release 12)
    audio_shift: float | None = None  # None: the model folder's (audio_scheduler/scheduler_config.json; release 3)
    seed: int = 0
    first_frame: Image.Image | None = None
    last_frame: Image.Image | None = None
    references: list[ReferenceInput] = field(default_factory=list)
    decode: bool = True  # False: latents only
    # -- edit task (source_frames given): see editing.py for the mask convention and the normalisation --------------
    source_frames: np.ndarray | None = None  # uint8 [T, H, W, 3] at source_fps (brought onto 24 fps / 17n+5 / 32)
    source_fps: float = float(FPS)
    source_audio: torch.Tensor | None = None  # [C, N] float32, C in (1, 2); None: no soundtrack (audio regenerated)
    source_sample_rate: int | None = None
    mask: np.ndarray | torch.Tensor | None = None  # float 0..1 [T, H, W] or [H, W] (all frames); 1 = regenerate
    preset: str = "inpaint"  # removal | replace | inpaint: defaults for grow / feather / audio
    audio_mode: str | None = None  # keep | regenerate | blend; None or "preset": the preset's
    audio_level: float | None = None  # blend level 0..1 (1 = regenerate); None: the preset's
    mask_grow: int | None = None  # px at the canvas size; None: the preset's
    mask_feather: int | None = None  # px; None: the preset's
    schedule: str = "default"  # "default": `steps` on the shifted grid; "fasth3": the FastH3 student's 4-step ladder
    preview_every: int = 0  # a live preview with every N-th step's progress (preview.py); 0: none
    step_cache: str = "off"  # off | a preset | a threshold | every:K (step_cache.py): DiT forwards reused
    # -- a start from existing latents (t2va / fl2va / ref2va; strength.py): the target's own latents ----------------
    init_video: torch.Tensor | None = None  # normalised video latents [1, 24, T, h, w] of this request's geometry
    init_audio: torch.Tensor | None = None  # normalised audio latents [2, 32, Ta]; None: the soundtrack regenerates
    denoise: float = 1.0  # strength 0 < s <= 1: the first steps skipped, the source noised to where the rest starts
    # (an edit's: its own source video, in the masked region)
    init_audio_mode: str = "same"  # same | keep | regenerate (strength.INIT_AUDIO)
    init_clip: object | None = None  # init_clip.InitClip: a decoded clip to start from (encoded by the worker)

    @property
    def task(self) -> str:
        if self.source_frames is not None:
            return "edit"
        if self.references:
            return "ref2va"
        if self.first_frame is not None or self.last_frame is not None:
            return "fl2va"
        return "t2va"

    def validate(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise RequestError("The prompt is empty: MiniMax-H3 needs a text prompt for every task.")
        self._check_finite()
        if self.source_frames is not None or self.mask is not None:
            self._validate_edit()
        if self.references and (self.first_frame is not None or self.last_frame is not None):
            raise RequestError("Give either keyframes (first/last frame) or references, not both: they are "
                               "different tasks (fl2va vs ref2va).")
        if (self.width is None) != (self.height is None):
            raise RequestError("Give width and height together, or neither (then the canvas follows the input).")
        h3_options.SAMPLING.check_fields(self)  # steps, shifts, seed: each by its option's rule
        check_schedule(self.schedule, self.steps)
        check_preview_every(self.preview_every)
        # Early checks with the release's geometry; the worker re-checks against the loaded model's own factors.
        resolve_geometry(self.num_frames, self.height or 768, self.width or 1344)
        unknown = [r.kind for r in self.references if r.kind not in ("image", "video", "audio")]
        if unknown:
            raise RequestError(f"Reference kinds must be image, video or audio, got {unknown}.")
        self._check_references()
        self._check_init()
        from .conditioning import check_reference_counts

        check_reference_counts([r.kind for r in self.references])


    def _check_init(self) -> None:
        """A start from latents: a strength in (0, 1], latents of the right rank, a soundtrack mode that has what
        it needs; the shapes against the geometry are checked in the worker (the loaded model's factors)."""
        from .strength import INIT_AUDIO

        h3_options.STRENGTH["denoise"].check(self.denoise)
        s = self.denoise
        if self.init_audio_mode not in INIT_AUDIO:
            raise RequestError(f"init_audio_mode must be one of {', '.join(INIT_AUDIO)}, got {self.init_audio_mode!r}.")
        if self.init_clip is not None:
            self._check_init_clip()
            return
        if self.source_frames is not None and self.init_video is None and self.init_audio is None:
            return  # an edit at a strength starts from its own source
        if self.init_video is None:
            if self.init_audio is not None or s != 1:
                raise RequestError("A denoise strength below 1 (or a source soundtrack) needs the source's video "
                                   "latents (or a source video) to start from.")
            return
        if self.source_frames is not None:
            raise RequestError("A start from latents is for text / keyframe / reference generation, not an edit.")
        if not isinstance(self.init_video, torch.Tensor) or self.init_video.dim() != 5 or self.init_video.shape[0] != 1:
            raise RequestError("The source video latents must be a tensor [1, channels, T, h, w].")
        if self.init_audio is not None and (not isinstance(self.init_audio, torch.Tensor) or self.init_audio.dim() != 3):
            raise RequestError("The source audio latents must be a tensor [2, channels, Ta].")
        if self.init_audio is None and (self.init_audio_mode == "keep" or (self.init_audio_mode == "same" and s != 1)):
            raise RequestError(f"init_audio_mode {self.init_audio_mode!r} needs the source's audio latents; "
                               "without them use 'regenerate'.")

    def _check_init_clip(self) -> None:
        """A source clip (init_clip.InitClip), already on this request's grids; not beside source latents."""
        from .init_clip import InitClip

        clip = self.init_clip
        if not isinstance(clip, InitClip):
            raise RequestError(f"init_clip must be an InitClip (init_clip.prepare_init_clip), got {type(clip).__name__}.")
        if self.init_video is not None or self.init_audio is not None:
            raise RequestError("Start from source latents or from a source video, not both.")
        if self.source_frames is not None:
            raise RequestError("A start from a source video is for text / keyframe / reference generation; an edit "
                               "has its own source.")
        if (clip.num_frames, clip.size) != (self.num_frames, (self.width, self.height)):
            raise RequestError(f"The source clip is {clip.size[0]}x{clip.size[1]}, {clip.num_frames} frames but the "
                               f"request asks {self.width}x{self.height}, {self.num_frames} frames: the request "
                               "follows its clip.")

    def _check_finite(self) -> None:
        check_finite(self.init_video, "source video latents")
        check_finite(self.init_audio, "source audio latents")
        check_finite(getattr(self.init_clip, "waveform", None), "source video's soundtrack")
        check_finite(self.mask, "mask")
        check_finite(self.source_frames, "source video")
        check_finite(self.source_fps, "source video's frame rate")
        check_finite(self.source_audio, "source audio")
        for index, ref in enumerate(self.references, 1):
            check_finite(ref.frames, f"reference {index} ({ref.kind}) frames")
            check_finite(ref.fps, f"reference {index} ({ref.kind}) frame rate")
            check_finite(ref.audio, f"reference {index} ({ref.kind}) audio")

    def _check_references(self) -> None:
        """What each reference must carry; the worker's processors and VAEs would fail on anything else with errors
        that name none of it. (A video's shortest length depends on the model's processor: checked there.)"""
        for index, ref in enumerate(self.references, 1):
            what = f"Reference {index} ({ref.kind})"
            if ref.kind == "image" and not isinstance(ref.image, Image.Image):
                raise RequestError(f"{what} needs an image, got {type(ref.image).__name__}.")
            if ref.kind == "video":
                frames = np.asarray(ref.frames) if ref.frames is not None else None
                if frames is None or frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
                    got = "nothing" if frames is None else f"{frames.dtype} {tuple(frames.shape)}"
                    raise RequestError(f"{what} needs uint8 frames [frames, height, width, 3], got {got}.")
            if ref.kind == "audio" and ref.audio is None:
                raise RequestError(f"{what} needs a soundtrack.")
            if ref.audio is not None:
                shape = tuple(np.shape(ref.audio))
                rate = ref.sample_rate or RELEASE_AUDIO_RATE  # unset: the model's rate (normalize_references)
                if len(shape) == 2 and shape[-1] * AUDIO_LATENTS_PER_SECOND < rate:
                    raise RequestError(f"{what}'s soundtrack is {shape[-1]} samples at {rate} Hz: give at least "
                                       f"{1 / AUDIO_LATENTS_PER_SECOND:g} s (one audio latent).")

    def _validate_edit(self) -> None:
        from .editing import check_mask_shape, resolve_preset

        if self.source_frames is None or self.mask is None:
            raise RequestError("An edit needs both a source video and a mask (1 = regenerate, 0 = keep).")
        if self.references or self.first_frame is not None or self.last_frame is not None:
            raise RequestError("An edit takes a source video and a mask; keyframes and references belong to the "
                               "other tasks.")
        check_mask_shape(tuple(np.shape(self.mask)), tuple(np.shape(self.source_frames)))
        resolve_preset(self.preset, self.mask_grow, self.mask_feather, self.audio_mode, self.audio_level)
        if self.source_audio is not None and self.source_sample_rate is None:
            raise RequestError("source_audio needs source_sample_rate.")


@dataclass
class H3Result:
    """video_latents [1, 24, T, h, w] and audio_latents [2, 32, Ta] float32 CPU (the reference's unpacked layout);
    frames uint8 [F, H, W, 3] (CPU) and audio [2, N] float32 when decoded."""

    task: str
    video_latents: torch.Tensor
    audio_latents: torch.Tensor
    frames: torch.Tensor | None
    audio: torch.Tensor | None
    sample_rate: int
    fps: int = FPS
    timings: dict = field(default_factory=dict)
    edit: dict | None = None  # task "edit": masks on the latent grids, source latents, resolved preset values
    extend: dict | None = None  # task "extend": windows, frame counts, output path
    manifest: dict | None = None  # the stage manifest (backend/manifest.py), filled by the pipeline and the engine


@dataclass
class H3ExtendRequest:
    """Continue a video past one pass (tasks/extend.py has the method). The source is either decoded media
    (`source_frames` uint8 [T, H, W, 3] at `source_fps`, optional `source_audio` [C, N] at `source_sample_rate`:
    brought onto 24 fps and a 32-multiple canvas, cut DOWN to 17n+5 frames, encoded once) or the latents of an earlier
    H3 run (`source_video_latents` [1, 24, 5n+2, h, w] + `source_audio_latents` [2, 32, Ta], normalised).

    `added_frames` is a multiple of 17 (extension_plan.added_frames_for). Audio: "continue" generates the soundtrack
    on, guided by the source's; "lock" holds a driving soundtrack clean (`driving_audio` [C, N] at
    `driving_sample_rate`, aligned with the start of the source; None: the source's own) and the output carries it.
    `output_path`: an empty file reserved with media.encode.next_free_path; the worker streams the result into it
    (H.264 at `crf` / `preset`, AAC) and publishes it complete. None: the frames come back in the result instead."""

    prompts: list[str]
    added_frames: int
    window_frames: int = 277
    overlap_frames: int = 22
    source_frames: np.ndarray | None = None
    source_fps: float = float(FPS)
    source_audio: torch.Tensor | None = None
    source_sample_rate: int | None = None
    source_video_latents: torch.Tensor | None = None
    source_audio_latents: torch.Tensor | None = None
    audio_mode: str = "continue"
    driving_audio: torch.Tensor | None = None
    driving_sample_rate: int | None = None
    steps: int = 50
    video_shift: float | None = None  # None: the model folder's, as for H3Request
    audio_shift: float | None = None
    seed: int = 0
    output_path: str | None = None
    crf: int = 18
    preset: str = "veryfast"
    metadata: dict = field(default_factory=dict)
    preview_every: int = 0  # as H3Request's (counted over all windows' steps)
    step_cache: str = "off"  # as H3Request's (each window's plan its own cache)

    task = "extend"

    def validate(self) -> None:
        from .extension_plan import CLIP, check_window_settings

        prompts = [self.prompts] if isinstance(self.prompts, str) else list(self.prompts or [])
        if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
            raise RequestError("Every extension window needs a prompt: give one for all windows, or one per window "
                               "(none may be empty).")
        self.prompts = prompts
        for value, what in ((self.source_frames, "source video"), (self.source_fps, "source video's frame rate"),
                            (self.source_audio, "source audio"), (self.source_video_latents, "source video latents"),
                            (self.source_audio_latents, "source audio latents"), (self.driving_audio, "driving audio")):
            check_finite(value, what)
        has_frames = self.source_frames is not None
        has_latents = self.source_video_latents is not None
        if has_frames == has_latents:
            raise RequestError("Give the extension one source: a video, or the latents of an earlier H3 node.")
        if has_latents:
            v, a = self.source_video_latents, self.source_audio_latents
            if v.ndim != 5 or v.shape[0] != 1 or (v.shape[2] - 2) % 5:
                raise RequestError(f"Source latents must be [1, C, 5n+2, h, w], got {tuple(v.shape)}.")
            if a is None or a.ndim != 3 or a.shape[0] != 2:
                raise RequestError("Source latents need their audio latents [2, 32, Ta].")
        else:
            shape = tuple(np.shape(self.source_frames))
            if len(shape) != 4 or shape[-1] != 3:
                raise RequestError(f"The source video must be uint8 [frames, height, width, 3], got {shape}.")
            if not self.source_fps or self.source_fps <= 0:
                raise RequestError(f"The source video needs a positive frame rate, got {self.source_fps}.")
        if self.audio_mode not in ("continue", "lock"):
            raise RequestError(f"audio_mode must be 'continue' or 'lock', got {self.audio_mode!r}.")
        if self.audio_mode == "lock" and self.driving_audio is None and (has_latents or self.source_audio is None):
            raise RequestError("audio_mode 'lock' needs a driving soundtrack: connect audio, or a source video that "
                               "has one.")
        if self.added_frames <= 0 or self.added_frames % CLIP:
            raise RequestError(f"Frames to add must be a positive multiple of {CLIP}, got {self.added_frames}.")
        check_window_settings(self.window_frames, self.overlap_frames)
        h3_options.SAMPLING.check_fields(self)  # steps, shifts, seed: each by its option's rule
        check_preview_every(self.preview_every)
        if self.output_path is not None:
            from ...media.encode import check_encoder_options

            try:  # before any worker starts writing the reserved file
                check_encoder_options("h264", self.crf, self.preset)
            except ValueError as exc:
                raise RequestError(f"Output encoding: {exc}.") from None
