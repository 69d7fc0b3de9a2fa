"""ParallelContext: who this rank is among the ranks of one engine, built once when a rank starts.

Everything that splits work across ranks asks it, rather than passing bare rank/world ints around:
- `rows(seq_len)`: the contiguous-rows plan of Ulysses sequence parallelism over a packed sequence (H3), or None on
  one rank (the model then runs unsharded, with no collective at all);
- `owns(i)` / `owner(i)`: round-robin ownership of independent work items (the VAE decode's clips);
- `any(flag)`: agreement before acting (Stop at a step boundary: every rank stops there, or none does);
- `broadcast_from_driver(...)`: what only rank 0 computes (prompt embeddings) reaches every rank.
A window-aligned plan (SeedVR2: whole attention windows per rank) is another method of the same object.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ulysses import SequenceShard


@dataclass(frozen=True)
class ParallelContext:
    rank: int = 0
    world: int = 1
    group: object = None  # torch.distributed process group (None: the default group, when world > 1)

    def __post_init__(self):
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")

    @property
    def is_parallel(self) -> bool:
        return self.world > 1

    @property
    def is_driver(self) -> bool:
        """Rank 0: holds what only one rank needs (text encoder, output assembly, the file being written)."""
        return self.rank == 0

    def rows(self, seq_len: int) -> SequenceShard | None:
        """This rank's contiguous rows of a packed sequence of `seq_len` rows (Ulysses), None on one rank."""
        if self.world == 1:
            return None
        return SequenceShard(self.rank, self.world, seq_len, self.group)

    def owner(self, item: int) -> int:
        """The rank that computes work item `item` of a round-robin split."""
        return item % self.world

    def owns(self, item: int) -> bool:
        return self.owner(item) == self.rank

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on any (a CPU all-reduce: gloo, also beside NCCL)."""
        if self.world == 1:
            return bool(flag)
        import torch.distributed as dist

        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def sum(self, values: list[float]) -> list[float]:
        """Each of `values` summed over every rank (a CPU all-reduce in float64), the same list on every rank."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t.tolist()

    def min(self, value: int) -> int:
        """The smallest of every rank's `value` (a CPU all-reduce), so that every rank plans alike (e.g. from the
        least free device memory)."""
        if self.world == 1:
            return int(value)
        import torch.distributed as dist

        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def broadcast_from_driver(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` on every rank, in place (every rank passes one of the same shape and dtype)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.broadcast(tensor, src=0, group=self.group)
        return tensor

    def broadcast_from(self, owner: int, tensor: torch.Tensor) -> torch.Tensor:
        """Rank `owner`'s `tensor` on every rank, in place."""
        if self.world > 1:
            import torch.distributed as dist

            dist.broadcast(tensor, src=owner, group=self.group)
        return tensor


SINGLE = ParallelContext()
