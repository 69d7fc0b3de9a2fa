"""SeedVR2 long videos: frame batches restored independently, then cross-faded where they overlap.

Plan: batches of B frames (4n+1, >= 5 unless B covers the whole video) start every B - O frames (O = overlap, 0 <= O < B); the last batch is slid
back to end at the last frame, so every batch has B frames (no short tail) and the last overlap may exceed O. A video
of at most B frames is one batch of its own length (the model input pads it to 4n+1).

Weights: batch b's weight on frame f is p_b(f) normalised over the batches covering f, p_b = in_b * out_b, where
in_b ramps up over the frames b shares with its predecessor (L of them: (1 - cos(pi * (j + 1) / (L + 1))) / 2,
j = 0..L-1, never 0 or 1) and out_b is 1 minus its successor's ramp over the frames they share. Where two batches
meet this is a raised-cosine cross-fade whose two weights are complementary; where three meet (O > B / 2, or the
slid last batch) the normalisation keeps the sum at 1. The incoming batch's first frames get the lowest weights
(they carry the causal VAE's first-frame artefact). Frames covered by one batch have weight exactly 1.

Shots: a clip with hard cuts (scene_cuts.py) is planned shot by shot (`plan_shots`): each shot's batches as
above, never one batch or one cross-fade across a cut (the batches on either side of a cut meet with no overlap).

Streaming: `StreamBlender` takes the batches' output frames in order and returns each frame as soon as no later
batch covers it; it holds only the overlap frames (float32), so the whole clip never sits in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ...errors import RequestError
from ...models.seedvr2.windows import window_size
from .options import MIN_BATCH_FRAMES

Span = Tuple[int, int]


def padded_frames(frames: int) -> int:
    """The clip length the model runs for `frames` video frames: the next 4n+1 (the last frame repeated; at least
    1). The one home of this rule (official: 1 stays 1, else frames padded up to 4n+1)."""
    frames = max(int(frames), 1)
    return frames + (-(frames - 1)) % 4


def latent_frames(frames: int) -> int:
    """Latent frames the causal VAE makes of `frames` video frames (padded to 4n+1 first): n+1 of 4n+1."""
    return (padded_frames(frames) - 1) // 4 + 1


def keeps_temporal_attention(batch: int) -> bool:
    """True when a batch of `batch` frames gives temporal windows of more than one latent frame (batch >= 17)."""
    return window_size((latent_frames(batch), 1, 1))[0] > 1


@dataclass(frozen=True)
class BatchPlan:
    """frames: the video's frame count; batch, overlap: as asked; spans: (start, stop) of each batch, in order,
    starts increasing; warning: a one-line note for the user (None when nothing to say); cuts: the frames that
    start a new shot, where no batch crosses (plan_shots)."""

    frames: int
    batch: int
    overlap: int
    spans: Tuple[Span, ...]
    warning: Optional[str] = None
    cuts: Tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.spans)

    @property
    def max_overlap(self) -> int:
        """Most frames two consecutive batches share (the frames a blender holds at most)."""
        return max([self.spans[i][1] - self.spans[i + 1][0] for i in range(self.count - 1)], default=0)

    def final_before(self, index: int) -> int:
        """Frames [0, final_before(index)) are final once batch `index` is in: no later batch covers them."""
        return self.spans[index + 1][0] if index + 1 < self.count else self.frames


def plan_batches(frames: int, batch: int, overlap: int) -> BatchPlan:
    """Batches for a video of `frames` frames (see the module docstring). RequestError on a bad batch or overlap."""
    frames, batch, overlap = int(frames), int(batch), int(overlap)
    if frames < 1:
        raise RequestError(f"SeedVR2 needs at least 1 frame, got {frames}.")
    # 4n+1 always; a single batch may be shorter than 5 (a 1-frame input), several need >= 5 (one latent frame of
    # history besides the first)
    if batch < 1 or batch % 4 != 1 or (batch < MIN_BATCH_FRAMES and frames > batch):
        raise RequestError(f"SeedVR2 batch frames must be 4n+1 and at least {MIN_BATCH_FRAMES} (5, 9, 13, 17, 21, ...) "
                           f"for a video of {frames} frames, got {batch}.")
    if not 0 <= overlap < batch:
        raise RequestError(f"SeedVR2 overlap must be 0..{batch - 1} frames (smaller than the batch of {batch}), "
                           f"got {overlap}.")
    if frames <= batch:
        return BatchPlan(frames, batch, overlap, ((0, frames),))
    stride = batch - overlap
    starts = list(range(0, frames - batch, stride)) + [frames - batch]  # the last one slid back to end at the end
    warning = None
    if not keeps_temporal_attention(batch):
        warning = (f"SeedVR2 batches of {batch} frames have no temporal attention (one latent frame per window): "
                   f"expect flicker; use 17 frames or more.")
    return BatchPlan(frames, batch, overlap, tuple((s, s + batch) for s in starts), warning)


def plan_shots(frames: int, batch: int, overlap: int, cuts: Sequence[int] = ()) -> BatchPlan:
    """plan_batches for each shot of a clip cut at `cuts` (frame indices that start a shot), joined in order: no
    batch spans a cut and consecutive batches across one share no frame. No cuts: exactly plan_batches."""
    frames = int(frames)
    edges = [0] + sorted({int(c) for c in cuts if 0 < int(c) < frames}) + [frames]
    if len(edges) == 2:
        return plan_batches(frames, batch, overlap)
    spans, warnings = [], []
    for start, stop in zip(edges, edges[1:]):
        shot = plan_batches(stop - start, batch, min(overlap, batch - 1))
        spans += [(start + s, start + e) for s, e in shot.spans]
        if shot.warning and shot.warning not in warnings:
            warnings.append(shot.warning)
    return BatchPlan(frames, int(batch), int(overlap), tuple(spans), " ".join(warnings) or None, tuple(edges[1:-1]))


def _ramp_up(length: int) -> torch.Tensor:
    j = torch.arange(length, dtype=torch.float64)
    return (1.0 - torch.cos(math.pi * (j + 1.0) / (length + 1.0))) / 2.0


def blend_weights(plan: BatchPlan) -> Tuple[torch.Tensor, ...]:
    """Per batch, float64 [stop - start] (CPU): its weight on each of its frames. Over the batches covering a frame
    the weights sum to 1 (to float64 rounding; exactly 1 where one batch covers it)."""
    spans = plan.spans
    raw = []
    for b, (s, e) in enumerate(spans):
        p = torch.ones(e - s, dtype=torch.float64)
        if b > 0:
            shared = spans[b - 1][1] - s
            p[:shared] *= _ramp_up(shared)
        if b + 1 < len(spans):
            shared = e - spans[b + 1][0]
            if shared > 0:
                p[e - s - shared:] *= 1.0 - _ramp_up(shared)
        raw.append(p)
    total = torch.zeros(plan.frames, dtype=torch.float64)
    for (s, e), p in zip(spans, raw):
        total[s:e] += p
    return tuple(p / total[s:e] for (s, e), p in zip(spans, raw))


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    """float 0..1 -> uint8: clamp, * 255, round half to even; NaN reads as 0."""
    return torch.nan_to_num(x, nan=0.0).clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)


class StreamBlender:
    """Blend the batches of `plan` as they arrive.

    push(frames): the next batch's output frames [n, H, W, 3] (n = its span's length), uint8 (0..255) or floating
    (0..1), on any device; returns the frames that became final, as a list of uint8 chunks [k, H, W, 3] in frame order
    on that device (the chunks together are frames [emitted before, final_before(batch)); possibly an empty list).
    uint8 frames that only this batch covers pass through unchanged (views of the pushed tensor); overlapped frames
    are blended in float32. Holds at most plan.max_overlap float32 frames between pushes."""

    def __init__(self, plan: BatchPlan):
        self.plan = plan
        self._weights = blend_weights(plan)
        self._next = 0  # index of the batch expected next
        self.emitted = 0  # frames returned so far
        self._acc: Optional[torch.Tensor] = None  # float32 [held, H, W, 3]: frames [emitted, emitted + held)
        self._shape: Optional[Tuple[int, int]] = None

    @property
    def done(self) -> bool:
        return self._next == self.plan.count

    @property
    def held(self) -> int:
        """Frames held (partially blended) now."""
        return 0 if self._acc is None else self._acc.shape[0]

    def push(self, frames: torch.Tensor) -> List[torch.Tensor]:
        if self.done:
            raise ValueError(f"all {self.plan.count} batches were already pushed")
        b = self._next
        start, stop = self.plan.spans[b]
        if (not isinstance(frames, torch.Tensor) or frames.dim() != 4 or frames.shape[-1] != 3
                or frames.shape[0] != stop - start):
            shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
            raise ValueError(f"batch {b} must be [{stop - start}, H, W, 3] frames, got {shape}")
        if frames.dtype != torch.uint8 and not frames.is_floating_point():
            raise ValueError(f"batch frames must be uint8 or floating point, got {frames.dtype}")
        if self._shape is None:
            self._shape = tuple(frames.shape[1:3])
        elif tuple(frames.shape[1:3]) != self._shape:
            raise ValueError(f"batch {b} frames are {tuple(frames.shape[1:3])}, earlier ones {self._shape}")
        self._next += 1

        final = self.plan.final_before(b)
        held = self.held
        assert start == self.emitted and start + held <= stop  # spans start in order; held frames lie in this batch
        w = self._weights[b].to(torch.float32)
        scale = 255.0 if frames.dtype == torch.uint8 else 1.0

        def weighted(lo: int, hi: int) -> torch.Tensor:  # absolute frames [lo, hi) of this batch, x weight, 0..1
            x = frames[lo - start:hi - start].to(torch.float32, copy=True).div_(scale)  # a copy: never the caller's
            return x.mul_(w[lo - start:hi - start].to(x.device).view(-1, 1, 1, 1))

        out: List[torch.Tensor] = []
        if held:
            self._acc += weighted(start, start + held)
        keep_from = max(final, start + held)  # frames at or after this, not yet held, start being held
        own = frames[held:final - start] if final > start + held else frames[:0]  # covered by this batch only
        if held:
            cut = min(held, final - start)
            if cut > 0:
                out.append(_to_uint8(self._acc[:cut]))
            self._acc = self._acc[cut:] if cut < held else None
        if own.shape[0]:
            out.append(own if own.dtype == torch.uint8 else _to_uint8(own.to(torch.float32)))
        if keep_from < stop:
            new = weighted(keep_from, stop)
            self._acc = new if self._acc is None else torch.cat((self._acc, new))
        self.emitted = final
        return out


def blend_batches(plan: BatchPlan, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """All batches' outputs (in order) -> the blended video, uint8 [frames, H, W, 3] (StreamBlender gathered)."""
    blender = StreamBlender(plan)
    chunks = [c for batch in outputs for c in blender.push(batch)]
    if not blender.done:
        raise ValueError(f"{len(outputs)} batch outputs given, the plan has {plan.count}")
    return torch.cat(chunks)
