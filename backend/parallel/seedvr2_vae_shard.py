"""The SeedVR2 VAE over ranks: encode and decode with the single-rank time slices dealt round-robin and the causal
convs' carried frames passed between neighbouring ranks. Every rank computes exactly what the one-rank pass computes
for its slices (the same slice inputs, the same carried frames), so the result is the one-rank result bit for bit on
the CPU (on GPUs, up to the kernels' own run-to-run determinism).

Contracts (stated once here):
- Plan (`SlicePlan`): the slicing of `SeedVR2VAE.encode` / `decode` (vae.time_slices: frame 0 travels with the first
  `step`, then `step` per slice; encode 1 + 4 then 4 frames, decode 2 then 1 latent by default), slice j to rank
  j % world. Round k is slices kW .. kW + W - 1: each rank works on one slice at a time, so a rank's memory is one
  slice's activations plus the carried frames, as on one rank. The encode's frame spans are the decode's output spans
  (4 frames per latent), so a rank holds the same frames for the encode and for the colour fix after the decode.
- Exchange (`RankStream.extend`, called by every causal conv): on one rank, each conv keeps the last kernel - stride
  input frames of a slice for the next slice (the VAE's slice lengths always leave exactly that many). Here the rank of
  slice j sends them to the rank of slice j + 1 (r -> r + 1; the last rank -> rank 0, for its next round) and takes
  its own from the rank of slice j - 1. Where this rank's input at that conv has at least kernel - stride frames, what
  it sends is its own frames: send and receive go in one batch, every rank at once. A shorter input (one latent frame
  per rank at the latent-resolution convs) waits for its head first, whose end is part of what it sends on: a chain of
  messages, while the convs still run in parallel. Rank 0 receives the head of its next slice while it computes
  (posted with its own send, in every conv's order, which keeps NCCL's in-order matching). Only neighbours talk: a rank
  with no slice in the last round takes part in nothing there.
- Results: `encode_pieces` / `decode_pieces` yield this rank's slices in order; `gather_pieces` moves per-slice pieces
  (time on dim 0) to every rank (the DiT needs the whole condition) or to rank 0 (the output frames), one
  variable-split all_to_all_single per round written straight into the result (every rank joins every round).
- Devices: point-to-point through torch.distributed.batch_isend_irecv (NCCL, gloo); where gloo serves a CUDA tensor,
  on host copies (as seedvr2_window_shard.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from ..models.seedvr2.vae import LOGVAR_RANGE, time_slices
from ..models.seedvr2.vae_ops import DEFAULT_CHUNK_BYTES, CausalStream, TimeExtended
from .context import ParallelContext
from .seedvr2_window_shard import _host_staged

ENCODE_SLICE_FRAMES = 4  # SeedVR2VAE.encode's default slice: the same numbers as one rank
DECODE_SLICE_LATENTS = 1  # SeedVR2VAE.decode's default

Span = Tuple[int, int]


@dataclass(frozen=True)
class SlicePlan:
    """Time slices of one pass: `spans` in the input's time axis, `out_spans` what each slice produces (latent frames
    of an encode, frames of a decode), slice j on rank j % world."""

    spans: Tuple[Span, ...]
    out_spans: Tuple[Span, ...]
    world: int

    @property
    def count(self) -> int:
        return len(self.spans)

    @property
    def rounds(self) -> int:
        return -(-self.count // self.world)

    def owner(self, j: int) -> int:
        return j % self.world

    def slices_of(self, rank: int) -> Tuple[int, ...]:
        return tuple(range(rank, self.count, self.world))

    def round_slices(self, k: int) -> range:
        """Slices of round k; the i-th belongs to rank i."""
        return range(k * self.world, min(self.count, (k + 1) * self.world))


def encode_plan(frames: int, world: int, slice_frames: Optional[int] = ENCODE_SLICE_FRAMES,
                temporal_factor: int = 4) -> SlicePlan:
    """Slices of an encode of `frames` = 1 + tf*n frames (`slice_frames` a multiple of tf, or None: one slice)."""
    tf = temporal_factor
    if frames < 1 or (frames - 1) % tf:
        raise ValueError(f"SeedVR2 VAE encode needs {tf}n+1 frames, got {frames}")
    if slice_frames is not None and (slice_frames <= 0 or slice_frames % tf):
        raise ValueError(f"slice_frames must be a positive multiple of {tf} (or None), got {slice_frames}")
    spans = tuple(time_slices(frames, slice_frames))
    out = tuple((0 if a == 0 else (a - 1) // tf + 1, (b - 1) // tf + 1) for a, b in spans)
    return SlicePlan(spans, out, _world(world))


def decode_plan(latents: int, world: int, slice_latents: Optional[int] = DECODE_SLICE_LATENTS,
                temporal_factor: int = 4) -> SlicePlan:
    """Slices of a decode of `latents` latent frames (-> tf*(latents - 1) + 1 frames)."""
    tf = temporal_factor
    if latents < 1:
        raise ValueError(f"SeedVR2 VAE decode needs at least one latent frame, got {latents}")
    if slice_latents is not None and slice_latents <= 0:
        raise ValueError(f"slice_latents must be positive (or None), got {slice_latents}")
    spans = tuple(time_slices(latents, slice_latents))
    out = tuple((0 if a == 0 else tf * (a - 1) + 1, tf * (b - 1) + 1) for a, b in spans)
    return SlicePlan(spans, out, _world(world))


def _world(world: int) -> int:
    if world < 1:
        raise ValueError(f"the VAE over ranks needs at least one rank, got world={world}")
    return int(world)


class RankStream(CausalStream):
    """The CausalStream of one rank's slices of a `SlicePlan` (see the module docstring): `begin(j)` before slice j,
    `end()` after it, `finish()` after the last. With one rank it is the plain stream (carried frames kept in
    memory)."""

    def __init__(self, ctx: ParallelContext, plan: SlicePlan, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        super().__init__(chunk_bytes)
        if plan.world != ctx.world:
            raise ValueError(f"a plan for {plan.world} ranks cannot run on {ctx.world}")
        self.ctx, self.plan = ctx, plan
        self.slice = -1
        self._calls = 0  # causal convs run in this slice: the message tag (the same conv on both sides)
        self._sends: List[Tuple[_Batch, torch.Tensor]] = []  # this slice's sends (tensors kept alive)
        self._next: Dict[torch.nn.Module, Tuple[_Batch, torch.Tensor]] = {}  # rank 0: its next slice's heads

    def begin(self, j: int) -> None:
        if self.plan.owner(j) != self.ctx.rank or j <= self.slice:
            raise ValueError(f"rank {self.ctx.rank} cannot run slice {j} after slice {self.slice}")
        self.slice, self._calls = j, 0
        self.first = j == 0  # frame 0's copies in front; the temporal upsamplers drop frame 0's duplicate
        self.keep = j + 1 < self.plan.count  # a later slice takes this slice's leftover frames

    def end(self) -> None:
        """A slice is done: its last sends are waited for here. A send buffer is the (kernel - stride) frames a
        conv carries; at 2688x1536 one set over all full-resolution convs is ~30 GiB in bf16, so keeping a whole
        slice's sends (or two slices') alive ran rank 0 out of memory on an H200 (with its next round's heads on
        top). The wait costs no stall: the receiver is at most one conv behind (it needs these frames to go on)."""
        self._wait_sends(keep=0)

    def _wait_sends(self, keep: int) -> None:
        while len(self._sends) > keep:
            self._sends.pop(0)[0].wait()

    def finish(self) -> None:
        self.end()
        self.end()

    # -- one causal conv --------------------------------------------------------------------------------------------
    def extend(self, conv, x: torch.Tensor, pre) -> TimeExtended:
        if self.ctx.world == 1:
            return super().extend(conv, x, pre)
        tag = self._calls
        self._calls += 1
        carry = conv.kernel_size[0] - conv.stride[0]
        nh = conv.front if self.first else carry
        length = nh + x.shape[2]
        c0 = conv.frames_out(length) * conv.stride[0]  # first input frame the next slice needs
        send = self.keep and c0 < length
        if send and length - c0 != carry:  # cannot happen with the plans above; refuse rather than mismatch a message
            raise RuntimeError(f"a causal conv would carry {length - c0} frames instead of {carry}: the time slices "
                               f"of this VAE pass do not divide (input of {x.shape[2]} frames)")
        b, c, _, h, w = x.shape
        shape = (b, c, carry, h, w)
        rank, world = self.ctx.rank, self.ctx.world
        dst, src = (rank + 1) % world, (rank - 1) % world
        if self.first or carry == 0 or rank == 0:
            # no head, or (rank 0) the one the last rank sent during the previous round
            head = self._take(conv, x) if not self.first and carry else None
            frames = TimeExtended(x, head, nh, pre)
            expect = rank == 0 and carry > 0 and self.slice + world < self.plan.count
            batch, buf = self._exchange(frames.gather(c0, length, self.chunk_bytes) if send else None, dst,
                                        shape if expect else None, src, x, tag)
            if expect:
                self._next[conv] = (batch, buf)
            return frames
        if not send or c0 >= nh:  # what goes on is this rank's own frames: send and receive at once
            out = TimeExtended(x, None, nh, pre).gather(c0, length, self.chunk_bytes) if send else None
            batch, buf = self._exchange(out, dst, shape, src, x, tag)
            return TimeExtended(x, self._arrived(batch, buf, x), nh, pre)
        batch, buf = self._exchange(None, dst, shape, src, x, tag)  # the head first: part of it goes on
        frames = TimeExtended(x, self._arrived(batch, buf, x), nh, pre)
        self._exchange(frames.gather(c0, length, self.chunk_bytes), dst, None, src, x, tag)
        return frames

    def _take(self, conv, like: torch.Tensor) -> torch.Tensor:
        pending = self._next.pop(conv, None)
        if pending is None:
            raise RuntimeError("rank 0 has no carried frames from the previous round for this conv")
        return self._arrived(*pending, like)

    def _arrived(self, batch: "_Batch", buf: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        batch.wait()
        device = like.device
        return buf if buf.device == device else buf.to(device)

    def _exchange(self, out: Optional[torch.Tensor], dst: int, shape, src: int, like: torch.Tensor, tag: int):
        """One batch: isend `out` to rank dst (if any) and irecv a `shape` tensor from rank src (if any)."""
        import torch.distributed as dist

        group = self.ctx.group
        staged = _host_staged(group, like.device)
        ops, buf = [], None
        if out is not None:
            out = out.cpu() if staged else out.contiguous()
            ops.append(dist.P2POp(dist.isend, out, _global(group, dst), group, tag))
        if shape is not None:
            buf = torch.empty(shape, dtype=like.dtype, device="cpu" if staged else like.device)
            ops.append(dist.P2POp(dist.irecv, buf, _global(group, src), group, tag))
        if not ops:
            return _Batch([]), None
        self._wait_sends(keep=1)  # at most the previous conv's send in flight beside this one (memory, above)
        batch = _Batch(dist.batch_isend_irecv(ops))
        if out is not None:
            self._sends.append((batch, out))
        return batch, buf


class _Batch:
    """The works of one batch_isend_irecv, waited for once (gloo's receive work waits for another message when
    waited twice; NCCL's coalesced batch may be one work for all its ops)."""

    def __init__(self, works):
        self.works = [w for w in works if w is not None]

    def wait(self) -> None:
        works, self.works = self.works, []
        for w in works:
            w.wait()


def _global(group, rank: int) -> int:
    """The default group's rank of `rank` of `group` (P2POp takes global ranks)."""
    if group is None:
        return rank
    import torch.distributed as dist

    return dist.get_global_rank(group, rank)


# -- the passes -------------------------------------------------------------------------------------------------------

def _dtype(vae) -> torch.dtype:
    return vae.encoder.conv_in.weight.dtype


def _connect(ctx: ParallelContext, device: torch.device) -> None:
    """NCCL: batched point-to-point between some of the ranks needs the group's communicator, which the first
    collective creates with every rank; a 1-element all_reduce (every rank runs every pass) makes sure of it."""
    if ctx.world > 1 and device.type != "cpu" and not _host_staged(ctx.group, device):
        import torch.distributed as dist

        dist.all_reduce(torch.zeros(1, device=device), group=ctx.group)


def encode_pieces(vae, ctx: ParallelContext, plan: SlicePlan, source: Callable[[int], torch.Tensor],
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Tuple[int, Span, torch.Tensor, torch.Tensor]]:
    """This rank's slices of an encode: (j, latent span, mean, logvar) per slice j in order, each moment
    [B, 16, latents of the slice, H / 8, W / 8] (logvar clamped as SeedVR2VAE.encode). `source(j)`: slice j's frames
    [B, 3, frames, H, W] in [-1, 1] (asked for only this rank's slices). Every rank of ctx must run its part."""
    stream = RankStream(ctx, plan, chunk_bytes)
    cin = vae.config.in_channels
    _connect(ctx, vae.encoder.conv_in.weight.device)
    for j in plan.slices_of(ctx.rank):
        a, b = plan.spans[j]
        x = source(j)
        if x.ndim != 5 or x.shape[1] != cin or x.shape[2] != b - a:
            raise ValueError(f"slice {j} of the encode needs frames [B, {cin}, {b - a}, H, W], got {tuple(x.shape)}")
        stream.begin(j)
        moments = vae.encoder(x.to(_dtype(vae)), stream)
        stream.end()
        mean, logvar = moments.chunk(2, dim=1)
        yield j, plan.out_spans[j], mean, logvar.clamp(*LOGVAR_RANGE)
    stream.finish()


def decode_pieces(vae, ctx: ParallelContext, plan: SlicePlan, z: torch.Tensor,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Tuple[int, Span, torch.Tensor]]:
    """This rank's slices of a decode of z [B, 16, T, h, w] (unscaled; every rank may hold all of it, only its
    slices are read): (j, frame span, video [B, 3, frames of the slice, 8h, 8w]) per slice j in order."""
    cfg = vae.config
    if z.ndim != 5 or z.shape[1] != cfg.latent_channels or z.shape[2] != plan.spans[-1][1]:
        raise ValueError(f"the decode plan needs latents [B, {cfg.latent_channels}, {plan.spans[-1][1]}, h, w], got "
                         f"{tuple(z.shape)}")
    stream = RankStream(ctx, plan, chunk_bytes)
    _connect(ctx, vae.decoder.conv_in.weight.device)
    for j in plan.slices_of(ctx.rank):
        a, b = plan.spans[j]
        stream.begin(j)
        y = vae.decoder(z[:, :, a:b].to(_dtype(vae)), stream)
        stream.end()
        yield j, plan.out_spans[j], y
    stream.finish()


def gather_pieces(ctx: ParallelContext, plan: SlicePlan, counts: Sequence[int], pieces: Mapping[int, torch.Tensor],
                  empty: torch.Tensor, to_all: bool = False) -> Optional[torch.Tensor]:
    """Per-slice pieces (pieces[j] = [counts[j], ...] for this rank's slices j) -> [sum(counts), ...] in slice order,
    on every rank (`to_all`) or on rank 0 (None elsewhere). `empty`: a [0, ...] tensor of the rows' trailing shape,
    dtype and device (what a rank with no slice in a round sends). One all_to_all_single per round."""
    if len(counts) != plan.count:
        raise ValueError(f"{len(counts)} counts for {plan.count} slices")
    rank, world = ctx.rank, ctx.world
    for j in plan.slices_of(rank):
        if pieces[j].shape[0] != counts[j] or pieces[j].shape[1:] != empty.shape[1:]:
            raise ValueError(f"slice {j}: piece {tuple(pieces[j].shape)}, expected {counts[j]} rows of "
                             f"{tuple(empty.shape[1:])}")
    receiving = to_all or ctx.is_driver
    total = sum(counts)
    out = empty.new_empty((total,) + tuple(empty.shape[1:])) if receiving else None
    if world == 1:
        at = 0
        for j in range(plan.count):
            out[at:at + counts[j]] = pieces[j]
            at += counts[j]
        return out
    at = 0
    for k in range(plan.rounds):
        js = plan.round_slices(k)
        sizes = [counts[j] for j in js] + [0] * (world - len(js))  # rank i sends slice kW + i
        mine = k * world + rank
        piece = pieces[mine] if mine < plan.count else empty
        n = piece.shape[0]
        if to_all:
            send, send_splits = torch.cat([piece] * world), [n] * world
        else:
            send, send_splits = piece, [n] + [0] * (world - 1)
        recv_splits = sizes if receiving else [0] * world
        dest = out[at:at + sum(sizes)] if receiving else empty
        _all_to_all_into(dest, send, send_splits, recv_splits, ctx.group)
        at += sum(sizes)
    return out


def _all_to_all_into(dest: torch.Tensor, send: torch.Tensor, send_splits, recv_splits, group) -> None:
    """all_to_all_single along dim 0 into the contiguous `dest`; host copies where gloo serves the device."""
    import torch.distributed as dist

    if _host_staged(group, send.device):
        recv = torch.empty(dest.shape, dtype=dest.dtype)
        dist.all_to_all_single(recv, send.cpu(), list(recv_splits), list(send_splits), group=group)
        dest.copy_(recv)
    else:
        dist.all_to_all_single(dest, send.contiguous(), list(recv_splits), list(send_splits), group=group)


# -- whole passes (tests, benches) ------------------------------------------------------------------------------------

@torch.no_grad()
def encode(vae, ctx: ParallelContext, video: torch.Tensor, slice_frames: Optional[int] = ENCODE_SLICE_FRAMES,
           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Tuple[torch.Tensor, torch.Tensor]:
    """SeedVR2VAE.encode over the ranks of ctx: (mean, logvar) [B, 16, T, H / 8, W / 8] on every rank."""
    cfg = vae.config
    if video.ndim != 5 or video.shape[1] != cfg.in_channels:
        raise ValueError(f"SeedVR2 VAE encode needs video [B, {cfg.in_channels}, frames, H, W], got "
                         f"{tuple(video.shape)}")
    plan = encode_plan(video.shape[2], ctx.world, slice_frames, cfg.temporal_factor)
    pieces, tail = {}, None
    for j, _, mean, logvar in encode_pieces(vae, ctx, plan, lambda j: video[:, :, slice(*plan.spans[j])],
                                            chunk_bytes):
        pieces[j] = torch.cat([mean, logvar], 1).permute(2, 0, 1, 3, 4).contiguous()  # time first
    b, _, _, h, w = video.shape
    s = cfg.spatial_factor
    empty = torch.empty((0, b, 2 * cfg.latent_channels, h // s, w // s), dtype=_dtype(vae), device=video.device)
    counts = [q - p for p, q in plan.out_spans]
    moments = gather_pieces(ctx, plan, counts, pieces, empty, to_all=True).permute(1, 2, 0, 3, 4)
    mean, logvar = moments.chunk(2, dim=1)
    return mean, logvar


@torch.no_grad()
def decode(vae, ctx: ParallelContext, z: torch.Tensor, slice_latents: Optional[int] = DECODE_SLICE_LATENTS,
           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Optional[torch.Tensor]:
    """SeedVR2VAE.decode over the ranks of ctx: video [B, 3, 4T - 3, 8h, 8w] on rank 0, None on the others."""
    cfg = vae.config
    if z.ndim != 5 or z.shape[1] != cfg.latent_channels or z.shape[2] < 1:
        raise ValueError(f"SeedVR2 VAE decode needs latents [B, {cfg.latent_channels}, T >= 1, h, w], got "
                         f"{tuple(z.shape)}")
    plan = decode_plan(z.shape[2], ctx.world, slice_latents, cfg.temporal_factor)
    pieces = {j: y.permute(2, 0, 1, 3, 4).contiguous() for j, _, y in decode_pieces(vae, ctx, plan, z, chunk_bytes)}
    b, _, _, h, w = z.shape
    s = cfg.spatial_factor
    empty = torch.empty((0, b, cfg.out_channels, h * s, w * s), dtype=_dtype(vae), device=z.device)
    counts = [q - p for p, q in plan.out_spans]
    video = gather_pieces(ctx, plan, counts, pieces, empty)
    return None if video is None else video.permute(1, 2, 0, 3, 4)
