"""What a task hands the one denoise driver (denoise.py), and the tables the driver builds from it.

A StepPlan states a run completely:
- `layout`: the packed rows (host). Condition / guide rows come first in `video_indices` / `audio_indices`
  (`num_condition_*_rows` of them): they are frozen, the driver never writes them;
- `text`: the prompt embeddings [1, Nt, D] on the device;
- `schedule`: the two sigma schedules (video, audio), one model evaluation per step;
- `row_timesteps(i)`: each row's timestep at step i, [S] float32 on the host (t2va / fl2va / ref2va and an
  extension window: `on_clocks`; edit: per-row timesteps from its mask);
- `anchors` (edit): rows held toward fixed values; the model sees lerp(anchor, state, weight) per row.
The tables: rotary cos / sin of this rank's rows (once per layout) and a step's AdaLN row segments (from host
tensors, so the forward never syncs with the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...models.h3_ops import RowSegments, rope_tables
from ...models.h3_transformer import MODALITY_COUNT
from .layout import PackedLayout
from .schedule import DualSchedule, row_t

StepCallback = Callable[[int, int], None]  # (steps done, total)


@dataclass
class Anchors:
    """Rows the model sees as lerp(anchor, state, weight): weight 1 is the state, 0 the anchor (exact at both).
    video [Nv, 96] / audio [Na, 32] and their weights [Nv] / [Na] float32, all on the device."""

    video: torch.Tensor
    audio: torch.Tensor
    video_weight: torch.Tensor
    audio_weight: torch.Tensor

    def model_input(self, video: torch.Tensor, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.lerp(self.video, video, self.video_weight.to(video.dtype)[:, None]),
                torch.lerp(self.audio, audio, self.audio_weight.to(audio.dtype)[:, None]))


@dataclass
class StepPlan:
    layout: PackedLayout
    text: torch.Tensor
    schedule: DualSchedule
    row_timesteps: Callable[[int], torch.Tensor]
    anchors: Anchors | None = None

    @classmethod
    def on_clocks(cls, layout: PackedLayout, text: torch.Tensor, schedule: DualSchedule) -> "StepPlan":
        """Targets ride the video / audio clocks; condition rows are held (schedule.row_t)."""
        return cls(layout, text, schedule,
                   lambda i: row_t(layout, float(schedule.video_t(i)), float(schedule.audio_t(i))))

    @property
    def steps(self) -> int:
        return self.schedule.num_evaluations


def _local(shard):
    return (lambda t: t) if shard is None else shard.local


def request_rope(dit, position_ids: torch.Tensor, shard=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of the rows this rank owns; `position_ids` [S, 3] on the DiT's device. Layout-only: once a request."""
    local = _local(shard)
    cos, sin = rope_tables(position_ids, dit.rope_inv_freq)
    return local(cos), local(sin)


def step_segments(token_tags: torch.Tensor, row_index: torch.Tensor, shard=None) -> tuple[RowSegments, RowSegments]:
    """(AdaLN segments, norm-out segments) of this rank's rows, from HOST tensors: token_tags [S], row_index [S]."""
    local = _local(shard)
    adaln_rows = row_index * MODALITY_COUNT + token_tags
    return RowSegments.from_rows(local(adaln_rows)), RowSegments.from_rows(local(row_index))
