"""The SAGE attention kernel (sage_rule.py's rule) in Triton for GPUs with FP8 tensor cores (compute capability 8.9+;
tuned for Hopper): INT8 Q.K^T into int32, the online softmax in fp32 (log2 domain), e4m3 P.V into a fresh fp32 tile
added to the fp32 accumulator (two-level accumulation). One program per (query block, batch * head); the operands
come from sage_rule.quantize (padded: only the last key tile's scores are masked)."""

from __future__ import annotations

import math

import torch

from .sage_quant_kernel import fp8_channels, int8_blocks, int8_rows
from .sage_rule import BLOCK_M, BLOCK_N, FP8_MAX, SageOperands, SageSettings, divide_rn, quantize

try:  # Triton is optional: the CPU path runs the rule in torch (sage_rule.attend_quantized)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None

LOG2E = 1.4426950408889634
# Launch settings (bench/sage_attention.py sweeps them): 8 warps = two warpgroups over the 128 query rows.
KERNEL_CONFIG = {"num_warps": 8, "num_stages": 3}
MIN_CAPABILITY = (8, 9)  # Ada / Hopper / Blackwell: FP8 e4m3 MMA
# The Triton quantisers (quantize_on_gpu: 2.8 ms at the 10-s shape on an H100, the torch passes 38 ms). On the H100
# their int8 codes and scales differed from the torch rule's in a few blocks by one ulp of the scale: torch's CUDA
# division by a Python number multiplies by its reciprocal, the kernel divides (IEEE). The rule now divides too
# (sage_rule.divide_rn); until test_sage.py::test_the_triton_quantisers_equal_the_torch_rule_bitwise has passed on a GPU
# with that change the torch passes stay the default.
TRITON_QUANTISERS = False


def fp8_capable(device: torch.device) -> tuple[bool, str]:
    """(can this CUDA device run the kernel, its name and capability in words)."""
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    return (major, minor) >= MIN_CAPABILITY, f"{name} (compute capability {major}.{minor})"


def kernel_supported(q: torch.Tensor) -> bool:
    d = q.shape[-1]
    return (triton is not None and q.is_cuda and 16 <= d <= 256 and d & (d - 1) == 0
            and fp8_capable(q.device)[0])


if triton is not None:
    @triton.jit
    def _tile(q, qs, k_ptrs, vt_ptrs, ks_ptr, keys, acc, m_i, l_i, seq, skip_log2, MASK: tl.constexpr,
              SKIP: tl.constexpr, BLOCK_N: tl.constexpr, K_ROWS: tl.constexpr, Q_VEC: tl.constexpr):
        # qs: the query rows' scale times d^-1/2 log2(e), one number (a Q block scale) or [BLOCK_M] (row scales, Q_VEC);
        # ks_ptr: this tile's first K scale (one per tile, or one per K_ROWS rows of it)
        k = tl.load(k_ptrs)  # [BLOCK_N, D] int8
        vt = tl.load(vt_ptrs)  # [D, BLOCK_N] e4m3, the sequence contiguous
        s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
        if K_ROWS == BLOCK_N:
            ks = tl.load(ks_ptr)
            if Q_VEC:
                s = s * (qs * ks)[:, None]
            else:
                s = s * (qs * ks)
        else:
            ks = tl.load(ks_ptr + tl.arange(0, BLOCK_N) // K_ROWS)
            if Q_VEC:
                s = s * qs[:, None] * ks[None, :]
            else:
                s = s * (qs * ks)[None, :]
        if MASK:
            s = tl.where((keys < seq)[None, :], s, float("-inf"))
        tile_max = tl.max(s, 1)
        m_new = tl.maximum(m_i, tile_max)
        keep = True
        if SKIP:  # Skip-Softmax: the whole query block finds this tile negligible
            keep = tl.max(tile_max - m_new, 0) >= skip_log2
        if keep:
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            pv = tl.dot((p * 448.0).to(tl.float8e4nv), tl.trans(vt), out_dtype=tl.float32)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def _sage_fwd(Q8, K8, V8, QS, KS, VS, O, stride_ob, stride_os, stride_oh, H, seq, seq_q, seq_k, n_kblocks,
                  qk_scale, skip_log2, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  TAIL: tl.constexpr, SKIP: tl.constexpr, Q_ROWS: tl.constexpr, K_ROWS: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        cols = tl.arange(0, BLOCK_N)
        q = tl.load(Q8 + bh * seq_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :])
        if Q_ROWS == BLOCK_M:
            qs = qk_scale * tl.load(QS + bh * (seq_q // BLOCK_M) + pid_m)
        else:  # a scale per Q_ROWS rows
            qs = qk_scale * tl.load(QS + bh * (seq_q // Q_ROWS) + rows // Q_ROWS)
        k_ptrs = K8 + bh * seq_k * HEAD_DIM + cols[:, None] * HEAD_DIM + dims[None, :]
        vt_ptrs = V8 + bh * HEAD_DIM * seq_k + dims[:, None] * seq_k + cols[None, :]
        ks_ptr = KS + bh * (seq_k // K_ROWS)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        n_full = n_kblocks - 1 if TAIL else n_kblocks
        for j in range(0, n_full):
            acc, m_i, l_i = _tile(q, qs, k_ptrs, vt_ptrs, ks_ptr + j * (BLOCK_N // K_ROWS), cols, acc, m_i, l_i,
                                  seq, skip_log2, False, SKIP, BLOCK_N, K_ROWS, Q_ROWS != BLOCK_M)
            k_ptrs += BLOCK_N * HEAD_DIM
            vt_ptrs += BLOCK_N
        if TAIL:
            keys = n_full * BLOCK_N + cols
            acc, m_i, l_i = _tile(q, qs, k_ptrs, vt_ptrs, ks_ptr + n_full * (BLOCK_N // K_ROWS), keys, acc, m_i,
                                  l_i, seq, skip_log2, True, SKIP, BLOCK_N, K_ROWS, Q_ROWS != BLOCK_M)
        b = bh // H
        h = bh % H
        vs = tl.load(VS + bh * HEAD_DIM + dims)
        out = acc * (vs[None, :] / (448.0 * l_i[:, None]))
        o_ptrs = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_os + dims[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(rows < seq)[:, None])


def attend_operands(ops: SageOperands, settings: SageSettings, out: torch.Tensor) -> torch.Tensor:
    """Run the kernel on quantised operands into `out` [B, S, H, D] (unit last stride); returns `out`."""
    b, h, seq_q, d = ops.q8.shape
    seq_k = ops.k8.shape[2]
    assert FP8_MAX == 448.0 and out.stride(-1) == 1  # the kernel's P scale is the literal 448.0
    assert ops.block_m % ops.q_rows == 0 and ops.block_n % ops.k_rows == 0, (ops.q_rows, ops.k_rows)
    grid = (seq_q // ops.block_m, b * h)
    skip_log2 = math.log2(settings.skip) if settings.skip > 0 else 0.0
    _sage_fwd[grid](ops.q8, ops.k8, ops.v8, ops.q_scale, ops.k_scale, ops.v_scale, out,
                    out.stride(0), out.stride(1), out.stride(2), h, ops.seq, seq_q, seq_k, seq_k // ops.block_n,
                    d ** -0.5 * LOG2E, skip_log2, HEAD_DIM=d, BLOCK_M=ops.block_m, BLOCK_N=ops.block_n,
                    TAIL=ops.seq % ops.block_n != 0, SKIP=settings.skip > 0, Q_ROWS=ops.q_rows, K_ROWS=ops.k_rows,
                    **KERNEL_CONFIG)
    return out


def quantize_on_gpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = BLOCK_M,
                    block_n: int = BLOCK_N, scales: str = "block") -> SageOperands:
    """sage_rule.quantize, bit for bit, with one Triton pass per tensor (sage_quant_kernel.py)."""
    mean = k.mean(dim=1, dtype=torch.float32)  # [B, H, D]: the same call as the torch rule's
    rows = scales == "row"
    q8, q_scale = int8_rows(q, pad_to=block_m) if rows or block_m == 1 else int8_blocks(q, block_m)
    k8, k_scale = int8_rows(k, mean, pad_to=block_n) if rows or block_n == 1 else int8_blocks(k, block_n, mean)
    low, high = torch.aminmax(v, dim=1)
    v_scale = divide_rn(torch.maximum(high.float(), -low.float()), FP8_MAX)
    v_scale = torch.where(v_scale > 0, v_scale, torch.ones_like(v_scale))
    v8 = fp8_channels(v, block_n, v_scale)
    q_rows, k_rows = (1, 1) if rows else (block_m, block_n)
    return SageOperands(q8, q_scale, k8, k_scale, v8, v_scale, q.shape[1], block_m, block_n, q_rows, k_rows)


def sage_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, settings: SageSettings = SageSettings()
                   ) -> torch.Tensor:
    """q, k, v [B, S, H, D] on an FP8-capable GPU -> [B, S, H, D] contiguous in q's dtype (the rule, quantised here)."""
    scales = settings.scales
    ops = quantize_on_gpu(q, k, v, scales=scales) if TRITON_QUANTISERS else quantize(q, k, v, scales=scales)
    return attend_operands(ops, settings, torch.empty(q.shape, dtype=q.dtype, device=q.device))
