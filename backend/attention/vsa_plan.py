"""The per-request plan of Video Sparse Attention (VSA) over H3's packed sequence, and its step schedule.

Once per request, from the packed layout:
- the target video rows (`video_indices` past the condition rows) form a latent grid (frames, h, w) in frame-major,
  row-major order; it is cut into 4x4x4 (t, h, w) tiles of up to 64 rows (edge tiles hold fewer rows: they are
  masked in the kernel, no padding row ever enters the sequence);
- every other row (text, keyframe / reference / guide rows, audio) is the prefix, kept in its packed order and cut
  into 64-row blocks; the prefix is always attended in full, so its block cut is only tiling for the fine rule.
  `prefix_sizes` cuts it segment by segment (a run of rows of one modality tag: text, condition video, audio) into
  64-row blocks, the last of each segment shorter, as FastVideo's VSA-H3 does: the coarse branch (vsa_kernel.py,
  learned gates of the FastH3 student) mean-pools these blocks, so a block never mixes two modalities;
- `order` is the permutation into [prefix | tile 0 | tile 1 | ...] (full tiles first, then the edge tiles grouped
  by size, (t, h, w) tile order inside each group; rows inside a tile (t, h, w) row-major); `inverse` takes it back.

The permutation is applied once per request, not per block: `bind(step_plan)` returns the StepPlan with its layout's
rows in tile order (position ids, tags and each row's timestep permuted, the index lists remapped), so the DiT embeds
rows straight into tile order and its output heads read them back through the same index lists; the per-row ops of
a block do not care about row order, and attention receives q, k, v already tiled. A request whose steps are all
dense is not permuted at all (then it is bitwise the dense backend's run), unless the DiT carries learned gates: the
coarse branch they weigh runs on every step, dense ones included, so it always gets the plan (`bind(always=True)`).

Schedule: `dense_steps` >= 1 is a step count, 0 < x < 1 a fraction of the steps (rounded up) run dense first; `topk`
>= 1 is a tile count, 0 < x < 1 a fraction of the video tiles (rounded up) each video query tile attends.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

TILE = (4, 4, 4)
TILE_ROWS = 64  # rows of a full tile, and of a prefix block


PRECISIONS = ("bf16", "sage")  # the sparse steps' operands: the activations' dtype, or SAGE's INT8/FP8 (vsa_sage.py)


@dataclass(frozen=True)
class VSASettings:
    topk: float = 0.1  # tiles (>= 1) or a fraction of the video tiles (< 1)
    dense_steps: float = 0.25  # steps (>= 1) or a fraction of the steps (< 1) run dense before the sparse ones
    precision: str = "bf16"  # PRECISIONS; the dense steps stay exact either way

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"VSA precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}.")
        for name in ("topk", "dense_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"VSA {name} must be a number >= 0 (a count, or a fraction below 1), got {value!r}.")
            if value >= 1 and value != int(value):
                raise ValueError(f"VSA {name} of 1 or more is a count and must be whole, got {value!r}.")
        if self.topk == 0:
            raise ValueError("VSA topk must be > 0 (a tile count, or a fraction of the tiles below 1).")

    def tiles(self, num_tiles: int) -> int:
        k = math.ceil(self.topk * num_tiles) if self.topk < 1 else int(self.topk)
        return max(1, min(k, num_tiles))

    def dense_count(self, steps: int) -> int:
        n = math.ceil(self.dense_steps * steps) if self.dense_steps < 1 else int(self.dense_steps)
        return min(n, steps)

    def spec(self) -> str:
        text = f"topk={_fmt(self.topk)},dense={_fmt(self.dense_steps)}"
        return text if self.precision == "bf16" else f"{text},precision={self.precision}"  # bf16: names as before

    @classmethod
    def parse(cls, text: str) -> "VSASettings":
        """'topk=0.1,dense=10,precision=sage' (each key optional) -> settings; one clear line on anything else."""
        values = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = {"topk": "topk", "dense": "dense_steps", "dense_steps": "dense_steps",
                   "precision": "precision"}.get(key.strip())
            try:
                if not sep or key is None:
                    raise ValueError
                values[key] = raw.strip() if key == "precision" else float(raw)
            except ValueError:
                raise ValueError(f"VSA option {part!r} is not topk=<number>, dense=<number> or "
                                 f"precision={'|'.join(PRECISIONS)}.") from None
        return cls(**values)


def _fmt(x: float) -> str:
    return str(int(x)) if x == int(x) else repr(float(x))


def target_grid(layout) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(target video rows [N] in packed order, latent grid (frames, h, w)); checks the rows are a full grid in
    frame-major, row-major order (the packing layout.py states)."""
    rows = layout.video_indices[layout.num_condition_video_rows:].cpu()
    if rows.numel() == 0:
        return rows, (0, 0, 0)
    pos = layout.position_ids.cpu()[rows]
    h_vals, w_vals = torch.unique(pos[:, 1]), torch.unique(pos[:, 2])
    hw = h_vals.numel() * w_vals.numel()
    if rows.numel() % hw:
        raise ValueError(f"VSA: {rows.numel()} target video rows are not whole frames of {h_vals.numel()}x"
                         f"{w_vals.numel()}; this layout cannot be tiled.")
    grid = (rows.numel() // hw, h_vals.numel(), w_vals.numel())
    view = pos.reshape(*grid, 3)
    ok = (torch.equal(view[..., 1], h_vals.view(1, -1, 1).expand(grid)) and
          torch.equal(view[..., 2], w_vals.view(1, 1, -1).expand(grid)) and
          bool((view[..., 0] == view[:, :1, :1, 0]).all()))
    if not ok:
        raise ValueError("VSA: the target video rows are not frame-major, row-major over one grid; this layout "
                         "cannot be tiled.")
    return rows, grid


def tile_order(grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Grid (f, h, w) -> (row-in-grid of each tiled position [N], each tile's row count [num_tiles])."""
    f, h, w = grid
    tt, th, tw = TILE
    idx = torch.arange(f * h * w).reshape(f, h, w)
    parts, sizes = [], []
    for t0 in range(0, f, tt):
        for h0 in range(0, h, th):
            for w0 in range(0, w, tw):
                block = idx[t0:t0 + tt, h0:h0 + th, w0:w0 + tw].reshape(-1)
                parts.append(block)
                sizes.append(block.numel())
    if not parts:
        return idx.reshape(-1), torch.zeros(0, dtype=torch.long)
    # Full tiles first, then the edge tiles grouped by size ((t, h, w) order inside a group): each group of equal
    # tiles is one contiguous [n, size] block, so pooling is a view and a sum, never a copy.
    rank = sorted(range(len(parts)), key=lambda i: -sizes[i])
    return torch.cat([parts[i] for i in rank]), torch.tensor([sizes[i] for i in rank], dtype=torch.long)


@dataclass
class VSAPlan:
    """Tile geometry of one request (host tensors) and its schedule; see the module docstring."""

    order: torch.Tensor  # [S] new position -> packed row
    inverse: torch.Tensor  # [S] packed row -> new position
    num_prefix: int  # P: the prefix rows, first in tile order
    tile_sizes: torch.Tensor  # [T] rows of each video tile (<= 64)
    grid: tuple[int, int, int]
    settings: VSASettings = field(default_factory=VSASettings)
    sparse: bool = True  # False: a dense step of this plan (the backend runs dense attention)
    _device_tables: dict = field(default_factory=dict, repr=False)
    prefix_sizes: torch.Tensor | None = None  # [Pb] segment-pure prefix blocks (None: plain 64-row blocks)

    @property
    def block_sizes(self) -> torch.Tensor:
        """[Pb + T] rows of every block in tile order: the prefix blocks (segment-pure), then the video tiles."""
        prefix = self.prefix_sizes
        if prefix is None:
            prefix = torch.tensor([n for _, n in self.prefix_blocks], dtype=torch.long)
        return torch.cat([prefix.long(), self.tile_sizes.long()])

    @property
    def num_tiles(self) -> int:
        return int(self.tile_sizes.numel())

    @property
    def tile_starts(self) -> torch.Tensor:
        """[T] first position of each tile in tile order (after the prefix)."""
        return self.num_prefix + torch.cat([torch.zeros(1, dtype=torch.long), self.tile_sizes.cumsum(0)[:-1]])

    @property
    def prefix_blocks(self) -> list[tuple[int, int]]:
        return [(s, min(TILE_ROWS, self.num_prefix - s)) for s in range(0, self.num_prefix, TILE_ROWS)]

    @property
    def size_groups(self) -> list[tuple[int, int]]:
        """(tile size, number of tiles) of each run of equal tiles, in order."""
        sizes, counts = torch.unique_consecutive(self.tile_sizes, return_counts=True)
        return list(zip(sizes.tolist(), counts.tolist()))

    @property
    def topk(self) -> int:
        return self.settings.tiles(self.num_tiles)

    def tables(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tile starts, tile sizes, each video position's tile [S - P]) as int32 / long on `device`, cached."""
        key = str(device)
        if key not in self._device_tables:
            tile_of = torch.repeat_interleave(torch.arange(self.num_tiles), self.tile_sizes)
            self._device_tables[key] = (self.tile_starts.to(device, torch.int32),
                                        self.tile_sizes.to(device, torch.int32), tile_of.to(device))
        return self._device_tables[key]

    def dense(self) -> "VSAPlan":
        return dataclasses.replace(self, sparse=False, _device_tables=self._device_tables)

    def permute_layout(self, layout):
        """The same request with its rows in tile order (a PackedLayout-shaped dataclass)."""
        inv = self.inverse
        return dataclasses.replace(
            layout, position_ids=layout.position_ids[self.order], token_tags=layout.token_tags[self.order],
            video_indices=inv[layout.video_indices], audio_indices=inv[layout.audio_indices],
            text_indices=inv[layout.text_indices])

    def bind(self, step_plan, always: bool = False):
        """-> (the StepPlan the driver runs, step i -> the attention plan of step i). All-dense requests are left in
        packed order and get no plan (exactly the dense backend), unless `always` (a DiT with learned gates: their
        coarse branch needs the plan on dense steps too); otherwise rows run in tile order throughout."""
        steps = step_plan.steps
        dense = self.settings.dense_count(steps) if self.num_tiles else steps
        if dense >= steps and not always:
            return step_plan, lambda i: None
        order, row_t = self.order, step_plan.row_timesteps
        tiled = dataclasses.replace(step_plan, layout=self.permute_layout(step_plan.layout),
                                    row_timesteps=lambda i: row_t(i)[order])
        dense_plan = self.dense()
        return tiled, lambda i: dense_plan if i < dense else self


def make_plan(layout, settings: VSASettings | None = None) -> VSAPlan:
    """The VSA plan of one packed layout (layout.py's PackedLayout)."""
    settings = settings or VSASettings()
    seq = layout.seq_len
    rows, grid = target_grid(layout)
    in_grid, sizes = tile_order(grid)
    video = rows[in_grid]
    is_video = torch.zeros(seq, dtype=torch.bool)
    is_video[rows] = True
    prefix = torch.nonzero(~is_video).reshape(-1)
    order = torch.cat([prefix, video])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq)
    return VSAPlan(order, inverse, int(prefix.numel()), sizes, grid, settings,
                   prefix_sizes=segment_blocks(layout.token_tags.cpu()[prefix]))


def segment_blocks(tags: torch.Tensor) -> torch.Tensor:
    """Prefix rows' modality tags [P] (packed order) -> block sizes [Pb]: each run of one tag cut into 64-row blocks,
    the last of a run shorter."""
    sizes: list[int] = []
    if tags.numel():
        _, runs = torch.unique_consecutive(tags, return_counts=True)
        for run in runs.tolist():
            sizes += [TILE_ROWS] * (run // TILE_ROWS) + ([run % TILE_ROWS] if run % TILE_ROWS else [])
    return torch.tensor(sizes, dtype=torch.long)
