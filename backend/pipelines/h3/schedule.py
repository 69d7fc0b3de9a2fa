"""Dual flow-match schedules (released shifts: video 12, audio 3), each row's timestep on the two clocks, and the
per-row update every denoise step makes (flow_step).

A request's shifts default to the model folder's (scheduler/ and audio_scheduler/ scheduler_config.json, read by
components.scheduler_shifts), as the reference pipeline takes them from its two scheduler components.

Convention: sigma 1 = noise, 0 = clean; t = 1 - sigma. The grid is linspace(1, 0, steps) shifted by
s*sig / (1 + (s-1)*sig) with consecutive duplicates dropped, so `steps` grid points give steps-1 model evaluations
(the released scheduler's convention). Update: x0 = x_t + (1 - t) * v (data-ward velocity), then
x_next = r * x_t + (1 - r) * x0 with r = sigma_next / sigma, in float32.

Named schedules (a request's `schedule`): "default" is the grid above with `steps` + 1 points; "fasth3" is the ladder
FastVideo's FastH3 student was distilled on (docs/FASTH3.md): the pre-shift positions 0.999, 0.749, 0.5, 0.25 -> 0
(the release's dmd_denoising_steps [999, 749, 500, 250] / 1000), each shifted like the grid by the request's video and
audio shifts: 4 model evaluations, the same deterministic update (FastVideo and vLLM-Omni sample the student with
their ordinary Euler step: no fresh noise between steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import CONDITION_T, PackedLayout

SCHEDULES = ("default", "fasth3", "turbo")  # turbo: the default grid at a Turbo LoRA's steps and shifts (turbo.py)
FASTH3_POSITIONS = (0.999, 0.749, 0.5, 0.25, 0.0)
FASTH3_STEPS = len(FASTH3_POSITIONS) - 1
RELEASE_VIDEO_SHIFT = 12.0
RELEASE_AUDIO_SHIFT = 3.0
SCHEDULER_DEFAULT_SHIFT = 12.0  # diffusers' MiniMaxH3Scheduler(shift=12.0): a config without `shift` gets this


def shifted_sigmas(steps: int, shift: float) -> torch.Tensor:
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (grid points, terminal 0 included), got {steps}.")
    if shift <= 0:
        raise ValueError(f"shift must be positive, got {shift}.")
    base = torch.linspace(1.0, 0.0, int(steps), dtype=torch.float32)
    return torch.unique_consecutive(shift * base / (1 + (shift - 1) * base))


def shifted_positions(positions, shift: float) -> torch.Tensor:
    """A ladder of pre-shift positions (1 = noise .. 0) -> float32 sigmas, by the grid's shift formula."""
    if shift <= 0:
        raise ValueError(f"shift must be positive, got {shift}.")
    base = torch.tensor(positions, dtype=torch.float32)
    return shift * base / (1 + (shift - 1) * base)


@dataclass
class DualSchedule:
    video_sigmas: torch.Tensor  # [N+1] float32, ends at 0
    audio_sigmas: torch.Tensor

    @classmethod
    def make(cls, steps: int, video_shift: float, audio_shift: float) -> "DualSchedule":
        return cls(shifted_sigmas(steps, video_shift), shifted_sigmas(steps, audio_shift))

    @classmethod
    def named(cls, name: str, steps: int, video_shift: float, audio_shift: float) -> "DualSchedule":
        """A request's schedule: "default" or "turbo" (`steps` evaluations on the grid; turbo's steps and shifts
        are its LoRA's, filled in by turbo.py) or "fasth3" (its 4-step ladder)."""
        if name == "fasth3":
            return cls(shifted_positions(FASTH3_POSITIONS, video_shift),
                       shifted_positions(FASTH3_POSITIONS, audio_shift))
        if name not in ("default", "turbo"):
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}.")
        return cls.make(steps + 1, video_shift, audio_shift)

    @property
    def num_evaluations(self) -> int:
        return min(len(self.video_sigmas), len(self.audio_sigmas)) - 1

    def video_t(self, i: int) -> torch.Tensor:
        return 1.0 - self.video_sigmas[i]

    def audio_t(self, i: int) -> torch.Tensor:
        return 1.0 - self.audio_sigmas[i]


def flow_step(state: torch.Tensor, x_in: torch.Tensor, velocity: torch.Tensor, row_t: torch.Tensor,
              sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
    """One update of rows [N, C], in float32: x0 = x_in + (1 - t_r) * v from the model's own input and each row's
    timestep t_r [N]; then state <- r * state + (1 - r) * x0, r = sigma_next / sigma. Where the model saw the state
    itself (x_in = state, t_r = 1 - sigma) this is the Euler step of the flow."""
    x0 = x_in.float() + (1.0 - row_t.float())[:, None] * velocity.float()
    ratio = (sigma_next / sigma).to(state.device, torch.float32)
    return ratio * state.float() + (1.0 - ratio) * x0


def row_t(layout: PackedLayout, video_t: float, audio_t: float) -> torch.Tensor:
    """Each row's timestep [S] float32 when targets ride the two clocks: text rows and target video rows at
    `video_t`, target audio at `audio_t`; visual condition rows stay at max(t, 0.999); reference soundtrack rows are
    clean (t = 1)."""
    t = torch.full((layout.seq_len,), video_t, dtype=torch.float32)
    vi, ai = layout.video_indices.cpu(), layout.audio_indices.cpu()
    t[vi[:layout.num_condition_video_rows]] = max(video_t, CONDITION_T)
    t[ai[layout.num_condition_audio_rows:]] = audio_t
    t[ai[:layout.num_condition_audio_rows]] = 1.0
    return t


def row_timestep_plan(layout: PackedLayout, video_t: float, audio_t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (distinct t values sorted [K] float32, per-row index into them [S] long) of `row_t`."""
    return torch.unique(row_t(layout, video_t, audio_t), sorted=True, return_inverse=True)
