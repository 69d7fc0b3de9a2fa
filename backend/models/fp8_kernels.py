"""Triton kernels that make the FP8 inputs of an H3 block's GEMMs in the pass that produces them, so no bf16
intermediate is written and read again: RMSNorm + AdaLN modulation + row quantisation in one read of the residual
stream, and SwiGLU (or the identity, for the attention output) + row quantisation in one read of its input.

The quantisation contract (one fp32 scale per row, amax / 448, values clamped to +-448) is stated in fp8_linear.py,
whose torch reference these kernels must equal up to fp32 rounding. A kernel casts to its output buffer's element
type: float8_e4m3fn in use; the tests run the kernels under TRITON_INTERPRET=1 with float32 buffers and cast with
torch, because the interpreter's float8 cast rounds wrongly at binade edges (it turns -124.4 into -64).

Offsets are int64: a 10-s request's SwiGLU input is 73,888 x 28,672 elements, within 2% of 2**31.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_NORM_WIDTH = 16384  # the norm kernel holds a whole row in registers; wider rows take the torch reference


@triton.jit
def _norm_modulate_quant(x_ptr, w_ptr, scale_ptr, shift_ptr, q_ptr, s_ptr, row0, seq, cols, x_batch_stride,
                         x_row_stride, eps, MODULATE: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr,
                         MIN_AMAX: tl.constexpr):
    row = row0 + tl.program_id(0).to(tl.int64)
    batch = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + batch * x_batch_stride + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
    y = x * rstd * w
    if MODULATE:
        scale = tl.load(scale_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = y * (1.0 + scale) + shift
    s = tl.maximum(tl.max(tl.abs(y), axis=0), MIN_AMAX) / FP8_MAX
    q = tl.minimum(tl.maximum(y / s, -FP8_MAX), FP8_MAX)
    out = batch * seq + row
    tl.store(q_ptr + out * cols + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + out, s)


@triton.jit
def _row_values(src, offs, mask, cols, SWIGLU: tl.constexpr):
    v = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    if SWIGLU:  # [value | gate] halves: value * silu(gate)
        g = tl.load(src + cols + offs, mask=mask, other=0.0).to(tl.float32)
        v = v * (g * tl.sigmoid(g))
    return v


@triton.jit
def _rows_quant(x_ptr, q_ptr, s_ptr, cols, x_row_stride, SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                FP8_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    # Two sweeps over the row: its amax, then the quantised values (the second read mostly hits L2).
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr + row * x_row_stride
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(_row_values(src, offs, offs < cols, cols, SWIGLU)))
    s = tl.maximum(tl.max(amax, axis=0), MIN_AMAX) / FP8_MAX
    dst = q_ptr + row * cols
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        q = tl.minimum(tl.maximum(_row_values(src, offs, mask, cols, SWIGLU) / s, -FP8_MAX), FP8_MAX)
        tl.store(dst + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, s)


def norm_modulate_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, runs, scale: torch.Tensor,
                        shift: torch.Tensor, q: torch.Tensor, s: torch.Tensor, fp8_max: float, min_amax: float) -> None:
    """x [B, S, C] (columns contiguous); runs: (start, stop, table_row) covering [0, S), table_row -1 = no
    modulation; scale/shift [R, C] tables. Writes q [B, S, C] and s [B, S] (both contiguous)."""
    b, seq, cols = x.shape
    block = triton.next_power_of_2(cols)
    warps = min(16, max(4, block // 512))
    for start, stop, r in runs:
        if stop <= start:
            continue
        mod = r >= 0
        _norm_modulate_quant[(stop - start, b)](
            x, weight, scale[r] if mod else weight, shift[r] if mod else weight, q, s, start, seq, cols,
            x.stride(0), x.stride(1), eps, MODULATE=mod, BLOCK=block, FP8_MAX=fp8_max, MIN_AMAX=min_amax,
            num_warps=warps)


def rows_quant(x: torch.Tensor, swiglu: bool, q: torch.Tensor, s: torch.Tensor, fp8_max: float,
               min_amax: float) -> None:
    """x [M, W] (columns contiguous) -> q [M, K] and s [M] (contiguous); K = W // 2 for SwiGLU, else W."""
    rows, width = x.shape
    cols = width // 2 if swiglu else width
    block = min(2048, triton.next_power_of_2(cols))
    _rows_quant[(rows,)](x, q, s, cols, x.stride(0), SWIGLU=swiglu, BLOCK=block, FP8_MAX=fp8_max,
                         MIN_AMAX=min_amax, num_warps=8 if block >= 1024 else 4)
