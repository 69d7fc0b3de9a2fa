"""Triton kernels of the SeedVR2 VAE's per-frame GroupNorm: the statistics in one read of the activation, and the
normalisation (+ SiLU) in one read and one write, straight into the buffer the next conv reads (its zero-padded,
time-extended input), so no fp32 copy of an activation is ever made. Also the row softmax of the mid block's
attention (``softmax_rows``: fp32 scores in, low-precision probabilities out; vae_ops.py runs the attention as
two GEMMs around it where no fused SDPA kernel takes its 512-wide head), and ``copy_rows``: copies between
channels-last views whose rows are contiguous runs (a band's carried frames and plain inputs), where torch's copy
takes its generic strided kernel.

The torch path in vae_ops.py (``FrameGroupNorm``) is the reference: per (batch, group, frame) fp32 mean and
1 / sqrt(var + eps) (population variance), then ``((x - mean) * rstd) * weight + bias`` in fp32, SiLU, one rounding
to the output dtype. The kernels compute the same formula in fp32; they differ from it only by summation order in the
statistics and by fused multiply-adds (tests/pipelines/seedvr2/test_seedvr2_vae_kernels.py bounds both).

Contracts: x / part / out are 5-D [B, C, T, H, W] tensors of any strides (views of bands and of padded buffers);
mean and rstd are fp32 [B, G, T_all], contiguous; weight and bias fp32 [C]. Offsets are int64 (a decoder activation
of one slice is 128 x 6 x 1536 x 2688 = 3.2e9 elements).

Two forms of each kernel, chosen by the tensor read: channel-major (NCDHW: a program walks one channel's pixels) and
channels-last (``channels_last_3d``, channel stride 1: a program holds a tile of pixels x all channels, so every
load and store is a run of consecutive channels). Either form is correct on any strides; the choice is speed only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .vae_layout import is_channels_last

STATS_BLOCK = 2048
APPLY_BLOCK = 1024
STATS_SPLITS_MAX = 64  # programs per (batch, group, frame): enough to fill the GPU for a handful of frames
STATS_SPLITS_MAX_CL = 256  # programs per (batch, frame) in the channels-last form (it holds every group at once)


@triton.jit
def _stats_partial(x_ptr, part_ptr, C, T, H, W, G, s_b, s_c, s_t, s_h, s_w, per_split,
                   BLOCK: tl.constexpr):
    # One program: a run of `per_split` elements of one (batch, group, frame); writes its (count, mean, M2), each
    # block's moments merged into the running ones by Chan's rule (no large-sum cancellation).
    bgt = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1).to(tl.int64)
    t = bgt % T
    g = (bgt // T) % G
    b = bgt // (T * G)
    cg = C // G
    hw = H * W
    total = cg * hw
    start = split * per_split
    stop = tl.minimum(start + per_split, total)
    base = x_ptr + b * s_b + g * cg * s_c + t * s_t
    n_acc = 0.0
    mean_acc = 0.0
    m2_acc = 0.0
    for i0 in range(start, stop, BLOCK):
        offs = i0 + tl.arange(0, BLOCK).to(tl.int64)
        mask = offs < stop
        c = offs // hw
        p = offs % hw
        ptr = base + c * s_c + (p // W) * s_h + (p % W) * s_w
        v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        n_b = tl.sum(mask.to(tl.float32), axis=0)
        mean_b = tl.sum(v, axis=0) / n_b
        d = tl.where(mask, v - mean_b, 0.0)
        m2_b = tl.sum(d * d, axis=0)
        n_new = n_acc + n_b
        delta = mean_b - mean_acc
        mean_acc = mean_acc + delta * (n_b / n_new)
        m2_acc = m2_acc + m2_b + delta * delta * (n_acc * n_b / n_new)
        n_acc = n_new
    out = part_ptr + (bgt * tl.num_programs(1) + split) * 3
    tl.store(out, n_acc)
    tl.store(out + 1, mean_acc)
    tl.store(out + 2, m2_acc)


@triton.jit
def _stats_partial_cl(x_ptr, part_ptr, C, T, H, W, s_b, s_c, s_t, s_h, s_w, per_split,
                      BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # One program: a run of `per_split` pixels of one (batch, frame), all channels at once; writes each channel's
    # (count, mean, M2) over its pixels. Each thread keeps running sums of (x - K) and (x - K)^2 over its own lanes
    # (no reduction inside the loop, so the loop runs at memory speed), K = the channel's value at the run's first
    # pixel: with the data shifted by a value of the data, the sum of squares does not cancel (a mean 300x the
    # spread keeps the variance; tests/pipelines/seedvr2/test_seedvr2_vae_kernels.py).
    bt = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1).to(tl.int64)
    t = bt % T
    b = bt // T
    hw = H * W
    start = split * per_split
    stop = tl.minimum(start + per_split, hw)
    ch = tl.arange(0, BLOCK_C).to(tl.int64)
    ch_ok = ch < C
    base = x_ptr + b * s_b + t * s_t + ch[None, :] * s_c
    shift = tl.load(base + (start // W) * s_h + (start % W) * s_w, mask=ch_ok[None, :], other=0.0).to(tl.float32)
    s1 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for p0 in range(start, stop, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P).to(tl.int64)
        mask = (p < stop)[:, None] & ch_ok[None, :]
        v = tl.load(base + (p // W)[:, None] * s_h + (p % W)[:, None] * s_w, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, v - shift, 0.0)
        s1 += d
        s2 += d * d
    n = (stop - start).to(tl.float32)
    t1 = tl.sum(s1, axis=0)
    m2 = tl.maximum(tl.sum(s2, axis=0) - t1 * t1 / n, 0.0)
    mean = tl.sum(shift, axis=0) + t1 / n
    out = part_ptr + ((bt * tl.num_programs(1) + split) * C + ch) * 3
    tl.store(out, tl.zeros((BLOCK_C,), dtype=tl.float32) + n, mask=ch_ok)
    tl.store(out + 1, mean, mask=ch_ok)
    tl.store(out + 2, m2, mask=ch_ok)


def _tile(c: int) -> tuple[int, int]:
    """(pixels, channels) of a channels-last tile: all channels (a power of two), about 4096 elements."""
    block_c = triton.next_power_of_2(c)
    return max(1, 4096 // block_c), block_c


def _splits(total: int, block: int, most: int) -> tuple[int, int]:
    """(programs, elements each) for a reduction over `total` elements in blocks of `block`."""
    splits = max(1, min(most, triton.cdiv(total, 8 * block)))
    per_split = triton.cdiv(triton.cdiv(total, splits), block) * block
    return triton.cdiv(total, per_split), per_split


def group_moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (batch, group, frame) float64 (count, mean, M2 = sum of squared deviations) of x [B, C, T, H, W], each
    [B, G, T]: what group_stats normalises with, and what moments of several pieces of a frame merge from (Chan's
    rule; the tiled VAE sums its tiles' owned parts this way)."""
    b, c, t, h, w = x.shape
    if is_channels_last(x):
        block_p, block_c = _tile(c)
        splits, per_split = _splits(h * w, block_p, STATS_SPLITS_MAX_CL)
        part = torch.empty((b * t, splits, c, 3), device=x.device, dtype=torch.float32)
        _stats_partial_cl[(b * t, splits)](x, part, c, t, h, w, *x.stride(), per_split,
                                           BLOCK_P=block_p, BLOCK_C=block_c, num_warps=8)
        # -> [B * G * T, splits * C // G, 3]: each (b, g, t)'s partial moments, one per (split, channel of g)
        part = part.view(b, t, splits, groups, c // groups, 3).permute(0, 3, 1, 2, 4, 5)
        part = part.reshape(b * groups * t, splits * (c // groups), 3)
    else:
        splits, per_split = _splits((c // groups) * h * w, STATS_BLOCK, STATS_SPLITS_MAX)
        part = torch.empty((b * groups * t, splits, 3), device=x.device, dtype=torch.float32)
        _stats_partial[(b * groups * t, splits)](x, part, c, t, h, w, groups, *x.stride(), per_split,
                                                  BLOCK=STATS_BLOCK, num_warps=8)
    # Chan's rule across the partial moments, in float64 (a few hundred numbers per (b, g, t)).
    n, mean, m2 = part.double().unbind(-1)
    count = n.sum(1)
    grand = (n * mean).sum(1) / count
    m2 = (m2 + n * (mean - grand[:, None]) ** 2).sum(1)
    return count.view(b, groups, t), grand.view(b, groups, t), m2.view(b, groups, t)


def group_stats(x: torch.Tensor, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, group, frame) fp32 mean and 1 / sqrt(var + eps) of x [B, C, T, H, W] (population variance)."""
    count, mean, m2 = group_moments(x, groups)
    return mean.float(), (m2 / count + eps).rsqrt().float()


@triton.jit
def _norm_apply(x_ptr, out_ptr, mean_ptr, rstd_ptr, w_ptr, bias_ptr, C, N, H, W, G, T_all, t0,
                sx_b, sx_c, sx_t, sx_h, sx_w, so_b, so_c, so_t, so_h, so_w,
                SILU: tl.constexpr, BLOCK: tl.constexpr):
    bcn = tl.program_id(1).to(tl.int64)
    n = bcn % N
    c = (bcn // N) % C
    b = bcn // (N * C)
    g = c // (C // G)
    stat = (b * G + g) * T_all + t0 + n
    mean = tl.load(mean_ptr + stat)
    rstd = tl.load(rstd_ptr + stat)
    weight = tl.load(w_ptr + c)
    bias = tl.load(bias_ptr + c)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < H * W
    r = offs // W
    q = offs % W
    v = tl.load(x_ptr + b * sx_b + c * sx_c + n * sx_t + r * sx_h + q * sx_w, mask=mask, other=0.0).to(tl.float32)
    y = ((v - mean) * rstd) * weight + bias
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(out_ptr + b * so_b + c * so_c + n * so_t + r * so_h + q * so_w, y.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _norm_apply_cl(x_ptr, out_ptr, mean_ptr, rstd_ptr, w_ptr, bias_ptr, C, N, H, W, G, T_all, t0,
                   sx_b, sx_c, sx_t, sx_h, sx_w, so_b, so_c, so_t, so_h, so_w,
                   SILU: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # One program: BLOCK_P pixels of one (batch, frame) x all channels.
    bn = tl.program_id(1).to(tl.int64)
    n = bn % N
    b = bn // N
    ch = tl.arange(0, BLOCK_C).to(tl.int64)
    ch_ok = ch < C
    stat = (b * G + ch // (C // G)) * T_all + t0 + n
    mean = tl.load(mean_ptr + stat, mask=ch_ok, other=0.0)
    rstd = tl.load(rstd_ptr + stat, mask=ch_ok, other=0.0)
    weight = tl.load(w_ptr + ch, mask=ch_ok, other=0.0)
    bias = tl.load(bias_ptr + ch, mask=ch_ok, other=0.0)
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P).to(tl.int64)
    mask = (p < H * W)[:, None] & ch_ok[None, :]
    r = (p // W)[:, None]
    q = (p % W)[:, None]
    v = tl.load(x_ptr + b * sx_b + n * sx_t + r * sx_h + q * sx_w + ch[None, :] * sx_c, mask=mask,
                other=0.0).to(tl.float32)
    y = ((v - mean[None, :]) * rstd[None, :]) * weight[None, :] + bias[None, :]
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(out_ptr + b * so_b + n * so_t + r * so_h + q * so_w + ch[None, :] * so_c,
             y.to(out_ptr.dtype.element_ty), mask=mask)


def norm_apply(part: torch.Tensor, t0: int, mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor, silu: bool, out: torch.Tensor) -> torch.Tensor:
    """out[...] = GroupNorm(+SiLU) of part = x[:, :, t0:t0 + n, rows, cols] with x's statistics (mean / rstd
    [B, G, T_all]); out has part's shape, any strides and dtype. Returns out."""
    b, c, n, h, w = part.shape
    if out.shape != part.shape:
        raise ValueError(f"norm_apply: out {tuple(out.shape)} is not part's shape {tuple(part.shape)}")
    if part.numel() == 0:
        return out
    groups, t_all = mean.shape[1], mean.shape[2]
    if is_channels_last(part):
        block_p, block_c = _tile(c)
        _norm_apply_cl[(triton.cdiv(h * w, block_p), b * n)](
            part, out, mean, rstd, weight, bias, c, n, h, w, groups, t_all, t0, *part.stride(), *out.stride(),
            SILU=silu, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4)
        return out
    grid = (triton.cdiv(h * w, APPLY_BLOCK), b * c * n)  # pixel blocks first: the grid's 2nd axis stops at 65535
    _norm_apply[grid](part, out, mean, rstd, weight, bias, c, n, h, w, groups, t_all, t0, *part.stride(),
                      *out.stride(), SILU=silu, BLOCK=APPLY_BLOCK, num_warps=4)
    return out


# ---- the mid block's attention: row softmax of fp32 scores into low-precision probabilities --------------------------

SOFTMAX_BLOCK = 2048
# A finite "minus infinity" (a lane that saw only padding never makes exp(-inf - -inf) = nan); a constexpr, as a
# compiled kernel reads no other globals (the interpreter does; tests/pipelines/seedvr2/test_seedvr2_vae_gpu.py
# compiles it).
_FAR_BELOW = tl.constexpr(-1.0e30)


@triton.jit
def _softmax_rows(s_ptr, p_ptr, N, s_row, p_row, scale, BLOCK: tl.constexpr, ROUND_BF16: tl.constexpr):
    # one program per row: a running max and sum per lane over the row, then one pass writing exp(x - max) / sum
    # (the second read of a row mostly hits L2: a wave of programs' rows fits in it)
    row = tl.program_id(0).to(tl.int64)
    src = s_ptr + row * s_row
    m = tl.full([BLOCK], _FAR_BELOW, tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < N, other=_FAR_BELOW).to(tl.float32) * scale
        m_new = tl.maximum(m, x)
        acc = acc * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    top = tl.max(m, 0)
    inv = 1.0 / tl.sum(acc * tl.exp(m - top), 0)
    dst = p_ptr + row * p_row
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < N, other=_FAR_BELOW).to(tl.float32) * scale
        y = tl.exp(x - top) * inv
        if ROUND_BF16:  # round to nearest even by hand: then the cast below is exact on the GPU and interpreted alike
            bits = y.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            y = bits.to(tl.float32, bitcast=True)
        tl.store(dst + offs, y.to(p_ptr.dtype.element_ty), mask=offs < N)


def softmax_rows(scores: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """softmax(scores * scale) over the last dim of a 2-D tensor with unit column stride (fp32 scores), computed in
    fp32 and rounded once to `dtype` (what a flash kernel does to its probabilities before the PV product)."""
    if scores.dim() != 2 or scores.stride(1) != 1:
        raise ValueError(f"softmax_rows needs a 2-D tensor with unit column stride, got {tuple(scores.shape)} "
                         f"strides {scores.stride()}")
    rows, n = scores.shape
    out = torch.empty((rows, n), device=scores.device, dtype=dtype)
    if rows and n:
        _softmax_rows[(rows,)](scores, out, n, scores.stride(0), out.stride(0), float(scale),
                               BLOCK=SOFTMAX_BLOCK, ROUND_BF16=dtype == torch.bfloat16, num_warps=8)
    return out


# ---- copies between channels-last views: the carried frames and plain inputs into a conv's padded band ---------------

COPY_BLOCK = 4096


@triton.jit
def _copy_rows(src_ptr, dst_ptr, T, H, RUN, s_b, s_t, s_h, d_b, d_t, d_h, BLOCK: tl.constexpr):
    # one program per (row, block of its run): a row's W x C values are one contiguous run in both tensors
    row = tl.program_id(0).to(tl.int64)
    h = row % H
    t = (row // H) % T
    b = row // (H * T)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < RUN
    v = tl.load(src_ptr + b * s_b + t * s_t + h * s_h + offs, mask=mask)
    tl.store(dst_ptr + b * d_b + t * d_t + h * d_h + offs, v, mask=mask)


def rows_are_runs(x: torch.Tensor) -> bool:
    """x [B, C, T, H, W] holds each (b, t, h) row's W x C values as one contiguous run (channels-last, columns
    adjacent: a channels_last_3d tensor or a view of its frames, rows or whole-width columns)."""
    b, c, t, h, w = x.shape
    return x.stride(1) == 1 and (w == 1 or x.stride(4) == c)


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) for same-shape, same-dtype 5-D views whose rows are contiguous runs (rows_are_runs; any
    strides between rows, frames and batches, an expanded frame included): one vectorised pass, where torch's
    copy of such views takes its generic strided kernel."""
    if dst.shape != src.shape or dst.dtype != src.dtype or not (rows_are_runs(dst) and rows_are_runs(src)):
        raise ValueError(f"copy_rows: {tuple(src.shape)} {src.dtype} -> {tuple(dst.shape)} {dst.dtype} "
                         f"(strides {src.stride()} -> {dst.stride()}) is not a copy of row runs")
    b, c, t, h, w = dst.shape
    if dst.numel():
        _copy_rows[(b * t * h, triton.cdiv(w * c, COPY_BLOCK))](
            src, dst, t, h, w * c, src.stride(0), src.stride(2), src.stride(3), dst.stride(0), dst.stride(2),
            dst.stride(3), BLOCK=COPY_BLOCK, num_warps=4)
    return dst
