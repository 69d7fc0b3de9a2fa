"""How the SeedVR2 DiT's video rows are placed between layers: the window routing protocol and its one-rank form.

The DiT never indexes windows itself. Per layer it asks the routing for the rows this rank holds (``rows(layer)``),
runs every per-token op on them in their local order (order does not matter there), attends per shape group with
the group indices of ``LayerRows``, and hands the rows to ``advance`` at each layer boundary. One rank keeps the
canonical order throughout (``LocalRouting``); window sequence parallelism (backend/parallel/seedvr2_window_shard.py) moves
whole windows between ranks behind the same protocol.

Contract (stated once here):
- ``LayerRows.row_ids`` [n_local] int64: the canonical token ids (``(t * H + h) * W + w`` of the patched token
  grid) of this rank's rows for the layer, in their local order.
- ``LayerRows.groups``: one ``(shape (t, h, w), local_idx [G, n] int64)`` per window shape present on this rank:
  positions in the local rows of each of its G windows, tokens in window-internal row-major (t, h, w) order; every
  local row appears exactly once over all groups.
- ``LayerRows.total_windows``: windows of the layout over all ranks (the text output is the mean over all of them).
- Index tensors live on the device of the tokens given to ``start``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

from .windows import WINDOW_COUNTS, WindowLayout, layer_window_methods, window_layout

Shape = Tuple[int, int, int]


@dataclass(frozen=True)
class LayerRows:
    layout: WindowLayout
    row_ids: torch.Tensor
    groups: Tuple[Tuple[Shape, torch.Tensor], ...]
    total_windows: int

    @property
    def n_local(self) -> int:
        return int(self.row_ids.numel())


@runtime_checkable
class WindowRouting(Protocol):
    def start(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [N, C] in canonical order -> this rank's rows of layer 0."""

    def rows(self, layer: int) -> LayerRows:
        """The rows this rank holds during `layer`."""

    def advance(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x: this rank's rows of `layer` -> its rows of `layer + 1`."""

    def reduce_text(self, txt_sum: torch.Tensor) -> torch.Tensor:
        """Per-rank float32 sum of the text outputs over its windows -> the sum over all ranks."""

    def finish(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """This rank's rows of the last layer -> [N, C] canonical on the driver (rank 0), None elsewhere."""


# Canonical LayerRows per (layout, device). Layouts come from an lru cache (stable objects), so the id plus an
# identity check is a safe key; bounded like that cache.
_CANONICAL: Dict[Tuple[int, str], LayerRows] = {}
_CANONICAL_MAX = 128


def canonical_rows(layout: WindowLayout, device: torch.device | str = "cpu") -> LayerRows:
    """All rows of `layout` in canonical order (one rank): row_ids = arange, each group's local_idx = the canonical
    ids of its windows' tokens (cached per layout and device; treat as read-only)."""
    device = torch.device(device)
    key = (id(layout), str(device))
    hit = _CANONICAL.get(key)
    if hit is not None and hit.layout is layout:
        return hit
    rows = LayerRows(
        layout=layout,
        row_ids=torch.arange(layout.perm.numel(), dtype=torch.int64, device=device),
        groups=tuple((g.shape, layout.perm[g.rows].to(device)) for g in layout.groups),
        total_windows=len(layout.windows),
    )
    if len(_CANONICAL) >= _CANONICAL_MAX:
        _CANONICAL.clear()
    _CANONICAL[key] = rows
    return rows


class LocalRouting:
    """One rank: every row stays here in canonical order; advance, reduce_text and finish are identities."""

    def __init__(self, grid: Sequence[int], num_layers: int, counts: Sequence[int] = WINDOW_COUNTS):
        self.methods = layer_window_methods(int(num_layers))
        # Both layouts are built now: a bad grid fails before any weight is touched.
        self.layouts = {m: window_layout(m, grid, counts) for m in set(self.methods)}
        self.grid = next(iter(self.layouts.values())).grid
        self.num_tokens = self.grid[0] * self.grid[1] * self.grid[2]
        self.device = torch.device("cpu")

    def start(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[0] != self.num_tokens:
            raise ValueError(f"routing start got tokens of shape {tuple(tokens.shape)}; expected "
                             f"[{self.num_tokens}, C] for token grid {self.grid}")
        self.device = tokens.device
        return tokens

    def rows(self, layer: int) -> LayerRows:
        if not 0 <= layer < len(self.methods):
            raise ValueError(f"layer {layer} is outside 0..{len(self.methods) - 1}")
        return canonical_rows(self.layouts[self.methods[layer]], self.device)

    def advance(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        return x

    def reduce_text(self, txt_sum: torch.Tensor) -> torch.Tensor:
        return txt_sum

    def finish(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        return x
