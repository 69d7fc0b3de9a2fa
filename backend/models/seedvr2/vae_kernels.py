"""Triton kernels of the SeedVR2 VAE's per-frame GroupNorm: the statistics in one read of the activation, and the
normalisation (+ SiLU) in one read and one write, straight into the buffer the next conv reads (its zero-padded,
time-extended input), so no fp32 copy of an activation is ever made.

The torch path in vae_ops.py (``FrameGroupNorm``) is the reference: per (batch, group, frame) fp32 mean and
1 / sqrt(var + eps) (population variance), then ``((x - mean) * rstd) * weight + bias`` in fp32, SiLU, one rounding
to the output dtype. The kernels compute the same formula in fp32; they differ from it only by summation order in the
statistics and by fused multiply-adds (tests/test_seedvr2_vae_kernels.py bounds both).

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
    # spread keeps the variance; tests/test_seedvr2_vae_kernels.py).
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


def group_stats(x: torch.Tensor, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, group, frame) fp32 mean and 1 / sqrt(var + eps) of x [B, C, T, H, W] (population variance)."""
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
    var = m2 / count
    mean_out = grand.float().view(b, groups, t)
    rstd = (var + eps).rsqrt().float().view(b, groups, t)
    return mean_out, rstd


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
