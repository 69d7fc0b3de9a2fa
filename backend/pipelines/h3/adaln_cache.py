"""The AdaLN projection table cache (weight policy adaln="cache"): every step's modulation tables built ahead on
the device, the projection weights in host memory.

Each block's `adaln_proj` (release: Linear(2688 -> 3 * 6 * 5376), 260M params; ~24 GiB over 50 blocks in bf16) and
the output norm's projection depend only on a step's distinct timesteps, which the step plan states before the loop.
- Key of a step (StepKey): the int32 bit patterns of its sorted distinct fp32 timesteps (the projection's input,
  exactly) and the table rows its packed rows use (timestep index * 3 + tag: each role's timestep and modality).
  Bit patterns, not values: equal keys mean equal tables, and no two timesteps alias.
- Tables (ModulationTables): per block the projection of the same [K] time embedding the direct forward makes, by
  the same function (h3_transformer.adaln_table) on the same shapes, so they are equal bit for bit; only the used
  rows are kept ([R, 6 * hidden]; the step's AdaLN segments are renumbered to match), plus the output norm's
  [K, 2 * hidden].
- Weights: moved to host memory once (on CUDA one flat page-locked buffer, models/block_offload.HostHome; on the
  CPU the tensors themselves); the modules' Parameters keep empty data, so a forward that is not handed tables fails
  loudly instead of reading a stale weight, and weight streaming (which skips empty tensors) leaves them alone.
- Build (keys the cache lacks): block by block the weights go to the device, every missing key is projected, the copy
  is dropped (one block's weights extra at a time). New tables are committed only when all are built: a Stop (asked
  between blocks, agreed by every rank) or a failure commits none of them and leaves the weights in host memory
  (older keys evicted beforehand to make room stay evicted: the next plan that needs them rebuilds them).
- Budget: when a plan's tables would take more bytes than the projection weights (an edit with many mask levels over
  many steps), the plan runs on the direct projection: weights restored for the plan, offloaded after it.
- Ulysses: keys come from all of a step's rows (not the rank's shard), so every rank builds the same tables; a rank
  rebuilds when any rank misses, so all ranks make the same collectives.
A pruned native DiT (ComfyUI's curve form, h3_transformer.curve_rows) has no cache: its projections are a few MB,
so adaln "cache" is a no-op for it (components.H3Components) and constructing one is an error.
`report()`: the bytes held (tables on the device, weights in host memory and on the device) and the hit counts.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from ...errors import Cancelled
from ...models.block_offload import HostHome
from ...models.h3_ops import RowSegments
from ...models.h3_transformer import MODALITY_COUNT, ModulationTables, adaln_table, norm_out_table
from ...parallel.context import SINGLE, ParallelContext
from .step_plan import StepPlan, step_segments


@dataclass(frozen=True)
class StepKey:
    timesteps: tuple[int, ...]  # int32 bit patterns of the step's sorted distinct fp32 timesteps
    rows: tuple[int, ...]  # the AdaLN table rows (timestep index * 3 + tag) its rows use, sorted


@dataclass(frozen=True)
class StepInfo:
    """One step of a plan, from host tensors: distinct timesteps ts [K] fp32, each row's index into them [S] long,
    the cache key and the renumbering of the used table rows (global row -> position in the kept rows)."""

    ts: torch.Tensor
    row_index: torch.Tensor
    key: StepKey
    renumber: dict[int, int]

    @classmethod
    def of(cls, row_t: torch.Tensor, token_tags: torch.Tensor) -> "StepInfo":
        ts, row_index = torch.unique(row_t, sorted=True, return_inverse=True)
        used = torch.unique(row_index * MODALITY_COUNT + token_tags.cpu().to(torch.long)).tolist()
        key = StepKey(tuple(ts.to(torch.float32).view(torch.int32).tolist()), tuple(used))
        return cls(ts, row_index, key, {row: i for i, row in enumerate(used)})


def renumbered(segments: RowSegments, renumber: dict[int, int]) -> RowSegments:
    """The same runs, their table rows numbered as in the kept rows of the cached tables."""
    return RowSegments(tuple((start, stop, renumber[row]) for start, stop, row in segments.runs))


class AdaLNCache:
    """The cache of one loaded DiT (one per transformer partition). Construct it once after loading: it moves the
    projection weights to host memory at once."""

    def __init__(self, dit):
        if dit.pruned:  # its projections are [width 8 -> ...]: nothing to save; the components do not build one
            raise ValueError("A pruned native DiT (AdaLN over a curve table) needs no AdaLN table cache: its AdaLN "
                             "projections are tiny; run it with adaln 'direct'.")
        self.dit = dit
        self.device = dit.proj_in.weight.device
        self._linears: list[nn.Linear] = [b.adaln_proj.linear for b in dit.transformer_blocks]
        self._linears.append(dit.norm_out.linear)
        params = [p for lin in self._linears for p in (lin.weight, lin.bias)]
        self._home = None
        self.pinned = False
        if self.device.type == "cuda":  # one flat page-locked buffer (torch's pinned allocator rounds each up to 2^n)
            self._home = HostHome(params, pin=True)
            self.pinned = getattr(self._home, "pinned", True)  # pageable (with a warning) where locking is refused
            host = self._home.views(self._home.buffer)
        else:
            host = [p.data for p in params]  # already host memory: the modules let go of it, the cache keeps it
        self._host = list(zip(host[0::2], host[1::2]))
        self._place_holders()  # the host copies are the only ones now
        self.weight_bytes = sum(t.numel() * t.element_size() for pair in self._host for t in pair)
        self._tables: OrderedDict[StepKey, ModulationTables] = OrderedDict()
        self.mode = "tables"  # of the last plan: "tables", or "direct" when its tables would not fit
        self.stats = {"builds": 0, "keys_built": 0, "hits": 0, "misses": 0, "direct_plans": 0, "build_s": 0.0}

    # ---- bytes -------------------------------------------------------------------------------------------------
    def key_bytes(self, key: StepKey) -> int:
        """Device bytes of one key's tables: R rows of 6 * hidden per block, K rows of 2 * hidden for the output."""
        size = self._host[0][0].element_size()
        per_block = sum(len(key.rows) * (w.shape[0] // MODALITY_COUNT) for w, _ in self._host[:-1])
        return size * (per_block + len(key.timesteps) * self._host[-1][0].shape[0])

    @property
    def table_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for m in self._tables.values() for t in (*m.blocks, m.out))

    def report(self) -> dict:
        """What this cache holds, for a stage manifest: tables (device) vs projection weights (host / device)."""
        on_device = sum(p.numel() * p.element_size() for lin in self._linears for p in (lin.weight, lin.bias))
        return {"adaln": "cache", "mode": self.mode, "table_bytes": self.table_bytes, "table_keys": len(self._tables),
                "weight_bytes_host": self.weight_bytes, "weight_bytes_device": on_device,
                "pinned": self.pinned, **self.stats}

    # ---- weights -----------------------------------------------------------------------------------------------
    def _place_holders(self) -> None:
        # `.data`, not new Parameters: the Parameter objects stay the same for whatever holds them (block streaming).
        for lin in self._linears:
            for p in (lin.weight, lin.bias):
                p.data = torch.empty(0, dtype=p.dtype, device=self.device)  # on the engine's device, whatever held it

    def _on_device(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.to(self.device, non_blocking=True) for t in self._host[j])

    @contextlib.contextmanager
    def weights_restored(self) -> Iterator[None]:
        """The projection weights back on the modules (the direct path) for the block; offloaded again after it,
        whatever happens inside (an out-of-memory half way included)."""
        try:
            for j, lin in enumerate(self._linears):
                lin.weight.data, lin.bias.data = self._on_device(j)
            yield
        finally:
            self._place_holders()

    def release(self) -> None:
        """End the cache: the projection weights back on the modules for good (on the device, copies of the host
        ones), its tables dropped. A LoRA switch does this, then builds a new cache over the switched weights."""
        for j, lin in enumerate(self._linears):
            lin.weight.data, lin.bias.data = (t.to(self.device, copy=True) for t in self._host[j])
        self._tables.clear()
        self._home = None
        self._host = []

    # ---- tables ------------------------------------------------------------------------------------------------
    def evict(self, key: StepKey | None = None) -> None:
        """Drop one key's tables (all with None)."""
        if key is None:
            self._tables.clear()
        else:
            self._tables.pop(key, None)

    def _make_room(self, keep: set[StepKey], incoming: int) -> None:
        """Evict least recently used keys outside `keep` until the tables held plus `incoming` fit the budget."""
        held = self.table_bytes
        for key in [k for k in self._tables if k not in keep]:
            if held + incoming <= self.weight_bytes:
                break
            held -= self.key_bytes(key)
            del self._tables[key]

    def ensure(self, infos: list[StepInfo], parallel: ParallelContext = SINGLE,
               should_stop: Callable[[], bool] | None = None, step: int = 0, total: int = 1) -> None:
        """Build the tables of the keys among `infos` the cache lacks (on every rank when any rank lacks one).
        Least recently used keys outside `infos` are evicted first, as far as the budget needs (before the build,
        so old and new tables never exceed it together). Atomic: on Stop or failure no new table is committed and
        the weights stay in host memory."""
        missing = list(dict.fromkeys(i.key for i in infos if i.key not in self._tables))
        self.stats["hits"] += len({i.key for i in infos}) - len(missing)
        if not parallel.any(bool(missing)):
            return
        self.stats["misses"] += len(missing)
        self._make_room({i.key for i in infos}, sum(self.key_bytes(k) for k in missing))
        start = time.perf_counter()
        first = {}
        for info in infos:
            first.setdefault(info.key, info)
        tembs = {k: self.dit.time_embedding(first[k].ts.to(self.device)) for k in missing}
        rows = {k: torch.tensor(k.rows, dtype=torch.long, device=self.device) for k in missing}
        built: dict[StepKey, list[torch.Tensor]] = {k: [] for k in missing}
        for j in range(len(self._linears)):
            if parallel.any(should_stop is not None and should_stop()):  # every rank stops here, or none does
                raise Cancelled(f"Stopped before step {step + 1}/{total} (while building AdaLN tables).")
            weight, bias = self._on_device(j)
            last = j == len(self._linears) - 1
            for key in missing:
                built[key].append(norm_out_table(tembs[key], weight, bias) if last
                                  else adaln_table(tembs[key], weight, bias).index_select(0, rows[key]))
            del weight, bias
        for key in missing:  # commit: nothing above touched the cache
            self._tables[key] = ModulationTables(tuple(built[key][:-1]), built[key][-1])
        self.stats["builds"] += 1
        self.stats["keys_built"] += len(missing)
        self.stats["build_s"] += time.perf_counter() - start

    def tables(self, info: StepInfo, parallel: ParallelContext = SINGLE,
               should_stop: Callable[[], bool] | None = None, step: int = 0, total: int = 1) -> ModulationTables:
        """The step's tables; a key the cache lacks (evicted since the plan began) is rebuilt here."""
        if parallel.any(info.key not in self._tables):
            self.ensure([info], parallel, should_stop, step, total)
        self._tables.move_to_end(info.key)
        return self._tables[info.key]


class PlannedSteps:
    """What the denoise driver asks at each step i: (ts [K], row_index [S] on the host, this rank's segments,
    ModulationTables or None for the direct projection). Without a cache it computes each step as it comes."""

    def __init__(self, plan: StepPlan, infos: list[StepInfo] | None = None, cache: AdaLNCache | None = None,
                 parallel: ParallelContext = SINGLE, should_stop: Callable[[], bool] | None = None):
        self.plan, self.infos, self.cache, self.parallel, self.should_stop = plan, infos, cache, parallel, should_stop

    def step(self, i: int, shard=None):
        tags = self.plan.layout.token_tags
        if self.infos is None:
            ts, row_index = torch.unique(self.plan.row_timesteps(i), sorted=True, return_inverse=True)
            return ts, row_index, step_segments(tags, row_index, shard), None
        info = self.infos[i]
        adaln, out = step_segments(tags, info.row_index, shard)
        if self.cache is None:
            return info.ts, info.row_index, (adaln, out), None
        tables = self.cache.tables(info, self.parallel, self.should_stop, i, self.plan.steps)
        return info.ts, info.row_index, (renumbered(adaln, info.renumber), out), tables


@contextlib.contextmanager
def planned_steps(plan: StepPlan, cache: AdaLNCache | None, parallel: ParallelContext = SINGLE,
                  should_stop: Callable[[], bool] | None = None) -> Iterator[PlannedSteps]:
    """The steps of `plan` for the denoise driver. With a cache: every step's key from the plan, the missing tables
    built before step 1, or, when the plan's tables would exceed the projection weights, the direct projection with
    the weights restored for the plan's life."""
    if cache is None:
        yield PlannedSteps(plan)
        return
    tags = plan.layout.token_tags
    infos = [StepInfo.of(plan.row_timesteps(i), tags) for i in range(plan.steps)]
    need = sum(cache.key_bytes(k) for k in dict.fromkeys(i.key for i in infos))
    if need > cache.weight_bytes:  # the same decision on every rank: it depends on the plan alone
        cache.mode = "direct"
        cache.stats["direct_plans"] += 1
        with cache.weights_restored():
            yield PlannedSteps(plan, infos)
        return
    cache.mode = "tables"
    cache.ensure(infos, parallel, should_stop, 0, plan.steps)
    yield PlannedSteps(plan, infos, cache, parallel, should_stop)

