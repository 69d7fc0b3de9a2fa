"""VSA's sparse steps with SAGE operand precisions (the `vsa` backend at precision "sage", "vsa:precision=sage"): the
same tile selection (vsa_kernel.select_tiles, from the bf16 q and k), the selected rows attended with INT8 Q.K^T and
FP8 P.V, as the dense `sage` backend does (sage_rule.py). Lossy and opt-in.

The rule, per (batch, head), rows in tile order (vsa_plan.py: P prefix rows, then the video tiles):
- K smoothed by its mean over the whole sequence (a per-query constant in the scores: the softmax does not move);
- Q and the smoothed K to int8 per row: x8 = round(x / s), s = absmax over the head dim / 127 (a zero row: 1). Per
  row, not per block as the dense rule: VSA's tiles are cut irregularly (edge tiles are shorter), and a row's scale
  does not depend on the cut; it also keeps one outlier row from setting the scale of 127 others;
- V to e4m3 per channel, s_v = absmax over the sequence / 448, stored [B, H, D, S] (the sequence contiguous: the
  FP8 MMA's second operand);
- each video query tile attends, in this order, the prefix in 64-row blocks and then its selected tiles ascending:
  score = (q8 . k8) s_q s_k d^-1/2, online softmax in fp32 (l from the unquantised p), acc += e4m3(p * 448) . v8 per
  block; out = acc s_v / (448 l). The kernel runs the same order, so P is rounded where the reference rounds it;
- prefix queries (a few percent of the rows) take the dense path in the activations' dtype, as in the bf16 VSA.
`attend_video` is the rule in float64 (the reference) or float32 (the CPU path); `_vsa_sage_fwd` the Triton kernel
(one program per (video query tile, batch * head), 64-row blocks; GPUs with FP8 MMA, sage_kernel.fp8_capable).
"""

from __future__ import annotations

import math

import torch

from . import sage_kernel, sage_rule
from .sage_kernel import LOG2E, fp8_capable
from .sage_rule import FP8, FP8_MAX, SageOperands
from .vsa_kernel import select_tiles
from .vsa_plan import TILE_ROWS
from .vsa_softmax import tl, triton

KERNEL_CONFIG = {"num_warps": 4, "num_stages": 3}  # the bf16 pointer kernel's (vsa_kernel.KERNEL_CONFIG); untuned


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> SageOperands:
    """The rule's operands from q, k, v [B, S, H, D] (module docstring): sage_rule's quantisers with blocks of one row,
    so q_scale and k_scale are [B, H, S] -- on CUDA the Triton passes where sage_kernel.TRITON_QUANTISERS says (bit
    for bit the same)."""
    if q.is_cuda and sage_kernel.TRITON_QUANTISERS:
        return sage_kernel.quantize_on_gpu(q, k, v, block_m=1, block_n=1)
    return sage_rule.quantize(q, k, v, block_m=1, block_n=1)


def _key_blocks(num_prefix: int, starts: torch.Tensor, sizes: torch.Tensor, sel: torch.Tensor, tile: int):
    """The key blocks video query tile `tile` attends, in the kernel's order: (row indices [B, H, 64], valid mask
    [B, H, 64]) for the prefix's 64-row blocks, then for its selected tiles; invalid lanes point at a valid row."""
    b, h = sel.shape[:2]
    lane = torch.arange(TILE_ROWS, device=sel.device)
    for a in range(0, num_prefix, TILE_ROWS):
        keys = (a + lane).expand(b, h, -1)
        valid = keys < num_prefix
        yield torch.where(valid, keys, a), valid
    for j in range(sel.shape[3]):
        chosen = sel[:, :, tile, j].long()
        start, size = starts.long()[chosen][..., None], sizes.long()[chosen][..., None]
        valid = lane < size
        yield torch.where(valid, start + lane, start), valid


def attend_video(ops: SageOperands, num_prefix: int, starts: torch.Tensor, sizes: torch.Tensor, sel: torch.Tensor,
                 dtype=torch.float64) -> torch.Tensor:
    """The rule for the video queries in `dtype` (float64: the reference; float32: the CPU path): [B, S - P, H, D]
    (rows in tile order). `starts`, `sizes` [T] (vsa_plan's tables), `sel` [B, H, T, k] ascending."""
    b, h, s, d = ops.q8.shape
    p = num_prefix
    q = ops.q8.to(dtype) * (ops.q_scale.to(dtype)[..., None] * d ** -0.5)
    k = ops.k8.to(dtype) * ops.k_scale.to(dtype)[..., None]
    v = ops.v8.to(dtype)  # [B, H, D, S]
    v_scale = ops.v_scale.to(dtype)[:, :, None, :]
    out = torch.empty(b, h, s - p, d, dtype=dtype, device=q.device)
    for tile in range(starts.shape[0]):
        r0, n = int(starts[tile]), int(sizes[tile])
        qt = q[:, :, r0:r0 + n]
        m = torch.full((b, h, n), -math.inf, dtype=dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qt)
        for keys, valid in _key_blocks(p, starts, sizes, sel, tile):
            kb = k.gather(2, keys[..., None].expand(-1, -1, -1, d))  # [B, H, 64, D]
            vb = v.gather(3, keys[:, :, None, :].expand(-1, -1, d, -1))  # [B, H, D, 64]
            scores = torch.einsum("bhnd,bhld->bhnl", qt, kb).masked_fill(~valid[:, :, None, :], -math.inf)
            m_new = torch.maximum(m, scores.amax(-1))
            prob = torch.exp(scores - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + prob.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("bhnl,bhdl->bhnd", (prob * FP8_MAX).to(FP8).to(dtype), vb)
            m = m_new
        out[:, :, r0 - p:r0 - p + n] = acc * v_scale / (FP8_MAX * l[..., None])
    return out.transpose(1, 2)


if triton is not None:
    @triton.jit
    def _sage_keys(q, qs, acc, m_i, l_i, k_base, ks_base, v_base, keys, valid, S, dims, HEAD_DIM: tl.constexpr):
        # One 64-row key block (`keys` int64 rows, every lane a valid row; `valid` marks the block's own) into the
        # online softmax state; scores in log2 units (qs carries d^-1/2 * log2 e).
        k = tl.load(k_base + keys[:, None] * HEAD_DIM + dims[None, :])  # [64, D] int8
        ks = tl.load(ks_base + keys)
        vt = tl.load(v_base + dims[:, None] * S + keys[None, :])  # [D, 64] e4m3, the sequence contiguous
        s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32) * (qs[:, None] * ks[None, :])
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = tl.dot((p * 448.0).to(tl.float8e4nv), tl.trans(vt), out_dtype=tl.float32)
        return acc * alpha[:, None] + pv, m_new, l_i

    @triton.jit
    def _vsa_sage_fwd(Q8, K8, V8, QS, KS, VS, O, starts, sizes, sel, P, S, H, T, NSEL, qk_scale, sob, sos, soh,
                      HEAD_DIM: tl.constexpr, TILE: tl.constexpr):
        tile = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // H
        h = bh % H
        q_start = tl.load(starts + tile)
        q_len = tl.load(sizes + tile)
        rows = tl.arange(0, TILE)
        dims = tl.arange(0, HEAD_DIM)
        q_ok = rows < q_len
        q_rows = (q_start + tl.where(q_ok, rows, 0)).to(tl.int64)
        q = tl.load(Q8 + bh * S * HEAD_DIM + q_rows[:, None] * HEAD_DIM + dims[None, :])
        qs = tl.load(QS + bh * S + q_rows) * qk_scale
        k_base = K8 + bh * S * HEAD_DIM
        ks_base = KS + bh * S
        v_base = V8 + bh * HEAD_DIM * S
        m_i = tl.full((TILE,), float("-inf"), tl.float32)
        l_i = tl.zeros((TILE,), tl.float32)
        acc = tl.zeros((TILE, HEAD_DIM), tl.float32)
        cols = tl.arange(0, TILE)
        for k_start in range(0, P, TILE):  # the prefix, every query attends all of it
            valid = k_start + cols < P
            keys = tl.where(valid, k_start + cols, k_start).to(tl.int64)
            acc, m_i, l_i = _sage_keys(q, qs, acc, m_i, l_i, k_base, ks_base, v_base, keys, valid, S, dims, HEAD_DIM)
        sel_base = sel + (bh * T + tile) * NSEL
        for j in range(0, NSEL):  # this tile's selected video tiles, ascending
            kt = tl.load(sel_base + j)
            start = tl.load(starts + kt)
            valid = cols < tl.load(sizes + kt)
            keys = (start + tl.where(valid, cols, 0)).to(tl.int64)
            acc, m_i, l_i = _sage_keys(q, qs, acc, m_i, l_i, k_base, ks_base, v_base, keys, valid, S, dims, HEAD_DIM)
        vs = tl.load(VS + bh * HEAD_DIM + dims)
        out = acc * (vs[None, :] / (448.0 * l_i[:, None]))
        tl.store(O + b * sob + h * soh + (q_start + rows)[:, None].to(tl.int64) * sos + dims[None, :],
                 out.to(O.dtype.element_ty), mask=q_ok[:, None])


def kernel_video_attention(ops: SageOperands, num_prefix: int, starts: torch.Tensor, sizes: torch.Tensor,
                           sel: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Fill the video rows of `out` [B, S, H, D] (unit last stride) with the rule through the Triton kernel."""
    b, h, s, d = ops.q8.shape
    assert FP8_MAX == 448.0 and out.stride(-1) == 1  # the kernel's P scale is the literal 448.0
    sel = sel.to(torch.int32).contiguous()
    t, nsel = sel.shape[2], sel.shape[3]
    _vsa_sage_fwd[(t, b * h)](ops.q8, ops.k8, ops.v8, ops.q_scale, ops.k_scale, ops.v_scale, out,
                              starts.to(torch.int32), sizes.to(torch.int32), sel, num_prefix, s, h, t, nsel,
                              d ** -0.5 * LOG2E, out.stride(0), out.stride(1), out.stride(2),
                              HEAD_DIM=d, TILE=TILE_ROWS, **KERNEL_CONFIG)
    return out


def kernel_supported(q: torch.Tensor) -> bool:
    d = q.shape[-1]
    return triton is not None and q.is_cuda and 32 <= d <= 256 and d & (d - 1) == 0 and fp8_capable(q.device)[0]


def sparse_attention(q, k, v, plan, dense, use_kernel: bool | None = None) -> torch.Tensor:
    """One sparse step at SAGE precision on rows in tile order (vsa_kernel.sparse_attention's shape and split):
    prefix queries through `dense`, video queries through the kernel (CUDA) or the rule in float32."""
    p = plan.num_prefix
    starts, sizes, _ = plan.tables(q.device)
    if use_kernel is None:
        use_kernel = kernel_supported(q)
    sel = select_tiles(q, k, p, plan.tile_sizes, plan.topk, out_dtype=torch.int32 if use_kernel else torch.long)
    ops = quantize(q, k, v)
    out = torch.empty_like(q)
    if use_kernel:
        kernel_video_attention(ops, p, starts, sizes, sel, out)
    else:
        out[:, p:] = attend_video(ops, p, starts, sizes, sel, torch.float32).to(q.dtype)
    if p:
        if use_kernel:
            out[:, :p] = dense(q[:, :p], k, v)
        else:  # as vsa_kernel.sparse_attention on the CPU: the prefix queries in fp32
            out[:, :p] = dense(q[:, :p].float(), k.float(), v.float()).to(q.dtype)
    return out
