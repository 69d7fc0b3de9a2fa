"""SeedVR2 window-attention geometry, equal to the official ``models/dit*/window.py`` + ``na.window_idx``.

Both released DiTs (3B and 7B) use the same setting in every layer: window *counts* (4, 3, 3) for (t, h, w)
measured at a 720p token area, even layers the regular scheme, odd layers the shifted one. The geometry depends
only on the patched latent token grid (T, H, W) of one sample.

Contracts (stated once here):
- A window is ``((t0, t1), (h0, h1), (w0, w1))``, half-open, never empty on any axis.
- Window order: w index outermost, then h, then t innermost (the official enumeration order).
- Tokens inside a window are in row-major (t, h, w) order of its sub-block.
- Canonical token id of (t, h, w) is ``(t * H + h) * W + w`` (row-major over the whole grid).
- ``perm`` (int64, length T*H*W): ``windowed = canonical[perm]``; ``inverse``: ``canonical = windowed[inverse]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

import torch

Span = Tuple[int, int]
Window = Tuple[Span, Span, Span]
Grid = Tuple[int, int, int]

REGULAR = "720pwin_by_size_bysize"
SHIFTED = "720pswin_by_size_bysize"
# Window counts (t, h, w) at the 720p reference area (45 x 80 tokens); identical for the 3B and 7B, every layer.
WINDOW_COUNTS: Tuple[int, int, int] = (4, 3, 3)
_REF_AREA = 45 * 80
_MAX_WINDOW_T = 30  # the temporal window size stops growing past 30 latent frames


def layer_window_methods(num_layers: int) -> List[str]:
    """Window scheme per layer: regular on even layers, shifted on odd ones (both models)."""
    return [REGULAR if i % 2 == 0 else SHIFTED for i in range(num_layers)]


def _check_grid(grid: Sequence[int]) -> Grid:
    t, h, w = (int(x) for x in grid)
    if min(t, h, w) < 1:
        raise ValueError(f"SeedVR2 token grid {tuple(grid)} must be at least 1 on every axis (t, h, w)")
    return t, h, w


def window_size(grid: Sequence[int], counts: Sequence[int] = WINDOW_COUNTS) -> Tuple[int, int, int]:
    """Window size in tokens (wt, wh, ww): the grid is rescaled to the 720p token area keeping its aspect ratio,
    split into ``counts`` windows there (ceil), and that size is used at the real resolution. Rounding is Python's
    round (half to even) on the float64 rescaled sides, as in the official code."""
    t, h, w = _check_grid(grid)
    nt, nh, nw = (int(c) for c in counts)
    scale = math.sqrt(_REF_AREA / (h * w))
    rh, rw = round(h * scale), round(w * scale)
    if rh < 1 or rw < 1:
        raise ValueError(f"SeedVR2 token grid {(t, h, w)} is too elongated for window attention (a side rescales to 0)")
    return math.ceil(min(t, _MAX_WINDOW_T) / nt), math.ceil(rh / nh), math.ceil(rw / nw)


def _regular_spans(extent: int, size: int) -> List[Span]:
    # Cuts at multiples of size; the last window is cropped to the extent, so none is empty.
    return [(i * size, min((i + 1) * size, extent)) for i in range(-(-extent // size))]


def _shifted_spans(extent: int, size: int) -> List[Span]:
    if size >= extent:
        return [(0, extent)]
    # Cuts moved by half a window: window i covers [floor((i - 1/2) size), floor((i + 1/2) size)) clipped to
    # [0, extent); count = ceil((extent - 1/2) / size) + 1. Integer form of the official float expression (all
    # bounds are non-negative after clipping, so its truncation toward zero is a floor). Empty spans (size 1 gives
    # an empty first window; the last may start at the extent) are dropped.
    count = -(-(2 * extent - 1) // (2 * size)) + 1
    spans = [(max(((2 * i - 1) * size) // 2, 0), min(((2 * i + 1) * size) // 2, extent)) for i in range(count)]
    return [s for s in spans if s[1] > s[0]]


def _combine(ts: List[Span], hs: List[Span], ws: List[Span]) -> List[Window]:
    return [(st, sh, sw) for sw in ws for sh in hs for st in ts]


def regular_windows(grid: Sequence[int], counts: Sequence[int] = WINDOW_COUNTS) -> List[Window]:
    """Regular windows of ``grid`` in the official order (see the module contract)."""
    t, h, w = _check_grid(grid)
    wt, wh, ww = window_size(grid, counts)
    return _combine(_regular_spans(t, wt), _regular_spans(h, wh), _regular_spans(w, ww))


def shifted_windows(grid: Sequence[int], counts: Sequence[int] = WINDOW_COUNTS) -> List[Window]:
    """Shifted (half-window offset) windows of ``grid``, cropped at the edges, empty ones dropped, official order."""
    t, h, w = _check_grid(grid)
    wt, wh, ww = window_size(grid, counts)
    return _combine(_shifted_spans(t, wt), _shifted_spans(h, wh), _shifted_spans(w, ww))


def windows_for(method: str, grid: Sequence[int], counts: Sequence[int] = WINDOW_COUNTS) -> List[Window]:
    if method == REGULAR:
        return regular_windows(grid, counts)
    if method == SHIFTED:
        return shifted_windows(grid, counts)
    raise ValueError(f"unknown SeedVR2 window method {method!r}; expected {REGULAR!r} or {SHIFTED!r}")


def window_shape(window: Window) -> Tuple[int, int, int]:
    return tuple(b - a for a, b in window)  # type: ignore[return-value]


def window_permutation(grid: Sequence[int], windows: Sequence[Window]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(perm, inverse), int64 on CPU: ``windowed = canonical[perm]`` and ``canonical = windowed[inverse]``."""
    t, h, w = _check_grid(grid)
    ids = torch.arange(t * h * w, dtype=torch.int64).view(t, h, w)
    parts = [ids[t0:t1, h0:h1, w0:w1].reshape(-1) for (t0, t1), (h0, h1), (w0, w1) in windows]
    perm = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
    if perm.numel() != t * h * w:
        raise ValueError(f"windows cover {perm.numel()} tokens of the {t * h * w} in grid {(t, h, w)}")
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), dtype=torch.int64)
    return perm, inverse


@dataclass(frozen=True)
class ShapeGroup:
    """Windows of one shape (nt, nh, nw): ``windows`` are indices into the layout's window list (ascending);
    ``rows`` [G, nt*nh*nw] int64 are the positions of their tokens in the window-ordered sequence."""

    shape: Tuple[int, int, int]
    windows: Tuple[int, ...]
    rows: torch.Tensor


def group_by_shape(windows: Sequence[Window]) -> List[ShapeGroup]:
    """Windows grouped by equal shape, groups in order of first appearance; every window in exactly one group."""
    starts: List[int] = []
    pos = 0
    for win in windows:
        starts.append(pos)
        pos += math.prod(window_shape(win))
    members: Dict[Tuple[int, int, int], List[int]] = {}
    for i, win in enumerate(windows):
        members.setdefault(window_shape(win), []).append(i)
    groups = []
    for shape, idx in members.items():
        n = math.prod(shape)
        rows = torch.tensor([starts[i] for i in idx], dtype=torch.int64)[:, None] + torch.arange(n, dtype=torch.int64)
        groups.append(ShapeGroup(shape=shape, windows=tuple(idx), rows=rows))
    return groups


@dataclass(frozen=True)
class WindowLayout:
    """Everything attention needs for one (method, grid): windows, token counts, permutation, shape groups.
    Cached and shared: treat the tensors as read-only."""

    method: str
    grid: Grid
    windows: Tuple[Window, ...]
    lengths: Tuple[int, ...]
    perm: torch.Tensor
    inverse: torch.Tensor
    groups: Tuple[ShapeGroup, ...]


@lru_cache(maxsize=64)
def _layout(method: str, grid: Grid, counts: Tuple[int, int, int]) -> WindowLayout:
    wins = windows_for(method, grid, counts)
    perm, inverse = window_permutation(grid, wins)
    return WindowLayout(
        method=method,
        grid=grid,
        windows=tuple(wins),
        lengths=tuple(math.prod(window_shape(w)) for w in wins),
        perm=perm,
        inverse=inverse,
        groups=tuple(group_by_shape(wins)),
    )


def window_layout(method: str, grid: Sequence[int], counts: Sequence[int] = WINDOW_COUNTS) -> WindowLayout:
    return _layout(method, _check_grid(grid), tuple(int(c) for c in counts))  # type: ignore[arg-type]
