"""Extension windows: which frames each window generates, which it re-uses as its guide, where its audio sits.

Pure integer arithmetic on H3's grids (24 fps, 17n+5 frames, 40 audio latents/s). Global frame f is frame f of the
whole result (source first); global audio latent a covers [a/40, (a+1)/40) s. A frame's audio index is
round(f * 40 / 24) = (10 f + 3) // 6 (exact; 5f/3 is never a tie), always taken on the cumulative timeline, so
per-window rounding never drifts: after any number of windows the soundtrack has exactly audio_index(total) latents.

A window of W frames starts `overlap` frames before the content so far ends. Its first `overlap` frames are the guide:
the last latents of what exists (video: latent_frames(overlap) of them; audio: the latents between the window's start
and the end of the overlap), held as reference rows; the model re-generates those frames as target rows too, and
they are discarded after sampling. Only the W - overlap new frames are appended. W and overlap are on the 17n+5 grid
so W - overlap is a multiple of 17 and the cumulative latent count stays 5n+2 (a whole number of VAE chunks).

The last window adds what is left (a multiple of 17 frames) with the full window length when the content allows: its
overlap grows instead of the window shrinking, so every window has a length the model was trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .geometry import FPS, MAX_SECONDS, RequestError, latent_frames

CLIP = 17  # frames per VAE chunk; window length and overlap are CLIP*n + KEEP
KEEP = 5
LONGEST_WINDOW = (int(MAX_SECONDS * FPS) - KEEP) // CLIP * CLIP + KEEP  # 345 frames, 14.375 s
MAX_ADDED_SECONDS = 600.0


def audio_index(frame: int) -> int:
    """Audio latent index of global frame `frame`: round(frame * 40 / 24), exact integer arithmetic."""
    return (10 * int(frame) + 3) // 6


def on_grid(frames: int) -> bool:
    return frames >= KEEP and (frames - KEEP) % CLIP == 0


def grid_floor(frames: int) -> int:
    """Largest 17n+5 <= frames (0 below 5)."""
    return (frames - KEEP) // CLIP * CLIP + KEEP if frames >= KEEP else 0


def added_frames_for(seconds: float) -> int:
    """Seconds to add -> frames, rounded UP to a whole number of 17-frame chunks (what windows can append)."""
    if not 0 < seconds <= MAX_ADDED_SECONDS:
        raise RequestError(f"Seconds to add must be in (0, {MAX_ADDED_SECONDS:g}], got {seconds:g}.")
    return math.ceil(round(seconds * FPS) / CLIP) * CLIP


def frames_to_add(windows: int | None, seconds: float | None, window_frames: int, overlap_frames: int) -> int:
    """What an extension appends: `windows` full windows (each adds window_frames - overlap_frames; None or 0: use
    seconds), else `seconds` rounded up to whole chunks. The one formula for H3 Extend and the CLI."""
    if windows:
        check_window_settings(window_frames, overlap_frames)
        return int(windows) * (window_frames - overlap_frames)
    return added_frames_for(seconds)


@dataclass(frozen=True)
class Window:
    index: int
    start_frame: int  # global frame of the window's first frame
    num_frames: int  # 17n+5
    overlap_frames: int  # 17j+5: the guide, re-generated and discarded

    @property
    def end_frame(self) -> int:
        return self.start_frame + self.num_frames

    @property
    def new_frames(self) -> int:
        return self.num_frames - self.overlap_frames

    @property
    def latent_frames(self) -> int:
        return latent_frames(self.num_frames)

    @property
    def guide_latent_frames(self) -> int:
        return latent_frames(self.overlap_frames)

    @property
    def audio_start(self) -> int:  # global audio index of the window's first audio latent
        return audio_index(self.start_frame)

    @property
    def audio_guide_end(self) -> int:
        return audio_index(self.start_frame + self.overlap_frames)

    @property
    def audio_end(self) -> int:
        return audio_index(self.end_frame)

    @property
    def audio_latents(self) -> int:
        return self.audio_end - self.audio_start

    @property
    def guide_audio_latents(self) -> int:
        return self.audio_guide_end - self.audio_start


def check_window_settings(window_frames: int, overlap_frames: int) -> None:
    if not on_grid(window_frames) or window_frames > LONGEST_WINDOW:
        raise RequestError(f"Window length must be 17n+5 frames up to {LONGEST_WINDOW} (14.375 s), got "
                           f"{window_frames}.")
    if not on_grid(overlap_frames):
        raise RequestError(f"Overlap must be 17n+5 frames (5, 22, 39, ...), got {overlap_frames}.")
    if overlap_frames + CLIP > window_frames:
        raise RequestError(f"Overlap ({overlap_frames} frames) must leave at least {CLIP} new frames in a "
                           f"{window_frames}-frame window.")


def plan_windows(source_frames: int, added_frames: int, window_frames: int, overlap_frames: int) -> list[Window]:
    """Windows that append exactly `added_frames` (a multiple of 17) after a `source_frames` (17n+5) source."""
    check_window_settings(window_frames, overlap_frames)
    if not on_grid(source_frames):
        raise RequestError(f"The source must be 17n+5 frames on H3's grid, got {source_frames}.")
    if source_frames < overlap_frames:
        raise RequestError(f"The source ({source_frames} frames) is shorter than the overlap ({overlap_frames} "
                           "frames): use a smaller overlap or a longer source.")
    if added_frames <= 0 or added_frames % CLIP:
        raise RequestError(f"Frames to add must be a positive multiple of {CLIP}, got {added_frames}.")
    windows, content, left = [], source_frames, added_frames
    step = window_frames - overlap_frames
    while left:
        if left >= step:
            overlap, length = overlap_frames, window_frames
        else:  # the last, shorter addition: keep the window long, widen its guide (both stay on the grid)
            overlap = min(window_frames - left, content)
            length = overlap + left
        windows.append(Window(len(windows), content - overlap, length, overlap))
        content += length - overlap
        left -= length - overlap
    return windows
