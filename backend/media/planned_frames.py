"""`PlannedFrames`: a clip's frames read from its file as they are needed, for work that walks a long clip in order
(SeedVR2's batches) without holding it whole in host memory.

It stands where a uint8 frame tensor `[T, H, W, 3]` would: `shape`, `dtype`, `len()` and slicing by a frame range
(`frames[a:b]` -> a uint8 tensor). Ranges asked in order (each start at or after the last one's, overlapping allowed)
decode the file once: a window of the frames still needed is kept, the rest dropped, so host memory holds one range
plus a decode chunk. A range before the window decodes again from the start (correct, slower; Stop and retries
only). `chunks()` walks the clip once from the start for a pass over every frame (scene cuts). It pickles as the
path and the plan (no decoder): each process that reads opens the file itself, so it is for workers on this machine.
"""

from __future__ import annotations

import os
from typing import Iterator

import torch

from .decode import iter_planned_frames
from .frame_plan import FramePlan

CHUNK_FRAMES = 16


class PlannedFrames:
    dtype = torch.uint8

    def __init__(self, path: str | os.PathLike, plan: FramePlan):
        self.path = os.path.abspath(os.fspath(path))
        self.plan = plan
        self.shape = torch.Size((plan.frame_count, plan.height, plan.width, 3))
        self._reset()

    def _reset(self) -> None:
        self._reader: Iterator[torch.Tensor] | None = None
        self._window = torch.empty((0, *self.shape[1:]), dtype=torch.uint8)
        self._window_start = 0  # the frame index of self._window[0]

    def __getstate__(self):
        return {"path": self.path, "plan": self.plan}

    def __setstate__(self, state):
        self.__init__(state["path"], state["plan"])

    def __len__(self) -> int:
        return self.shape[0]

    def dim(self) -> int:
        return 4

    def chunks(self, size: int = CHUNK_FRAMES) -> Iterator[torch.Tensor]:
        """Every frame in order, as uint8 chunks of at most `size` frames (a pass of its own over the file)."""
        yield from iter_planned_frames(self.path, self.plan, size)

    def __getitem__(self, key) -> torch.Tensor:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("PlannedFrames reads contiguous frame ranges: frames[start:stop]")
        start, stop, _ = key.indices(len(self))
        if stop <= start:
            return self._window[:0].clone()
        if start < self._window_start:
            self._reset()  # an earlier range: decode again from the start
        if self._reader is None:
            self._reader = iter(self.chunks())
        window_stop = self._window_start + self._window.shape[0]
        drop = min(max(0, start - self._window_start), self._window.shape[0])
        parts = [self._window[drop:]]
        self._window_start += drop
        while window_stop < stop:
            chunk = next(self._reader, None)
            if chunk is None:
                raise ValueError(f"{self.path}: {window_stop} frames decoded, {stop} planned")
            parts.append(chunk)
            window_stop += chunk.shape[0]
        self._window = torch.cat(parts) if len(parts) > 1 else parts[0]
        return self._window[start - self._window_start:stop - self._window_start]
