"""sage_rule.quantize's INT8 and FP8 passes as Triton kernels: one read of q, k or v (any row strides, as fused qkv
views give) and one write of the kernel's operand, bit for bit what the torch quantisers produce (IEEE division,
round half to even, the same K mean and V range from torch). The torch passes take ~40 ms at the 10-s shape on an
H100 (copies, five passes); these read each tensor once."""

from __future__ import annotations

import torch

try:  # optional, as in sage_kernel.py
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None

_ROUND = 12582912.0  # 1.5 * 2^23: (x + c) - c rounds a float32 |x| < 2^22 to the nearest integer, ties to even


if triton is not None:
    @triton.jit
    def _program_rows(X, stride_b, stride_s, stride_h, H, seq, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
        # This program's block of BLOCK rows of one (batch, head) of X [B, S, H, D], fp32, rows past seq as 0.
        blk = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        rows = blk * BLOCK + tl.arange(0, BLOCK)
        dims = tl.arange(0, HEAD_DIM)
        valid = (rows < seq)[:, None]
        x = tl.load(X + (bh // H) * stride_b + (bh % H) * stride_h + rows[:, None].to(tl.int64) * stride_s
                    + dims[None, :], mask=valid, other=0.0).to(tl.float32)
        return x, blk, bh, rows, dims, valid

    @triton.jit
    def _int8_blocks(X, MEAN, OUT, SCALE, stride_b, stride_s, stride_h, H, seq, n_blocks,
                     HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, SMOOTH: tl.constexpr, PER_ROW: tl.constexpr):
        # PER_ROW: a scale per row (the rule's blocks of one row), OUT [B, H, n_blocks, D] and SCALE [B, H, n_blocks]
        # (n_blocks >= seq rows: the caller fills the padding rows); else one scale per BLOCK rows, OUT zero-padded to
        # n_blocks * BLOCK rows.
        x, blk, bh, rows, dims, valid = _program_rows(X, stride_b, stride_s, stride_h, H, seq, HEAD_DIM, BLOCK)
        if SMOOTH:
            x = tl.where(valid, x - tl.load(MEAN + bh * HEAD_DIM + dims)[None, :], 0.0)
        if PER_ROW:
            amax = tl.max(tl.abs(x), axis=1)
            scale = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
            y = tl.math.div_rn(x, tl.zeros([BLOCK, HEAD_DIM], tl.float32) + scale[:, None])
        else:
            amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
            scale = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
            y = tl.math.div_rn(x, tl.zeros([BLOCK, HEAD_DIM], tl.float32) + scale)
        y = (y + 12582912.0) - 12582912.0
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        if PER_ROW:
            tl.store(OUT + bh * n_blocks * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :], y.to(tl.int8),
                     mask=valid)
            tl.store(SCALE + bh * n_blocks + rows, scale, mask=rows < seq)
        else:
            tl.store(OUT + bh * n_blocks * BLOCK * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :], y.to(tl.int8))
            tl.store(SCALE + bh * n_blocks + blk, scale)

    @triton.jit
    def _fp8_channels(V, SCALE, OUT, stride_b, stride_s, stride_h, H, seq, seq_pad,
                      HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
        x, blk, bh, rows, dims, _ = _program_rows(V, stride_b, stride_s, stride_h, H, seq, HEAD_DIM, BLOCK)
        scale = tl.load(SCALE + bh * HEAD_DIM + dims)
        y = tl.math.div_rn(x, tl.zeros([BLOCK, HEAD_DIM], tl.float32) + scale[None, :])
        tl.store(OUT + bh * HEAD_DIM * seq_pad + dims[None, :] * seq_pad + rows[:, None], y.to(tl.float8e4nv),
                 mask=(rows < seq_pad)[:, None])


def int8_blocks(x: torch.Tensor, block: int, mean: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_int8_blocks(x - mean) in one pass: x [B, S, H, D] (unit last stride), mean [B, H, D] fp32 or None."""
    b, s, h, d = x.shape
    n = -(-s // block)
    out = torch.empty((b, h, n * block, d), dtype=torch.int8, device=x.device)
    scale = torch.empty((b, h, n), dtype=torch.float32, device=x.device)
    smooth = mean is not None
    _int8_blocks[(n, b * h)](x, mean.contiguous() if smooth else scale, out, scale, x.stride(0), x.stride(1),
                             x.stride(2), h, s, n, HEAD_DIM=d, BLOCK=block, SMOOTH=smooth, PER_ROW=False, num_warps=8)
    return out, scale


def int8_rows(x: torch.Tensor, mean: torch.Tensor | None = None, program_rows: int = 128, pad_to: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_int8_blocks(x - mean, 1, pad_to) in one pass (a scale per row): int8 [B, H, R, D], fp32 [B, H, R],
    R = S rounded up to a multiple of `pad_to` (padding rows 0 with scale 1); `program_rows` rows per program."""
    b, s, h, d = x.shape
    padded = -(-s // pad_to) * pad_to
    out = (torch.zeros if padded > s else torch.empty)((b, h, padded, d), dtype=torch.int8, device=x.device)
    scale = (torch.ones if padded > s else torch.empty)((b, h, padded), dtype=torch.float32, device=x.device)
    smooth = mean is not None
    _int8_blocks[(-(-s // program_rows), b * h)](x, mean.contiguous() if smooth else scale, out, scale, x.stride(0),
                                                 x.stride(1), x.stride(2), h, s, padded, HEAD_DIM=d,
                                                 BLOCK=program_rows, SMOOTH=smooth, PER_ROW=True, num_warps=8)
    return out, scale


def fp8_channels(v: torch.Tensor, block: int, scale: torch.Tensor) -> torch.Tensor:
    """v / scale as e4m3 [B, H, D, n * block], zero-padded; scale [B, H, D] fp32. Programs of `block` rows (at least
    128: blocks of one row, the VSA rule's, are not one program each)."""
    b, s, h, d = v.shape
    seq_pad = -(-s // block) * block
    rows = max(block, 128)
    out = torch.empty((b, h, d, seq_pad), dtype=torch.float8_e4m3fn, device=v.device)
    _fp8_channels[(-(-seq_pad // rows), b * h)](v, scale.contiguous(), out, v.stride(0), v.stride(1), v.stride(2), h,
                                                s, seq_pad, HEAD_DIM=d, BLOCK=rows, num_warps=4)
    return out
