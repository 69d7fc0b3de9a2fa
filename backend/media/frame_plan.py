"""FramePlan: which source frame fills each output frame of a video decode, known before decoding (decode.py makes
it; the audio decode cuts its section from it). Its own module so both decoders import it without a circle."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from .resize import ResizePlan


@dataclass
class FramePlan:
    """What `decode_planned_frames` will produce, known before decoding.

    sources[k] = index (in presentation order) of the source frame shown as output frame k; pts_index maps a source
    frame's pts to that index. start_time: the stream-timeline second of output frame 0 (audio is cut from there);
    duration: seconds the output covers (frame_count * select_every_nth / grid rate)."""

    sources: list[int]
    pts_index: dict[int, int]
    frame_rate: Fraction
    grid_rate: Fraction
    source_frame_rate: Fraction
    width: int  # output size (after rotation and resize)
    height: int
    coded_width: int  # the stream's own size (frames are scaled to it before rotation)
    coded_height: int
    rotation: int  # counter-clockwise quarter turns applied to each frame (0..3)
    resize: ResizePlan | None
    start_time: float
    duration: float
    select_every_nth: int = 1
    selecting: bool = False
    trims_time: bool = False  # skip_first_frames, frame_load_cap or max_seconds took a section (not only a rate)
    metadata: dict = field(default_factory=dict)
    has_audio: bool = False

    @property
    def frame_count(self) -> int:
        return len(self.sources)
