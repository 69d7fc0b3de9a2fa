"""Starting from existing latents at a strength (`denoise` < 1): what every ComfyUI sampler calls denoise and
diffusers' image-to-image pipelines call strength, on H3's two schedules.

The rule is diffusers' (its flow-match img2img `get_timesteps`): of a schedule's N evaluations the first
t_start = int(max(N - min(N * s, N), 0)) are skipped, the rest run as they are; the source is noised to the first
remaining sigma as the flow-match scheduler's `scale_noise` does, x = sigma * noise + (1 - sigma) * source, with the
noise the request's seed draws anyway (the t2va draw order is kept, so s = 1 is t2va bit for bit). Both
modalities skip the same steps (one DiT forward serves both). The soundtrack: "same" (noised and denoised like the
video), "keep" (the source's rows held clean, t = 1, never stepped: the output's audio is the source's bit for
bit) or "regenerate" (from noise, over the audio grid of the steps that remain).
"""

from __future__ import annotations

import torch

from .geometry import Geometry, RequestError
from .layout import PackedLayout, audio_latents_to_rows, patchify
from .schedule import DualSchedule, row_t, shifted_sigmas
from .step_plan import StepPlan

INIT_AUDIO = ("same", "keep", "regenerate")


def skipped_steps(evaluations: int, strength: float) -> int:
    """diffusers' t_start: how many of `evaluations` steps a start at `strength` skips."""
    return int(max(evaluations - min(evaluations * strength, evaluations), 0))


def truncated(schedule: DualSchedule, strength: float, init_audio: str, audio_shift: float) -> DualSchedule:
    """The schedule a start at `strength` runs: both ladders from step t_start on; audio "regenerate": the audio
    grid of the remaining steps from sigma 1; "keep": a constant audio ladder (the update ratio is 1: the rows
    never change; their timestep, 1, comes from the plan: step_plan)."""
    start = skipped_steps(schedule.num_evaluations, strength)
    video = schedule.video_sigmas[start:]
    if init_audio == "regenerate":
        audio = shifted_sigmas(len(video), audio_shift)
    elif init_audio == "keep":
        audio = torch.ones_like(video)
    else:
        audio = schedule.audio_sigmas[start:]
    return DualSchedule(video, audio)


def noised(source: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """scale_noise: sigma * noise + (1 - sigma) * source, float32 (sigma 1: the noise itself, bit for bit)."""
    sigma = float(sigma)
    if sigma == 1.0:
        return noise.float().clone()
    return sigma * noise.float() + (1.0 - sigma) * source.float()


def start_rows(req, geo: Geometry, schedule: DualSchedule, video_noise: torch.Tensor, audio_noise: torch.Tensor,
               patch) -> tuple[DualSchedule, torch.Tensor, torch.Tensor]:
    """(the schedule to run, target video rows [Nv, 96], target audio rows [2*Ta, 32]) of a request; from noise
    (as t2va draws it) unless it starts from `req.init_video` at `req.denoise`. Source shapes are checked against
    the loaded model's geometry here (RequestError naming both)."""
    if req.init_video is None:
        return schedule, patchify(video_noise, patch), audio_noise
    want = tuple(video_noise.shape)
    if tuple(req.init_video.shape) != want:
        raise RequestError(f"The source video latents are {tuple(req.init_video.shape)}; this request's canvas and "
                           f"length need {want} (the same frames, width and height as the source).")
    mode = req.init_audio_mode
    if req.init_audio is not None and mode != "regenerate":
        want_audio = (2, audio_noise.shape[1], geo.audio_latents)
        if tuple(req.init_audio.shape) != want_audio:
            raise RequestError(f"The source audio latents are {tuple(req.init_audio.shape)}; this request's length "
                               f"needs {want_audio}.")
    run = truncated(schedule, float(req.denoise), mode, req.audio_shift)
    video = patchify(noised(req.init_video, video_noise, run.video_sigmas[0]), patch)
    if mode == "keep":
        audio = audio_latents_to_rows(req.init_audio.float())
    elif mode == "same" and req.init_audio is not None:
        audio = noised(audio_latents_to_rows(req.init_audio), audio_noise, run.audio_sigmas[0])
    else:
        audio = audio_noise
    return run, video, audio


def step_plan(layout: PackedLayout, text: torch.Tensor, schedule: DualSchedule, init_audio: str) -> StepPlan:
    """StepPlan.on_clocks, but with kept soundtrack rows clean (t = 1) at every step."""
    if init_audio != "keep":
        return StepPlan.on_clocks(layout, text, schedule)
    return StepPlan(layout, text, schedule, lambda i: row_t(layout, float(schedule.video_t(i)), 1.0))
