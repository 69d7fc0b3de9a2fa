"""Window-aligned sequence parallelism for SeedVR2: whole attention windows per rank.

Every SeedVR2 layer attends inside 3D windows (backend/models/seedvr2/windows.py), regular windows on even layers and
shifted ones on odd layers. A rank that holds every row of a window computes that window's attention alone, so the
only traffic is re-dealing rows where the layout changes between two layers, the per-window text sums, and the final
gather. Contracts (stated once here):

- Plan per layout (`WindowShardPlan`, cached per grid/world): cost(window) = n * (n + L_txt) + c * n (attention over
  the joint [window ; text] sequence, plus the per-token linear layers, c = `DEFAULT_LINEAR_COST` until calibrated).
  LPT: windows by descending cost (ties: window index), each to the least-loaded rank; among equally loaded ranks,
  the one holding most of the window's rows in the other layout (fewer rows to move), then the lowest rank. The
  first layout planned (layer 0's) has no other layout yet: its ties go to the lowest rank. A rank may own no window.
- A rank's local order for a layout: its windows in layout order, each window's rows in window-internal row-major
  order (what `LayerRows.row_ids` lists).
- `start`: every rank has the full canonical tokens and picks its layer-0 rows (no communication). `advance`: where
  the layout changes, ONE `all_to_all_single` with variable splits (rank s sends rank d the rows d needs from s, in
  d's new local order), then one local permutation (the received rows come grouped by source). `reduce_text`:
  all_reduce SUM. `finish`: ONE `all_to_all_single` in which every rank sends all its rows to rank 0 (variable
  sizes, no padding, memory only on rank 0; gloo has no uneven all_gather and a padded all_gather would give every
  rank the whole output), then rank 0 restores canonical order.
- Devices: index tensors live on the rows' device. Where the group's backend for that device is gloo and the device
  is not the CPU, the collective runs on host copies (gloo's collectives are CPU-first; one path for every torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..models.seedvr2.routing import LayerRows
from ..models.seedvr2.windows import WINDOW_COUNTS, WindowLayout, layer_window_methods, window_layout
from .context import ParallelContext

# c in cost = n * (n + L_txt) + c * n. Per token, attention costs ~4 * (n + L_txt) * dim FLOPs and the linear layers
# (qkv, out, MLP) ~24 * dim^2, so c ~ 6 * dim: 16384 is between the 3B (2560) and 7B (3072) widths. The linear part
# sums to c * N over all windows, so c only shifts the balance between big and small windows. Calibrate on the GPU.
DEFAULT_LINEAR_COST = 16384
# L_txt of the released SeedVR2 text embeddings (pos_emb / neg_emb are [58, 5120]).
DEFAULT_TEXT_LEN = 58


def window_cost(n: int, text_len: int = DEFAULT_TEXT_LEN, linear_cost: int = DEFAULT_LINEAR_COST) -> int:
    """Work of one window of n video tokens (integer: equal windows tie exactly)."""
    return n * (n + text_len) + linear_cost * n


def assign_windows(costs: Sequence[int], world: int, affinity: Optional[torch.Tensor] = None) -> Tuple[int, ...]:
    """LPT: owner rank of each window. Windows by descending cost (stable), each to the least-loaded rank; ties go
    to the rank with the largest `affinity[window, rank]` (rows it already holds), then the lowest rank."""
    if world < 1:
        raise ValueError(f"window sharding needs at least one rank, got world={world}")
    if affinity is not None and tuple(affinity.shape) != (len(costs), world):
        raise ValueError(f"affinity has shape {tuple(affinity.shape)}; expected {(len(costs), world)}")
    aff = affinity.tolist() if affinity is not None else None
    loads = [0] * world
    owners = [0] * len(costs)
    for w in sorted(range(len(costs)), key=lambda i: -costs[i]):
        low = min(loads)
        tied = [r for r in range(world) if loads[r] == low]
        best = max(tied, key=lambda r: (aff[w][r] if aff is not None else 0, -r))
        owners[w] = best
        loads[best] += costs[w]
    return tuple(owners)


@dataclass(frozen=True)
class Transition:
    """One rank's part of a layout change: `send = x[send_index]` split by `send_splits` (per destination),
    all_to_all_single into a buffer split by `recv_splits` (per source), then `new = buffer[recv_perm]`."""

    send_index: torch.Tensor
    send_splits: Tuple[int, ...]
    recv_splits: Tuple[int, ...]
    recv_perm: torch.Tensor

    def to(self, device) -> "Transition":
        return Transition(self.send_index.to(device), self.send_splits, self.recv_splits, self.recv_perm.to(device))


class WindowShardPlan:
    """Windows -> ranks for both layouts of one grid, and every rank's rows and transitions (CPU int64 tensors).
    Pure and deterministic: every rank builds the same plan without communicating. Read-only once built."""

    def __init__(self, grid: Sequence[int], world: int, counts: Sequence[int] = WINDOW_COUNTS,
                 text_len: int = DEFAULT_TEXT_LEN, linear_cost: int = DEFAULT_LINEAR_COST,
                 methods: Sequence[str] = ()):
        if world < 1:
            raise ValueError(f"window sharding needs at least one rank, got world={world}")
        if text_len < 0 or linear_cost < 0:
            raise ValueError(f"window cost terms must be >= 0 (text_len={text_len}, linear_cost={linear_cost})")
        self.world = int(world)
        self.text_len = int(text_len)
        self.linear_cost = int(linear_cost)
        # Layouts in the order the layers first use them (layer 0's first); both schemes even for one layer, so
        # the plan depends only on the grid, not on the depth.
        order = list(dict.fromkeys(list(methods) + layer_window_methods(2)))
        self.layouts: Dict[str, WindowLayout] = {m: window_layout(m, grid, counts) for m in order}
        first = self.layouts[order[0]]
        self.grid = first.grid
        self.num_tokens = first.perm.numel()
        self.costs: Dict[str, Tuple[int, ...]] = {}
        self.owners: Dict[str, Tuple[int, ...]] = {}
        self._token_owner: Dict[str, torch.Tensor] = {}
        self._token_pos: Dict[str, torch.Tensor] = {}
        self._rank_rows: Dict[str, List[torch.Tensor]] = {}
        planned: Optional[str] = None
        for method in order:
            layout = self.layouts[method]
            costs = tuple(window_cost(n, self.text_len, self.linear_cost) for n in layout.lengths)
            affinity = self._affinity(layout, planned) if planned is not None else None
            self.costs[method] = costs
            self.owners[method] = assign_windows(costs, self.world, affinity)
            self._index(method)
            planned = method
        self._transitions: Dict[Tuple[str, str, int], Transition] = {}

    # -- per layout ---------------------------------------------------------------------------------------------
    def _window_of_row(self, layout: WindowLayout) -> torch.Tensor:
        """Window index of each row in layout (window) order."""
        return torch.repeat_interleave(torch.arange(len(layout.lengths)), torch.tensor(layout.lengths))

    def _affinity(self, layout: WindowLayout, other: str) -> torch.Tensor:
        """[windows, world]: how many of each window's rows every rank holds in the `other` layout."""
        holder = self._token_owner[other][layout.perm]
        flat = self._window_of_row(layout) * self.world + holder
        return torch.bincount(flat, minlength=len(layout.lengths) * self.world).view(-1, self.world)

    def _index(self, method: str) -> None:
        layout = self.layouts[method]
        owner_of_row = torch.tensor(self.owners[method], dtype=torch.int64)[self._window_of_row(layout)]
        rows = [layout.perm[owner_of_row == r] for r in range(self.world)]  # window order kept: local order
        token_owner = torch.empty(self.num_tokens, dtype=torch.int64)
        token_pos = torch.empty(self.num_tokens, dtype=torch.int64)
        for r, ids in enumerate(rows):
            token_owner[ids] = r
            token_pos[ids] = torch.arange(ids.numel())
        self._rank_rows[method] = rows
        self._token_owner[method] = token_owner
        self._token_pos[method] = token_pos

    def rank_rows(self, method: str, rank: int) -> torch.Tensor:
        """Canonical token ids of `rank`'s rows in `method`'s layout, in its local order."""
        return self._rank_rows[method][rank]

    def rank_windows(self, method: str, rank: int) -> Tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.owners[method]) if r == rank)

    def loads(self, method: str) -> Tuple[int, ...]:
        out = [0] * self.world
        for cost, r in zip(self.costs[method], self.owners[method]):
            out[r] += cost
        return tuple(out)

    def layer_rows(self, method: str, rank: int) -> LayerRows:
        """`rank`'s LayerRows for `method` (CPU tensors): its row ids and, per shape group of the layout that it owns
        windows of, the local positions of those windows' rows."""
        layout = self.layouts[method]
        owners = self.owners[method]
        starts = [0]
        for n in layout.lengths[:-1]:
            starts.append(starts[-1] + n)
        local_start: Dict[int, int] = {}
        pos = 0
        for w in self.rank_windows(method, rank):
            local_start[w] = pos
            pos += layout.lengths[w]
        groups = []
        for group in layout.groups:
            mine = [w for w in group.windows if owners[w] == rank]
            if not mine:
                continue  # an empty group would be a batch-0 kernel call
            n = layout.lengths[mine[0]]
            idx = torch.tensor([local_start[w] for w in mine], dtype=torch.int64)[:, None] + torch.arange(n)
            groups.append((group.shape, idx))
        return LayerRows(layout=layout, row_ids=self.rank_rows(method, rank), groups=tuple(groups),
                         total_windows=len(layout.windows))

    # -- transitions ----------------------------------------------------------------------------------------------
    def transition(self, src: str, dst: str, rank: int) -> Transition:
        """`rank`'s send/receive plan for rows going from layout `src` to layout `dst` (cached)."""
        key = (src, dst, rank)
        hit = self._transitions.get(key)
        if hit is not None:
            return hit
        n, world = self.num_tokens, self.world
        src_owner, src_pos = self._token_owner[src], self._token_pos[src]
        dst_owner, dst_pos = self._token_owner[dst], self._token_pos[dst]
        # Send: my rows in src, ordered by (destination, position in the destination's dst order).
        mine = (src_owner == rank).nonzero().view(-1)
        order = torch.argsort(dst_owner[mine] * n + dst_pos[mine])
        send_index = src_pos[mine][order]
        send_splits = torch.bincount(dst_owner[mine], minlength=world)
        # Receive: my rows in dst arrive grouped by source, each source's in my dst order; put them in dst order.
        ours = (dst_owner == rank).nonzero().view(-1)
        arrived = dst_pos[ours][torch.argsort(src_owner[ours] * n + dst_pos[ours])]
        recv_perm = torch.empty_like(arrived)
        recv_perm[arrived] = torch.arange(arrived.numel())
        recv_splits = torch.bincount(src_owner[ours], minlength=world)
        t = Transition(send_index, tuple(send_splits.tolist()), tuple(recv_splits.tolist()), recv_perm)
        self._transitions[key] = t
        return t

    def rows_moved(self, src: str, dst: str) -> int:
        """Rows whose rank changes between the two layouts (all ranks)."""
        return int((self._token_owner[src] != self._token_owner[dst]).sum())


@lru_cache(maxsize=4)  # a plan holds a few int64 per token (tens of MB at 1080p); requests reuse one grid
def _cached_plan(grid: Tuple[int, int, int], world: int, counts: Tuple[int, int, int], text_len: int,
                 linear_cost: int, methods: Tuple[str, ...]) -> WindowShardPlan:
    return WindowShardPlan(grid, world, counts, text_len, linear_cost, methods)


def shard_plan(grid: Sequence[int], world: int, counts: Sequence[int] = WINDOW_COUNTS,
               text_len: int = DEFAULT_TEXT_LEN, linear_cost: int = DEFAULT_LINEAR_COST,
               first_method: Optional[str] = None) -> WindowShardPlan:
    """The plan for (grid, world, ...), built once per process and shared (read-only)."""
    methods = (first_method,) if first_method else tuple(layer_window_methods(1))
    return _cached_plan(tuple(int(x) for x in grid), int(world), tuple(int(c) for c in counts), int(text_len),
                        int(linear_cost), methods)


def _host_staged(group, device: torch.device) -> bool:
    """True where the group's backend for `device` is gloo (or none) on a non-CPU device: run on host copies."""
    if device.type == "cpu":
        return False
    import torch.distributed as dist

    get_config = getattr(dist, "get_backend_config", None)
    config = str(get_config(group) if get_config is not None else dist.get_backend(group))
    if ":" in config:
        backends = dict(part.split(":", 1) for part in config.split(","))
        backend = backends.get(device.type)
    else:
        backend = config
    return backend in (None, "gloo")


def _all_to_all(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], group) -> torch.Tensor:
    """Variable-split all_to_all_single along dim 0; host copies where the backend needs them."""
    import torch.distributed as dist

    staged = _host_staged(group, x.device)
    send = x.cpu() if staged else x.contiguous()
    recv = send.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(recv, send, list(recv_splits), list(send_splits), group=group)
    return recv.to(x.device) if staged else recv


class ShardedWindowRouting:
    """WindowRouting across the ranks of `ctx` (backend/models/seedvr2/routing.py): each rank holds whole windows.

    Every rank builds the same `WindowShardPlan`; per-rank rows, groups and transition indices are built once and kept
    on the rows' device. With one rank it is the canonical layout order (no collectives)."""

    def __init__(self, ctx: ParallelContext, grid: Sequence[int], num_layers: int,
                 counts: Sequence[int] = WINDOW_COUNTS, *, text_len: int = DEFAULT_TEXT_LEN,
                 linear_cost: int = DEFAULT_LINEAR_COST):
        if num_layers < 1:
            raise ValueError(f"SeedVR2 window routing needs at least one layer, got num_layers={num_layers}")
        self.ctx = ctx
        self.num_layers = int(num_layers)
        self.methods = layer_window_methods(self.num_layers)
        self.plan = shard_plan(grid, ctx.world, counts, text_len, linear_cost, first_method=self.methods[0])
        self.device = torch.device("cpu")  # index tensors follow the tokens given to start (routing.py contract)
        self._rows: Dict[str, LayerRows] = {}
        self._transitions: Dict[Tuple[str, str], Transition] = {}
        self._finish_perm: Optional[torch.Tensor] = None

    # -- layers -----------------------------------------------------------------------------------------------------
    def _check_layer(self, layer: int) -> str:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside the {self.num_layers} layers of this routing")
        return self.methods[layer]

    def rows(self, layer: int) -> LayerRows:
        method = self._check_layer(layer)
        hit = self._rows.get(method)
        if hit is None:
            cpu = self.plan.layer_rows(method, self.ctx.rank)
            hit = LayerRows(layout=cpu.layout, row_ids=cpu.row_ids.to(self.device),
                            groups=tuple((shape, idx.to(self.device)) for shape, idx in cpu.groups),
                            total_windows=cpu.total_windows)
            self._rows[method] = hit
        return hit

    def _check_rows(self, x: torch.Tensor, layer: int) -> None:
        want = self.rows(layer).row_ids.numel()
        if x.dim() < 1 or x.shape[0] != want:
            raise ValueError(f"layer {layer} rows have shape {tuple(x.shape)}; rank {self.ctx.rank} holds {want} rows")

    def start(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's layer-0 rows of the canonical tokens [N, C] (every rank holds all of them)."""
        if tokens.dim() < 1 or tokens.shape[0] != self.plan.num_tokens:
            raise ValueError(f"tokens have shape {tuple(tokens.shape)}; expected [{self.plan.num_tokens}, C] for "
                             f"grid {self.plan.grid}")
        if tokens.device != self.device:
            self.device = tokens.device
            self._rows.clear()
        return tokens.index_select(0, self.rows(0).row_ids)

    def advance(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Rows of `layer` -> rows of `layer + 1`: identity where the layout is the same, else one all-to-all."""
        src = self._check_layer(layer)
        if layer + 1 >= self.num_layers:
            raise ValueError(f"layer {layer} is the last of {self.num_layers}: call finish, not advance")
        dst = self.methods[layer + 1]
        self._check_rows(x, layer)
        if src == dst:
            return x
        t = self._transition(src, dst, x.device)
        send = x.index_select(0, t.send_index)
        recv = send if self.ctx.world == 1 else _all_to_all(send, t.send_splits, t.recv_splits, self.ctx.group)
        return recv.index_select(0, t.recv_perm)

    def _transition(self, src: str, dst: str, device: torch.device) -> Transition:
        key = (src, dst)
        hit = self._transitions.get(key)
        if hit is None or hit.recv_perm.device != device:
            hit = self.plan.transition(src, dst, self.ctx.rank).to(device)
            self._transitions[key] = hit
        return hit

    def reduce_text(self, txt_sum: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's per-window text sums (in place where no host copy is needed)."""
        if self.ctx.world == 1:
            return txt_sum
        import torch.distributed as dist

        if _host_staged(self.ctx.group, txt_sum.device):
            host = txt_sum.cpu()
            dist.all_reduce(host, op=dist.ReduceOp.SUM, group=self.ctx.group)
            return host.to(txt_sum.device)
        dist.all_reduce(txt_sum, op=dist.ReduceOp.SUM, group=self.ctx.group)
        return txt_sum

    def finish(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Last layer's rows of every rank -> [N, ...] canonical order on rank 0; None on the other ranks."""
        last = self.num_layers - 1
        self._check_rows(x, last)
        method = self.methods[last]
        if self._finish_perm is None or self._finish_perm.device != x.device:
            # canonical = gathered[perm]: gathered rows are every rank's rows, rank after rank, in local order.
            ids = torch.cat([self.plan.rank_rows(method, r) for r in range(self.ctx.world)])
            perm = torch.empty_like(ids)
            perm[ids] = torch.arange(ids.numel())
            self._finish_perm = perm.to(x.device)
        if self.ctx.world == 1:
            return x.index_select(0, self._finish_perm)
        sizes = [self.plan.rank_rows(method, r).numel() for r in range(self.ctx.world)]
        send_splits = [x.shape[0]] + [0] * (self.ctx.world - 1)
        recv_splits = sizes if self.ctx.is_driver else [0] * self.ctx.world
        gathered = _all_to_all(x, send_splits, recv_splits, self.ctx.group)
        return gathered.index_select(0, self._finish_perm) if self.ctx.is_driver else None


def plan_report(grid: Sequence[int], world: int, num_layers: int, counts: Sequence[int] = WINDOW_COUNTS,
                text_len: int = DEFAULT_TEXT_LEN, linear_cost: int = DEFAULT_LINEAR_COST,
                row_bytes: int = 0) -> dict:
    """Balance and traffic of the plan, for benchmarks (plain numbers, JSON-friendly).

    Per layout: windows, the max/mean of the per-rank cost (1.0 = perfect), windows and rows per rank. Per layout
    change: rows that change rank (all ranks together) and the most any one rank sends / receives to / from others;
    `boundaries` = how many layer boundaries change layout in one forward of `num_layers` layers; with `row_bytes`
    (width x bytes per element) also bytes moved per boundary."""
    methods = layer_window_methods(num_layers)
    plan = shard_plan(grid, world, counts, text_len, linear_cost, first_method=methods[0])
    layouts = {}
    for method in dict.fromkeys(methods):
        loads = plan.loads(method)
        mean = sum(loads) / world
        layouts[method] = {
            "windows": len(plan.layouts[method].windows),
            "balance": max(loads) / mean if mean else 1.0,
            "cost_per_rank": list(loads),
            "windows_per_rank": [len(plan.rank_windows(method, r)) for r in range(world)],
            "rows_per_rank": [plan.rank_rows(method, r).numel() for r in range(world)],
        }
    transitions = {}
    pairs = {(a, b) for a, b in zip(methods, methods[1:]) if a != b}
    for src, dst in sorted(pairs):
        per_rank = [plan.transition(src, dst, r) for r in range(world)]
        sent = [sum(t.send_splits) - t.send_splits[r] for r, t in enumerate(per_rank)]
        received = [sum(t.recv_splits) - t.recv_splits[r] for r, t in enumerate(per_rank)]
        moved = plan.rows_moved(src, dst)
        entry = {"rows_moved": moved, "fraction_moved": moved / plan.num_tokens,
                 "max_rows_sent": max(sent), "max_rows_received": max(received)}
        if row_bytes:
            entry["bytes_moved"] = moved * row_bytes
        transitions[f"{src}->{dst}"] = entry
    return {"grid": list(plan.grid), "world": world, "tokens": plan.num_tokens, "text_len": text_len,
            "linear_cost": linear_cost, "layouts": layouts, "transitions": transitions,
            "boundaries": sum(a != b for a, b in zip(methods, methods[1:]))}
