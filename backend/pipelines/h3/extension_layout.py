"""The packed sequence of one extension window.

Row order (built once per window, host-side):
  [text | guide audio (ch0 rows, ch1 rows) | guide video | target audio (ch0, ch1) | target video]
Guide rows are the reference block: the last latents of the content so far, held (video at t = max(t, 0.999), audio
clean at t = 1) and never updated; `num_condition_*_rows` count them and `video_indices` / `audio_indices` list them
first, so the one denoise driver (denoise.py, on the clocks: step_plan.StepPlan.on_clocks) runs a window as is.
With a locked soundtrack the whole window's audio is guide (clean driving latents) and there is no target audio.

Rotary time is the global timeline: video latent j of the window sits at num_text + 5 * (start + first_frame(j)) / 3
(start = the window's first global frame, first_frame(j) the first pixel frame latent j covers: 0, 1, 5, 9, 13, 17,
...), audio latent with global index a at num_text + a. A guide row has the position of the target row it guides, so
the guide shares the window's clock, and a frame has the same time in every window that contains it (bit for bit:
both are computed from the same integers). At start 0 this is the t2va grid (which sums 5/3 spans instead; the two
agree to the last ulp or two). Text rows are (i, 0, 0) as always; the spatial grid is t2va's.
"""

from __future__ import annotations

import torch

from .geometry import AUDIO_CHANNELS
from .layout import FRAMES_PER_LATENT, PackedLayout, _finish, frame_grid
from .extension_plan import Window


def latent_first_frames(num_latents: int) -> list[int]:
    """First pixel frame (within a clip) of each latent: the cumulative (1, 4, 4, 4, 4) frame spans."""
    firsts, frame = [], 0
    for j in range(num_latents):
        firsts.append(frame)
        frame += FRAMES_PER_LATENT[j % len(FRAMES_PER_LATENT)]
    return firsts


def video_times(start_frame: int, num_latents: int, num_text: int) -> torch.Tensor:
    """[num_latents] float64 rotary times of a window's latent frames on the global timeline."""
    frames = torch.tensor([start_frame + f for f in latent_first_frames(num_latents)], dtype=torch.float64)
    return float(num_text) + frames * 5.0 / 3.0


def build_window_layout(text_tags: torch.Tensor, window: Window, latent_h: int, latent_w: int,
                        patch: tuple[int, int, int], lock_audio: bool = False) -> PackedLayout:
    _, ph, pw = patch
    n_text = int(text_tags.shape[0])
    grid, width_grid = frame_grid(latent_h, latent_w, ph, pw)
    per_frame = grid.shape[0]
    n_guide_video = window.guide_latent_frames * per_frame
    n_video = window.latent_frames * per_frame
    if lock_audio:
        guide_audio, target_audio = window.audio_latents, 0
    else:
        guide_audio, target_audio = window.guide_audio_latents, window.audio_latents
    n_guide_audio, n_audio = guide_audio * AUDIO_CHANNELS, target_audio * AUDIO_CHANNELS
    starts = {}
    cursor = n_text
    for name, count in (("guide_audio", n_guide_audio), ("guide_video", n_guide_video), ("audio", n_audio),
                        ("video", n_video)):
        starts[name] = cursor
        cursor += count
    pos = torch.zeros(cursor, 3, dtype=torch.float64)
    pos[:n_text, 0] = torch.arange(n_text, dtype=torch.float64)

    times = video_times(window.start_frame, window.latent_frames, n_text)
    for name, frames in (("guide_video", window.guide_latent_frames), ("video", window.latent_frames)):
        rows = slice(starts[name], starts[name] + frames * per_frame)
        pos[rows, 0] = times[:frames].repeat_interleave(per_frame)
        pos[rows, 1:] = grid.repeat(frames, 1)

    for name, count in (("guide_audio", guide_audio), ("audio", target_audio)):
        rows = slice(starts[name], starts[name] + count * AUDIO_CHANNELS)
        global_index = torch.arange(window.audio_start, window.audio_start + count, dtype=torch.float64)
        pos[rows, 0] = (float(n_text) + global_index).repeat(AUDIO_CHANNELS)
        pos[rows, 2] = torch.cat([torch.full((count,), float(width_grid[0]), dtype=torch.float64),
                                  torch.full((count,), float(width_grid[-1]), dtype=torch.float64)])

    video_idx = torch.cat([torch.arange(starts["guide_video"], starts["guide_video"] + n_guide_video),
                           torch.arange(starts["video"], starts["video"] + n_video)])
    audio_idx = torch.cat([torch.arange(starts["guide_audio"], starts["guide_audio"] + n_guide_audio),
                           torch.arange(starts["audio"], starts["audio"] + n_audio)])
    return _finish(pos, text_tags, video_idx, audio_idx, n_guide_video, n_guide_audio)
