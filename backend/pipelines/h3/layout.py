"""The packed sequence MiniMax-H3 denoises: row order, modality tags and the fp64 rotary grid.

Row order (built once per request, host-side):
  t2va / fl2va: [text | keyframe condition rows | target audio (ch0 rows, ch1 rows) | target video]
  ref2va:       [text | reference blocks in request order | target audio | target video]
     image ref: its video rows;  audio ref: its audio rows (channel-major);  video ref: its audio rows, then video rows
Video rows are patchified latents, frame-major then row-major (patchify below). `video_indices` lists condition rows
first, then target rows; `audio_indices` likewise. position_ids [S, 3] float64 (t, h, w):
  text row i: (i, 0, 0).  Media time starts at num_text and advances 5/3*(1,4,4,4,4) per latent frame (40/24 audio
  units per video frame); audio rows one unit per latent (40 Hz), no h, w pinned to the width grid's two extremes.
  Spatial grid: aspect-normalised, centred, scaled by 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .geometry import AUDIO_CHANNELS, AUDIO_TAG, VIDEO_TAG, Geometry

FRAME_RESCALE = 5.0 / 3.0
FRAMES_PER_LATENT = (1, 4, 4, 4, 4)
SPATIAL_SCALE = 32
CONDITION_T = 0.999  # visual condition rows are held just short of clean


@dataclass
class PackedLayout:
    position_ids: torch.Tensor  # [S, 3] float64
    token_tags: torch.Tensor  # [S] long: 0 video, 1 text, 2 audio
    video_indices: torch.Tensor  # [Nv] long: condition rows first, then target rows
    audio_indices: torch.Tensor  # [Na] long: reference rows first, then target rows (ch0 then ch1)
    text_indices: torch.Tensor  # [Nt] long
    num_condition_video_rows: int
    num_condition_audio_rows: int

    @property
    def seq_len(self) -> int:
        return int(self.position_ids.shape[0])

    def to(self, device) -> "PackedLayout":
        return PackedLayout(*(t.to(device) for t in (self.position_ids, self.token_tags, self.video_indices,
                                                        self.audio_indices, self.text_indices)),
                            self.num_condition_video_rows, self.num_condition_audio_rows)


@dataclass(frozen=True)
class ReferenceBlock:
    """Geometry of one encoded reference, in request order. kind: image | video | audio.
    latent_shape (frames, h, w) for image/video; audio_latents per channel for audio and for a video's soundtrack."""

    kind: str
    latent_shape: tuple[int, int, int] | None = None
    audio_latents: int = 0


def held_at_condition(clean: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Visual condition latents (or their rows) mixed once with their noise to t = 0.999, where they stay."""
    t = torch.tensor(CONDITION_T, dtype=torch.float32)
    return t * clean + (1.0 - t) * noise


def patchify(latents: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """[1, C, T, H, W] -> [T/pt * H/ph * W/pw, C*pt*ph*pw] rows, frame-major then row-major."""
    pt, ph, pw = patch
    b, c, t, h, w = latents.shape
    if t % pt or h % ph or w % pw:
        raise ValueError(f"Latents {tuple(latents.shape)} are not divisible by the patch {patch}.")
    x = latents.reshape(b, c, t // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(-1, c * pt * ph * pw).contiguous()


def unpatchify(rows: torch.Tensor, channels: int, frames: int, height: int, width: int,
               patch: tuple[int, int, int]) -> torch.Tensor:
    """Inverse of patchify: rows -> [1, C, T, H, W]."""
    pt, ph, pw = patch
    x = rows.reshape(1, frames // pt, height // ph, width // pw, channels, pt, ph, pw)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(1, channels, frames, height, width).contiguous()


def audio_rows_to_latents(rows: torch.Tensor, num_latents: int) -> torch.Tensor:
    """Channel-major rows [2*Ta, 32] -> [2, 32, Ta] (the mono audio VAE takes channels as the batch)."""
    return rows.reshape(AUDIO_CHANNELS, num_latents, rows.shape[-1]).permute(0, 2, 1).contiguous()


def audio_latents_to_rows(latents: torch.Tensor) -> torch.Tensor:
    """[2, 32, Ta] -> channel-major rows [2*Ta, 32]."""
    return latents.permute(0, 2, 1).reshape(-1, latents.shape[1]).contiguous()


def _spatial_grid(dim: int, patch: int, sqrt_area: float) -> torch.Tensor:
    ratio = dim / sqrt_area
    left = (1.0 - ratio) / 2.0
    # numpy's endpoint=False linspace (start + i*step) is the released arithmetic; keep it for exact coordinates.
    return torch.from_numpy(np.linspace(left, left + ratio, dim // patch, endpoint=False) * SPATIAL_SCALE)


def frame_grid(latent_h: int, latent_w: int, patch_h: int, patch_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ([rows_per_frame, 2] (h, w) coordinates, the width grid)."""
    sqrt_area = float(np.sqrt(latent_h * latent_w))
    hg, wg = _spatial_grid(latent_h, patch_h, sqrt_area), _spatial_grid(latent_w, patch_w, sqrt_area)
    mh, mw = torch.meshgrid(hg, wg, indexing="ij")
    return torch.stack([mh.reshape(-1), mw.reshape(-1)], dim=-1), wg


def frame_times(num_latent_frames: int, origin: float) -> torch.Tensor:
    """Rotary time of each latent frame: origin, then cumulative 5/3*(1,4,4,4,4) spans (float64 cumsum)."""
    spans = torch.tensor([FRAME_RESCALE * FRAMES_PER_LATENT[i % 5] for i in range(num_latent_frames)],
                         dtype=torch.float64)
    return origin + torch.cat([torch.zeros(1, dtype=torch.float64), spans[:-1].cumsum(0)])


def _last_keyframe_time(num_latent_frames: int) -> float:
    # numpy's pairwise sum over the spans: the released code sums this anchor that way (differs from a sequential
    # sum in the last ulp from 16 latent frames on), so the same summation order is kept here.
    spans = np.full(num_latent_frames, FRAME_RESCALE, dtype=np.float64)
    for offset in range(5):
        spans[offset::5] *= FRAMES_PER_LATENT[offset]
    return float(spans.sum()) - FRAME_RESCALE


def _fill_audio(pos: torch.Tensor, start: int, num_latents: int, time0: float, width_grid: torch.Tensor) -> None:
    rows = slice(start, start + num_latents * AUDIO_CHANNELS)
    pos[rows, 0] = (time0 + torch.arange(num_latents, dtype=torch.float64)).repeat(AUDIO_CHANNELS)
    pos[rows, 2] = torch.cat([torch.full((num_latents,), float(width_grid[0]), dtype=torch.float64),
                              torch.full((num_latents,), float(width_grid[-1]), dtype=torch.float64)])


def _fill_video(pos: torch.Tensor, start: int, frames: int, grid: torch.Tensor, time0: float) -> int:
    n = frames * grid.shape[0]
    pos[start:start + n, 0] = frame_times(frames, time0).repeat_interleave(grid.shape[0])
    pos[start:start + n, 1:] = grid.repeat(frames, 1)
    return n


def _finish(pos, text_tags, video_idx, audio_idx, n_cond_video, n_cond_audio) -> PackedLayout:
    n_text = text_tags.shape[0]
    tags = torch.empty(pos.shape[0], dtype=torch.long)
    text_indices = torch.arange(n_text)
    tags[text_indices] = text_tags.to(torch.long)
    tags[audio_idx] = AUDIO_TAG
    tags[video_idx] = VIDEO_TAG
    return PackedLayout(pos, tags, video_idx, audio_idx, text_indices, n_cond_video, n_cond_audio)


def build_layout(text_tags: torch.Tensor, geo: Geometry, patch: tuple[int, int, int],
                 keyframe_anchors: tuple[str, ...] = ()) -> PackedLayout:
    """t2va (no anchors) and fl2va ('first' and/or 'last' keyframes, in that packed order)."""
    _, ph, pw = patch
    n_text = int(text_tags.shape[0])
    grid, width_grid = frame_grid(geo.latent_height, geo.latent_width, ph, pw)
    rows_per_frame = grid.shape[0]
    n_cond = len(keyframe_anchors) * rows_per_frame
    n_audio = geo.audio_latents * AUDIO_CHANNELS
    audio_start = n_text + n_cond
    video_start = audio_start + n_audio
    seq = video_start + geo.latent_frames * rows_per_frame
    pos = torch.zeros(seq, 3, dtype=torch.float64)
    pos[:n_text, 0] = torch.arange(n_text, dtype=torch.float64)
    for i, anchor in enumerate(keyframe_anchors):
        if anchor == "first":
            t = float(n_text)
        elif anchor == "last":
            t = float(n_text) + _last_keyframe_time(geo.latent_frames)
        else:
            raise ValueError(f"Keyframe anchor must be 'first' or 'last', got {anchor!r}.")
        rows = slice(n_text + i * rows_per_frame, n_text + (i + 1) * rows_per_frame)
        pos[rows, 0] = t
        pos[rows, 1:] = grid
    _fill_audio(pos, audio_start, geo.audio_latents, float(n_text), width_grid)
    _fill_video(pos, video_start, geo.latent_frames, grid, float(n_text))
    video_idx = torch.cat([torch.arange(n_text, audio_start), torch.arange(video_start, seq)])
    audio_idx = torch.arange(audio_start, video_start)
    return _finish(pos, text_tags, video_idx, audio_idx, n_cond, 0)


def build_reference_layout(text_tags: torch.Tensor, geo: Geometry, patch: tuple[int, int, int],
                           blocks: list[ReferenceBlock]) -> PackedLayout:
    """ref2va: one block per reference in request order; each advances the shared audio/video rotary clock."""
    _, ph, pw = patch
    n_text = int(text_tags.shape[0])

    def video_rows(shape):
        return shape[0] * (shape[1] // ph) * (shape[2] // pw)

    n_ref_video = sum(video_rows(b.latent_shape) for b in blocks if b.kind in ("image", "video"))
    n_ref_audio = sum(b.audio_latents * AUDIO_CHANNELS for b in blocks)
    target_grid, target_wg = frame_grid(geo.latent_height, geo.latent_width, ph, pw)
    n_audio = geo.audio_latents * AUDIO_CHANNELS
    seq = n_text + n_ref_video + n_ref_audio + n_audio + geo.latent_frames * target_grid.shape[0]
    pos = torch.zeros(seq, 3, dtype=torch.float64)
    pos[:n_text, 0] = torch.arange(n_text, dtype=torch.float64)
    video_idx, audio_idx = [], []
    cursor, clock = n_text, float(n_text)
    for block in blocks:
        if block.kind == "image":
            frames, h, w = block.latent_shape
            grid, _ = frame_grid(h, w, ph, pw)
            n = video_rows(block.latent_shape)
            pos[cursor:cursor + n, 0] = clock
            pos[cursor:cursor + n, 1:] = grid.repeat(frames, 1)
            video_idx.append(torch.arange(cursor, cursor + n))
            cursor += n
            clock += 1.0  # an image takes one integer rotary slot
        elif block.kind == "audio":
            n = block.audio_latents * AUDIO_CHANNELS
            _fill_audio(pos, cursor, block.audio_latents, clock, target_wg)
            audio_idx.append(torch.arange(cursor, cursor + n))
            cursor += n
            clock += float(block.audio_latents)
        elif block.kind == "video":
            frames, h, w = block.latent_shape
            grid, wg = frame_grid(h, w, ph, pw)
            n_a = block.audio_latents * AUDIO_CHANNELS
            if n_a:
                _fill_audio(pos, cursor, block.audio_latents, clock, wg)
                audio_idx.append(torch.arange(cursor, cursor + n_a))
            cursor += n_a
            n_v = _fill_video(pos, cursor, frames, grid, clock)
            video_idx.append(torch.arange(cursor, cursor + n_v))
            cursor += n_v
            # Sequential float64 sum here (the released code sums this span sequentially, the fl2va anchor pairwise).
            span = sum(FRAME_RESCALE * FRAMES_PER_LATENT[i % 5] for i in range(frames))
            clock += max(float(block.audio_latents), span)
        else:
            raise ValueError(f"Reference kind must be image, video or audio, got {block.kind!r}.")
    audio_start, video_start = cursor, cursor + n_audio
    _fill_audio(pos, audio_start, geo.audio_latents, clock, target_wg)
    _fill_video(pos, video_start, geo.latent_frames, target_grid, clock)
    video_all = torch.cat(video_idx + [torch.arange(video_start, seq)])
    audio_all = torch.cat(audio_idx + [torch.arange(audio_start, video_start)])
    return _finish(pos, text_tags, video_all, audio_all, n_ref_video, n_ref_audio)
