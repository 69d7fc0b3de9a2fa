"""Opt-in spatial tiling of the SeedVR2 VAE: encode / decode frames too large for one GPU in overlapping tiles.

Where the memory is: the encoder's first blocks and the decoder's last ones work at 2x-8x the latent grid (128-512
channels per pixel, plus the frames each causal conv carries to the next time slice); what works at the latent grid
itself (64 times fewer positions) is small. So only the parts above the latent grid are tiled:
- decode: conv_in, the mid block (resnet, attention over the frame, resnet) and up block 0's resnets run on whole
  latent frames (time-sliced) into one feature tensor [B, C, T, h, w]; then each tile runs the rest (up block 0's
  upsampler, the other up blocks, norm_out, conv_out) on its crop of it, time-sliced with its own causal stream,
  blended per output pixel;
- encode: each tile runs conv_in and the down blocks but the last (time-sliced, its own causal stream), blended on
  the latent grid into one feature tensor; then the last down block, the mid block and norm_out + conv_out run on
  whole frames.
The attention and the latent-grid GroupNorms therefore see the whole frame, as in the untiled pass. What differs is
the tiled part: a tile's border sees zero padding where the frame goes on (neighbouring tiles share ``overlap``
pixels, blended by a cosine ramp ``RAMP`` of the overlap wide, centred in it: the outer quarter of each tile's side of
an overlap, where the padding is felt, gets weight 0; every position's weights sum to 1), and its GroupNorm
statistics. Measured on the tiny VAE, the statistics are nearly all of the difference (given the whole frame's
statistics at every tiled GroupNorm, tiled = whole within 1e-3 rel at 32-64 px overlaps): so by default (``frame_stats``) a first pass
over the tiles takes each tile's per-(frame, group) moments over the part of the frame it owns and sums them into
frame statistics, which the second pass normalises with. They are not the whole pass's (the first pass normalised
with the tiles' own statistics upstream); exact ones would need all tiles to advance layer by layer together, i.e.
the whole frame's activations and causal carries held at once, which is what tiling avoids (more passes do not
converge: measured). This is NOT the whole pass: the difference is a measured, stated tolerance
(tests/pipelines/seedvr2/test_seedvr2_vae_tiling.py; released size: bench/seedvr2.py vae_tiling), never the
default of the pipeline.
One tile covering the frame runs the plain pass (bitwise).

Tile size and overlap are in video pixels (the decoder's output, the encoder's input), multiples of the VAE's
spatial factor (8): every tile starts on the frame's latent grid, so the tiled convs see the frame's pixel phases.
A frame side is cut into the fewest tiles of at most ``tile`` pixels, all of the smallest size that keeps the overlap.

Memory besides one tile's pass (activations scale with the tile, not the frame): the latent-grid feature tensor in
the VAE dtype (B x C x T x h x w, C = 512 on the released VAE: 1/8 of a 3-channel video of the same frames in bytes),
the whole-frame latent-grid work of one time slice, and an fp32 band one tile row tall and the frame wide where a
row of tiles is summed before each row of the result is written once (decode: 3 channels at pixel resolution;
encode: C channels at the latent grid). Time: ``frame_stats`` runs the tiled part twice.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from .vae import LOGVAR_RANGE
from .vae_layout import empty_like_layout
from .vae_ops import DEFAULT_CHUNK_BYTES, CausalStream, FrameGroupNorm, norm_kernels_for

RAMP = 0.5  # the cosine ramp's width as a fraction of the narrowest overlap (centred in each overlap)

Span = Tuple[int, int]


def default_overlap(tile: int, factor: int = 8) -> int:
    """The overlap used when none is given: 64 pixels (the blend then drops the 16 px of each tile's side of an
    overlap where zero padding is felt most; measured enough on the tiny VAE, whose depth is the released one's),
    at most a quarter of the tile, a multiple of `factor`."""
    return max(factor, min(64, tile // 4) // factor * factor)


def check_tile(tile: int, overlap: int, factor: int = 8) -> None:
    """Raises ValueError naming the values unless 0 <= overlap < tile, both multiples of `factor`."""
    if tile <= 0 or tile % factor or overlap < 0 or overlap % factor or overlap >= tile:
        raise ValueError(f"VAE tile {tile} px with overlap {overlap} px: both must be multiples of {factor}, the "
                         "overlap smaller than the tile")


def tile_spans(length: int, tile: int, overlap: int) -> List[Span]:
    """[start, stop) of the tiles along one axis of `length` cells: the fewest tiles of at most `tile` cells sharing
    at least `overlap` cells with their neighbours, all of the smallest size that does it (no wasted overlap),
    spread evenly (the first at 0, the last ending at `length`)."""
    if length <= tile:
        return [(0, length)]
    n = math.ceil((length - overlap) / (tile - overlap))
    size = -(-(length + (n - 1) * overlap) // n)  # n tiles of `size` reach `length` with `overlap` between them
    # starts floor(i * (length - size) / (n - 1)): every step <= ceil(mean step) <= size - overlap
    return [(i * (length - size) // (n - 1), i * (length - size) // (n - 1) + size) for i in range(n)]


def _rise(cells: torch.Tensor, centre: float, width: float) -> torch.Tensor:
    """0 before the ramp, 1 after it, a half cosine in between (at cell centres)."""
    if width <= 0:
        return (cells + 0.5 >= centre).double()
    u = ((cells + 0.5 - (centre - width / 2)) / width).clamp(0, 1)
    return 0.5 - 0.5 * torch.cos(math.pi * u)


def axis_weights(spans: List[Span], scale: int = 1, ramp: float = RAMP) -> List[torch.Tensor]:
    """Per tile, the float32 blend weight of each of its cells along one axis; `spans` on the latent grid, weights
    `scale` times finer (decode blends output pixels). Weight of tile i = R(i-1) - R(i), R(k) the rise across the cut
    between tiles k and k+1 (R(-1) = 1, R(n-1) = 0): the weights telescope to 1 at every cell and each tile's weight
    is 0 outside its span. Every cut's ramp has the same width (`ramp` x the narrowest overlap) and is centred in its
    overlap, so the rises are ordered and no weight is negative."""
    spans = [(a * scale, b * scale) for a, b in spans]
    n = len(spans)
    if n == 1:
        return [torch.ones(spans[0][1] - spans[0][0], dtype=torch.float32)]
    width = min(spans[i][1] - spans[i + 1][0] for i in range(n - 1)) * ramp
    centres = [(spans[i + 1][0] + spans[i][1]) / 2 for i in range(n - 1)]
    out = []
    for i, (a, b) in enumerate(spans):
        cells = torch.arange(a, b, dtype=torch.float64)
        left = _rise(cells, centres[i - 1], width) if i > 0 else torch.ones_like(cells)
        right = _rise(cells, centres[i], width) if i < n - 1 else torch.zeros_like(cells)
        out.append((left - right).float())
    return out


class _RowBlender:
    """Sums weighted tiles into `out` [B, C, T, H, W] (any dtype) through an fp32 band one tile row tall: tiles
    come row by row; when a row of tiles is done, the rows of `out` no later tile reaches are written (once, rounded
    once) and the overlap moves to the top of the band."""

    def __init__(self, out: torch.Tensor, rows: List[Span], cols: List[Span], scale: int, ramp: float):
        self.out, self.rows, self.cols, self.scale = out, rows, cols, scale
        self.wr, self.wc = axis_weights(rows, scale, ramp), axis_weights(cols, scale, ramp)
        height = (rows[0][1] - rows[0][0]) * scale  # all tiles of a plan have the same size
        self.band = torch.zeros((*out.shape[:3], height, out.shape[4]), dtype=torch.float32, device=out.device)
        self.top = 0  # row of `out` at band[..., 0, :]

    def weight(self, i: int, j: int) -> torch.Tensor:
        dev = self.out.device
        return self.wr[i].to(dev)[:, None] * self.wc[j].to(dev)[None, :]

    def add(self, i: int, j: int, t0: int, part: torch.Tensor, weight: torch.Tensor) -> None:
        """Tile (i, j)'s result for frames [t0, t0 + n) of `out`."""
        s = self.scale
        r0, c0 = self.rows[i][0] * s - self.top, self.cols[j][0] * s
        dst = self.band[:, :, t0:t0 + part.shape[2], r0:r0 + part.shape[3], c0:c0 + part.shape[4]]
        dst.addcmul_(part, weight)  # part may be a view of what the caller keeps: never scaled in place

    def row_done(self, i: int) -> None:
        s, band = self.scale, self.band
        if i + 1 == len(self.rows):
            self.out[..., self.top:, :] = band[..., :self.out.shape[3] - self.top, :]
            return
        nxt = self.rows[i + 1][0] * s
        self.out[..., self.top:nxt, :] = band[..., :nxt - self.top, :]
        carried = band[..., nxt - self.top:self.rows[i][1] * s - self.top, :].clone()
        band.zero_()
        band[..., :carried.shape[3], :] = carried
        self.top = nxt


def _sliced(total: int, step: Optional[int], chunk_bytes: int) -> Iterator[Tuple[int, int, CausalStream]]:
    """(a, b, stream) of the VAE's causal time slices of `total` frames (as vae.py cuts them: [0, 1 + step), then
    runs of `step`; None: one slice), one causal stream through them."""
    cuts = [0, total] if step is None or total <= 1 + step else [0, *range(1 + step, total, step), total]
    stream = CausalStream(chunk_bytes)
    for a, b in zip(cuts, cuts[1:]):
        stream.keep = b < total
        yield a, b, stream
        stream.first = False


def _owners(spans: List[Span], scale: int) -> List[Span]:
    """Per tile, the cells it owns at `scale` x the latent grid: cut at the middle of each overlap (a partition)."""
    cuts = [0] + [(spans[i + 1][0] + spans[i][1]) * scale // 2 for i in range(len(spans) - 1)]
    cuts.append(spans[-1][1] * scale)
    return [(cuts[i] - a * scale, cuts[i + 1] - a * scale) for i, (a, _) in enumerate(spans)]


class _Norms:
    """The GroupNorms of a tiled part. Without frame statistics: each tile's own (what FrameGroupNorm takes). With:
    a collecting pass runs every tile (with its own statistics) and sums, per norm and time slice, each tile's moments
    over the cells it owns (a partition of the frame, cut in the middle of each overlap) into frame statistics; the
    final pass normalises with those."""

    def __init__(self, rows: List[Span], cols: List[Span], chunk_bytes: int):
        self.rows, self.cols, self.chunk_bytes = rows, cols, chunk_bytes
        self.using: Optional[dict] = None  # (norm, slice start) -> [count, sum, sum of squares], float64 [B, G, t]
        self.taking: Optional[dict] = None
        self.tile = (0, 0)
        self.start = 0

    def next_pass(self, collect: bool) -> None:
        """Start a pass: a collecting one, or the final one (normalising with what the collecting pass took)."""
        if self.taking is not None:
            self.using = self.taking
        self.taking = {} if collect else None

    def at(self, i: int, j: int, start: int) -> "_Norms":
        self.tile, self.start = (i, j), start
        return self

    def __call__(self, norm, x: torch.Tensor, silu: bool = True) -> FrameGroupNorm:
        key = (norm, self.start)
        stats = None
        if self.using is not None:
            count, total, squares = self.using[key]
            mean = total / count
            var = (squares / count - mean * mean).clamp_min_(0)
            stats = mean.float(), (var + norm.eps).rsqrt().float()
        fn = FrameGroupNorm(norm, x, self.chunk_bytes, silu, stats)
        if self.taking is not None:
            self._collect(key, norm.num_groups, x)
        return fn

    def _collect(self, key, groups: int, x: torch.Tensor) -> None:
        b, c, t, h, w = x.shape
        i, j = self.tile
        scale = h // (self.rows[i][1] - self.rows[i][0])
        r0, r1 = _owners(self.rows, scale)[i]
        c0, c1 = _owners(self.cols, scale)[j]
        own = x[:, :, :, r0:r1, c0:c1]
        cg = c // groups
        count = cg * (r1 - r0) * (c1 - c0)
        if norm_kernels_for(own):  # one read of the owned view by the statistics kernel, moments merged in fp64
            from .vae_kernels import group_moments

            _, mean, m2 = group_moments(own, groups)
            total, squares = mean * count, m2 + mean * mean * count
        else:
            total = torch.zeros((b, groups, t), dtype=torch.float64, device=x.device)
            squares = torch.zeros_like(total)
            step = max(1, self.chunk_bytes // max(b * cg * (r1 - r0) * (c1 - c0) * 8, 1))
            for g0 in range(0, groups, step):  # fp64 sums over bounded group chunks, one frame at a time
                g1 = min(groups, g0 + step)
                for f in range(t):
                    part = own[:, g0 * cg:g1 * cg, f].double().reshape(b, g1 - g0, -1)
                    total[:, g0:g1, f] = part.sum(-1)
                    squares[:, g0:g1, f] = part.square().sum(-1)
        if key in self.taking:
            acc = self.taking[key]
            acc[0] += count
            acc[1] += total
            acc[2] += squares
        else:
            self.taking[key] = [count, total, squares]


def _resnet(block, x: torch.Tensor, stream: CausalStream, norms: _Norms) -> torch.Tensor:
    """vae.ResnetBlock.forward with its GroupNorms from `norms`."""
    h = block.conv1(x, stream, norms(block.norm1, x))
    h = block.conv2(h, stream, norms(block.norm2, h))
    skip = x if block.conv_shortcut is None else block.conv_shortcut(x, stream)
    return h.add_(skip)


def _blocks(blocks, x: torch.Tensor, stream: CausalStream, norms: _Norms, resnets: bool = True) -> torch.Tensor:
    """vae.Block.forward of each block in turn (resnets, then the down / up sampler) with `norms`; `resnets` False:
    the first block's sampler only (its resnets ran on whole frames)."""
    for k, block in enumerate(blocks):
        for resnet in block.resnets if resnets or k else ():
            x = _resnet(resnet, x, stream, norms)
        for sampler in block.downsamplers or block.upsamplers or ():
            x = sampler(x, stream)
    return x


def _norm_out(module, x: torch.Tensor, stream: CausalStream, norms: Optional[_Norms] = None) -> torch.Tensor:
    pre = norms(module.conv_norm_out, x) if norms is not None else FrameGroupNorm(
        module.conv_norm_out, x, stream.chunk_bytes, silu=True)
    return module.conv_out(x, stream, pre)


def _plan(h: int, w: int, tile: int, overlap: Optional[int], factor: int) -> Tuple[List[Span], List[Span]]:
    """Latent-grid spans of the rows and columns of tiles for a latent frame h x w."""
    if overlap is None:
        overlap = default_overlap(tile, factor)
    check_tile(tile, overlap, factor)
    return tile_spans(h, tile // factor, overlap // factor), tile_spans(w, tile // factor, overlap // factor)


@torch.no_grad()
def tiled_encode(vae, video: torch.Tensor, tile: int, overlap: Optional[int] = None, slice_frames: Optional[int] = 4,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, frame_stats: bool = True, ramp: float = RAMP,
                 force: bool = False, check: Optional[Callable[[], None]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """`vae.encode` of video [B, 3, F, H, W] (F = 4n+1; H, W multiples of 8) with the blocks above the latent grid
    run in tiles of at most `tile` x `tile` pixels sharing `overlap` (default: default_overlap(tile)); `frame_stats`:
    their GroupNorms use frame statistics from a first pass (see the module docstring). Same (mean, logvar) shapes
    and dtype as vae.encode; one tile covering the frame is vae.encode itself (`force`: the tiled path anyway)."""
    cfg, enc = vae.config, vae.encoder
    f, tf = cfg.spatial_factor, cfg.temporal_factor
    if video.ndim != 5 or video.shape[1] != cfg.in_channels or (video.shape[2] - 1) % tf:
        raise ValueError(f"SeedVR2 VAE encode needs video [B, {cfg.in_channels}, {tf}n+1 frames, H, W], "
                         f"got {tuple(video.shape)}")
    if slice_frames is not None and (slice_frames <= 0 or slice_frames % tf):
        raise ValueError(f"slice_frames must be a positive multiple of {tf} (or None), got {slice_frames}")
    b, _, frames, hh, ww = video.shape
    if hh % f or ww % f:
        raise ValueError(f"tiled VAE encode needs H and W multiples of {f}, got {hh}x{ww}")
    h, w = hh // f, ww // f
    rows, cols = _plan(h, w, tile, overlap, f)
    if len(rows) == len(cols) == 1 and not force:
        return vae.encode(video, slice_frames, chunk_bytes, check)
    dtype, fmt = vae._dtype(), vae.pass_format(video)
    t = (frames - 1) // tf + 1
    feats = torch.empty((b, cfg.block_channels[-2], t, h, w), dtype=dtype, device=video.device, memory_format=fmt)
    norms = _Norms(rows, cols, chunk_bytes)
    for collect in (True, False) if frame_stats else (False,):
        norms.next_pass(collect)
        blend = None if collect else _RowBlender(feats, rows, cols, 1, ramp)
        for i, (r0, r1) in enumerate(rows):
            for j, (c0, c1) in enumerate(cols):
                if check is not None:  # between tiles (`check`: a Stop check that raises)
                    check()
                weight = blend.weight(i, j) if blend is not None else None
                part = video[:, :, :, r0 * f:r1 * f, c0 * f:c1 * f]
                lat = 0
                for a, e, stream in _sliced(frames, slice_frames, chunk_bytes):
                    # each piece a dense tensor in the pass's layout: the convs' fast forms (in-place band
                    # writes need a frame's rows contiguous, which a crop's are not)
                    x = enc.conv_in(part[:, :, a:e].to(dtype).contiguous(memory_format=fmt), stream)
                    x = _blocks(enc.down_blocks[:-1], x, stream, norms.at(i, j, a))
                    if blend is not None:
                        blend.add(i, j, lat, x, weight)
                    lat += x.shape[2]
                    del x
            if blend is not None:
                blend.row_done(i)
        del blend
    del norms
    moments = torch.empty((b, 2 * cfg.latent_channels, t, h, w), dtype=dtype, device=video.device)
    for a, e, stream in _sliced(t, None if slice_frames is None else slice_frames // tf, chunk_bytes):
        x = enc.down_blocks[-1](feats[:, :, a:e], stream)
        moments[:, :, a:e] = _norm_out(enc, enc.mid_block(x, stream), stream)
    mean, logvar = moments.chunk(2, dim=1)
    return mean, logvar.clamp(*LOGVAR_RANGE)


@torch.no_grad()
def tiled_decode(vae, z: torch.Tensor, tile: int, overlap: Optional[int] = None, slice_latents: Optional[int] = 1,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, frame_stats: bool = True, ramp: float = RAMP,
                 force: bool = False, check: Optional[Callable[[], None]] = None) -> torch.Tensor:
    """`vae.decode` of latents z [B, 16, T, h, w] with the blocks above the latent grid run in tiles of at most
    `tile` x `tile` output pixels sharing `overlap` (default: default_overlap(tile)), blended per output pixel;
    `frame_stats`: their GroupNorms use frame statistics from a first pass (see the module docstring). Same shape and
    dtype as vae.decode; one tile covering the frame is vae.decode itself (`force`: the tiled path anyway)."""
    cfg, dec = vae.config, vae.decoder
    if z.ndim != 5 or z.shape[1] != cfg.latent_channels or z.shape[2] < 1:
        raise ValueError(f"SeedVR2 VAE decode needs latents [B, {cfg.latent_channels}, T >= 1, h, w], "
                         f"got {tuple(z.shape)}")
    if slice_latents is not None and slice_latents <= 0:
        raise ValueError(f"slice_latents must be positive (or None), got {slice_latents}")
    f, tf = cfg.spatial_factor, cfg.temporal_factor
    b, _, t, h, w = z.shape
    rows, cols = _plan(h, w, tile, overlap, f)
    if len(rows) == len(cols) == 1 and not force:
        return vae.decode(z, slice_latents, chunk_bytes, check)
    fmt = vae.pass_format(z)
    z = z.to(vae._dtype()).contiguous(memory_format=fmt)
    feats = None
    for a, e, stream in _sliced(t, slice_latents, chunk_bytes):
        x = dec.mid_block(dec.conv_in(z[:, :, a:e], stream), stream)
        for resnet in dec.up_blocks[0].resnets:
            x = resnet(x, stream)
        if feats is None:
            feats = empty_like_layout(x, (b, x.shape[1], t, h, w))
        feats[:, :, a:e] = x
        del x
    out = z.new_empty((b, cfg.out_channels, tf * (t - 1) + 1, h * f, w * f))
    norms = _Norms(rows, cols, chunk_bytes)
    for collect in (True, False) if frame_stats else (False,):
        norms.next_pass(collect)
        blend = None if collect else _RowBlender(out, rows, cols, f, ramp)
        for i, (r0, r1) in enumerate(rows):
            for j, (c0, c1) in enumerate(cols):
                if check is not None:  # between tiles (`check`: a Stop check that raises)
                    check()
                weight = blend.weight(i, j) if blend is not None else None
                pos = 0
                for a, e, stream in _sliced(t, slice_latents, chunk_bytes):
                    crop = feats[:, :, a:e, r0:r1, c0:c1].contiguous(memory_format=fmt)  # as encode's pieces
                    x = _blocks(dec.up_blocks, crop, stream, norms.at(i, j, a), resnets=False)
                    del crop
                    if blend is None:  # collecting: norm_out's statistics are all that is left to take
                        norms(dec.conv_norm_out, x)
                        del x
                        continue
                    y = _norm_out(dec, x, stream, norms)
                    del x
                    blend.add(i, j, pos, y, weight)
                    pos += y.shape[2]
                    del y
            if blend is not None:
                blend.row_done(i)
        del blend
    return out
