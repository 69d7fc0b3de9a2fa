"""Whether a request's packed sequence fits the device before any step runs, and if not, what would.

A DiT forward needs its activations beside the weights (offload.dit_activation_bytes: per row this rank computes,
per row of the rest of the sequence, a reserve). A request larger than the memory left fails in its first step
after the encodes, with an out-of-memory error that names nothing; this check refuses it first, naming the largest
canvas at the same aspect (this length) and the longest length (this canvas) that fit.
"""

from __future__ import annotations

from .geometry import MIN_SECONDS, Geometry, RequestError, audio_latents, frames_for_seconds
from .offload import DIT_BYTES_PER_OTHER_ROW, DIT_BYTES_PER_ROW, DIT_RESERVE, GIB, dit_activation_bytes

MIN_SIDE = 256  # the smallest canvas side worth suggesting


def activation_bytes(total_rows: int, degree: int) -> int:
    """One rank's activation estimate when `degree` ranks share `total_rows` rows (Ulysses: equal shards)."""
    local = -(-total_rows // max(degree, 1))
    return dit_activation_bytes(local, total_rows)


def _rows_at(geo: Geometry, other_rows: int, latent_frames: int, lh: int, lw: int, patch) -> int:
    """The packed rows of the same request at another latent size: its video rows + the rows that do not scale
    (text, conditions) + two audio channels over its length."""
    _, ph, pw = patch
    frames = (latent_frames - 2) // 5 * 17 + 5
    return latent_frames * (lh // ph) * (lw // pw) + other_rows + 2 * audio_latents(frames)


def suggestion(geo: Geometry, total_rows: int, video_rows: int, audio_rows: int, available: int, degree: int,
               patch=(1, 2, 2), spatial_ratio: int = 16, multiple: int = 32) -> str:
    """What fits `available` bytes: the largest canvas at this aspect and length, the longest length at this canvas
    (either may be none)."""
    other = total_rows - video_rows - audio_rows
    aspect = geo.width / geo.height
    canvas = None
    for height in range(geo.height - multiple, MIN_SIDE - 1, -multiple):
        width = max(multiple, round(height * aspect / multiple) * multiple)
        rows = _rows_at(geo, other, geo.latent_frames, height // spatial_ratio, width // spatial_ratio, patch)
        if activation_bytes(rows, degree) <= available:
            canvas = f"{width}x{height} at this length"
            break
    length = None
    shortest = frames_for_seconds(MIN_SECONDS)
    for latent_frames in range(geo.latent_frames - 5, 1, -5):
        if (latent_frames - 2) // 5 * 17 + 5 < shortest:
            break
        rows = _rows_at(geo, other, latent_frames, geo.latent_height, geo.latent_width, patch)
        if activation_bytes(rows, degree) <= available:
            length = f"{(latent_frames - 2) // 5 * 17 + 5} frames at this size"
            break
    fits = [t for t in (canvas, length) if t]
    return ("Fits: " + "; or ".join(fits) + ".") if fits else "Nothing smaller of this shape fits either."


def check_rows_fit(geo: Geometry, total_rows: int, video_rows: int, audio_rows: int, available: int | None,
                   degree: int = 1, patch=(1, 2, 2), spatial_ratio: int = 16, where: str = "the GPU") -> None:
    """RequestError when one rank's activations for `total_rows` exceed `available` bytes (None: unknown, e.g. the
    CPU: no check). `video_rows` / `audio_rows`: the target's, which scale with the canvas and the length."""
    if available is None:
        return
    need = activation_bytes(total_rows, degree)
    if need <= available:
        return
    ranks = f" on each of {degree} GPUs" if degree > 1 else ""
    raise RequestError(
        f"{geo.width}x{geo.height}, {geo.num_frames} frames packs {total_rows} rows: one denoise step needs about "
        f"{need / GIB:.1f} GiB{ranks} beside the weights, and {available / GIB:.1f} GiB are free on {where}. "
        f"{suggestion(geo, total_rows, video_rows, audio_rows, available, degree, patch, spatial_ratio)} "
        "(More GPUs (sequence parallel) or the offload placement also make room.)")


def check_layout_fits(geo: Geometry, layout, available: int | None, degree: int = 1, patch=(1, 2, 2),
                      spatial_ratio: int = 16, where: str = "the GPU") -> None:
    """check_rows_fit for a request's packed layout (layout.PackedLayout): its target rows are the ones after the
    condition rows."""
    check_rows_fit(geo, layout.seq_len, int(layout.video_indices.numel()) - layout.num_condition_video_rows,
                   int(layout.audio_indices.numel()) - layout.num_condition_audio_rows, available, degree, patch,
                   spatial_ratio, where)


__all__ = ["check_rows_fit", "check_layout_fits", "activation_bytes", "suggestion", "DIT_BYTES_PER_ROW", "DIT_BYTES_PER_OTHER_ROW",
           "DIT_RESERVE"]
