"""Dual flow-match schedules (released shifts: video 12, audio 3) and the per-step row timestep plan.

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


def euler_step(x: torch.Tensor, velocity: torch.Tensor, t: torch.Tensor, sigma: torch.Tensor,
               sigma_next: torch.Tensor) -> torch.Tensor:
    """One Euler step of the x_t / x0 blend, computed in float32."""
    x32 = x.float()
    x0 = x32 + (1 - t.to(x32.device, torch.float32)) * velocity.float()
    ratio = (sigma_next / sigma).to(x32.device, torch.float32)
    return (ratio * x32 + (1.0 - ratio) * x0).to(x.dtype)


def row_timestep_plan(layout: PackedLayout, video_t: float, audio_t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (distinct t values sorted [K] float32, per-row index into them [S] long).

    Text rows and target video rows ride the video clock; target audio the audio clock; visual condition rows stay
    at max(t, 0.999); reference soundtrack rows are clean (t = 1)."""
    row_t = torch.full((layout.seq_len,), video_t, dtype=torch.float32)
    vi, ai = layout.video_indices.cpu(), layout.audio_indices.cpu()
    row_t[vi[:layout.num_condition_video_rows]] = max(video_t, CONDITION_T)
    row_t[ai[layout.num_condition_audio_rows:]] = audio_t
    row_t[ai[:layout.num_condition_audio_rows]] = 1.0
    return torch.unique(row_t, sorted=True, return_inverse=True)
