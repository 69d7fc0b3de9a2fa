"""Ulysses sequence parallelism over the packed H3 sequence.

Sharding contract: the packed sequence of S rows is padded to S_pad = ceil(S / N) * N and rank r owns rows
[r * L, (r + 1) * L), L = S_pad / N. Before attention an all-to-all turns [B, L, H, D] (all heads, own rows) into
[B, S_pad, H / N, D] (all rows, own heads); attention runs on the first S rows only, so padding never changes a
result; a second all-to-all turns it back. The output heads run on a rank's own rows and only their 128-wide outputs
are all-gathered (not the 5376-wide hidden states: 42x less traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class SequenceShard:
    rank: int
    world: int
    seq_len: int  # S, valid rows
    group: object = None  # torch.distributed process group (None: the default group)

    @property
    def padded_len(self) -> int:
        return -(-self.seq_len // self.world) * self.world

    @property
    def local_len(self) -> int:
        return self.padded_len // self.world

    @property
    def start(self) -> int:
        return self.rank * self.local_len

    @property
    def stop(self) -> int:
        return self.start + self.local_len

    @property
    def valid_stop(self) -> int:
        """End of this rank's valid rows (rows past S are padding)."""
        return max(self.start, min(self.stop, self.seq_len))

    def attention(self, attention):
        """`attention` over every rank's rows, taking and returning this rank's (ulysses_attention below). The model
        asks the shard it is given, so models/ never imports this layer."""
        return ulysses_attention(attention, self)

    def local(self, per_row: torch.Tensor, pad_value=0) -> torch.Tensor:
        """This rank's slice of a per-row tensor [S, ...], padded to local_len rows."""
        part = per_row[self.start:self.valid_stop]
        missing = self.local_len - part.shape[0]
        if missing:
            pad = per_row.new_full((missing,) + tuple(per_row.shape[1:]), pad_value)
            part = torch.cat([part, pad])
        return part

    def gather_rows(self, local: torch.Tensor) -> torch.Tensor:
        """[B, L, C] from every rank -> [B, S, C] in row order (padding dropped)."""
        if self.world == 1:
            return local[:, : self.seq_len]
        parts = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)[:, : self.seq_len]

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on any: ranks agree before acting (e.g. Stop at a step boundary)."""
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())


def _rows_to_heads(x: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    """[B, L, H, D] own rows/all heads -> [B, S_pad, H/N, D] all rows/own heads."""
    if shard.world == 1:  # an all-to-all within a group of one is the identity: no copies
        return x
    b, l, h, d = x.shape
    n = shard.world
    send = x.reshape(b, l, n, h // n, d).permute(2, 0, 1, 3, 4).contiguous()  # [N(dest), B, L, H/N, D]
    recv = torch.empty_like(send)  # [N(src), B, L, H/N, D]
    dist.all_to_all_single(recv, send, group=shard.group)
    return recv.permute(1, 0, 2, 3, 4).reshape(b, n * l, h // n, d)


def _heads_to_rows(x: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    """[B, S_pad, H/N, D] -> [B, L, H, D]."""
    if shard.world == 1:
        return x
    b, s_pad, hn, d = x.shape
    n = shard.world
    send = x.reshape(b, n, s_pad // n, hn, d).permute(1, 0, 2, 3, 4).contiguous()  # [N(dest rows), B, L, H/N, D]
    recv = torch.empty_like(send)  # [N(src heads), B, L, H/N, D]
    dist.all_to_all_single(recv, send, group=shard.group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s_pad // n, n * hn, d)


def ulysses_attention(attention, shard: SequenceShard):
    """Wrap a [B, S, H, D] attention so it takes and returns this rank's rows [B, L, H, D]."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if q.shape[2] % shard.world:
            raise ValueError(f"{q.shape[2]} heads do not split over {shard.world} ranks.")
        q, k, v = (_rows_to_heads(t, shard) for t in (q, k, v))
        s = shard.seq_len
        if gate is None:
            out = attention(q[:, :s], k[:, :s], v[:, :s])
        else:  # learned VSA gates (FastH3) travel like q, k, v: per head, over all rows
            out = attention(q[:, :s], k[:, :s], v[:, :s], _rows_to_heads(gate, shard)[:, :s])
        if out.shape[1] != q.shape[1]:
            out = torch.cat([out, out.new_zeros((out.shape[0], q.shape[1] - s) + tuple(out.shape[2:]))], dim=1)
        return _heads_to_rows(out, shard)

    return attend


def alltoall_bytes_per_layer(seq_len: int, world: int, heads: int = 56, head_dim: int = 128,
                             bytes_per_elem: int = 2) -> int:
    """Bytes one rank sends per block: q, k, v out and the attention output back, (N-1)/N of each local tensor."""
    local = -(-seq_len // world) * heads * head_dim * bytes_per_elem
    return int(4 * local * (world - 1) / world)
