"""Dual flow-match schedules (released shifts: video 12, audio 3), each row's timestep on the two clocks, and the
per-row update every denoise step makes (flow_step).

A request's shifts default to the model folder's (scheduler/ and audio_scheduler/ scheduler_config.json, read by
components.scheduler_shifts), as the reference pipeline takes them from its two scheduler components.

Convention: sigma 1 = noise, 0 = clean; t = 1 - sigma. The grid is linspace(1, 0, steps) shifted by
s*sig / (1 + (s-1)*sig) with consecutive duplicates dropped, so `steps` grid points give steps-1 model evaluations
(the released scheduler's convention). Update: x0 = x_t + (1 - t) * v (data-ward velocity), then
x_next = r * x_t + (1 - r) * x0 with r = sigma_next / sigma, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import CONDITION_T, PackedLayout

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


@dataclass
class DualSchedule:
    video_sigmas: torch.Tensor  # [N+1] float32, ends at 0
    audio_sigmas: torch.Tensor

    @classmethod
    def make(cls, steps: int, video_shift: float, audio_shift: float) -> "DualSchedule":
        return cls(shifted_sigmas(steps, video_shift), shifted_sigmas(steps, audio_shift))

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
