"""The Triton pieces both VSA video kernels share (vsa_kernel.py's pointer kernel, vsa_kernel_tma.py's TMA one):
the optional Triton import, which inputs a kernel takes, and the online-softmax step over one block of keys."""

from __future__ import annotations

import torch

try:  # Triton is optional: the torch fallback (vsa_kernel.py) implements the same rule
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None


def triton_supported(q: torch.Tensor) -> bool:
    d = q.shape[-1]
    return (triton is not None and q.dtype in (torch.bfloat16, torch.float16) and 16 <= d <= 256
            and d & (d - 1) == 0 and q.stride(-1) == 1)


if triton is not None:
    @triton.jit
    def _online_softmax_scores(s, vv, valid, acc, m_i, l_i, qk_scale, PV_FP16: tl.constexpr):
        # One block of raw scores `s` = q . k^T (its V rows `vv`; `valid` marks the block's own keys) into the
        # online softmax state (m_i in the log2 domain). The row max is taken on the raw scores (qk_scale > 0 keeps
        # the order, and rounding keeps max(s) * c == max(s * c)), so s * c - m is one FMA per score instead of a
        # multiply and a subtract: 3% off the TMA kernel on the H200 (docs/BENCHMARKS.md, session 10).
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        pr = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        if PV_FP16:  # probabilities keep 3 more mantissa bits in fp16 (V must fit fp16's range)
            acc = acc * alpha[:, None] + tl.dot(pr.to(tl.float16), vv.to(tl.float16))
        else:
            acc = acc * alpha[:, None] + tl.dot(pr.to(vv.dtype), vv)
        return acc, m_new, l_i

    @triton.jit
    def _online_softmax_scores_lazy(s, vv, valid, acc, m_i, l_i, qk_scale, PV_FP16: tl.constexpr):
        # _online_softmax_scores with the reference max moved only when some row's max grew past it by more than
        # 2^8 (FlashAttention-4's conditional rescale): most blocks then skip the accumulator's rescale, which must
        # wait for the previous P.V product. Probabilities stay <= 2^8 (fp32 sums, bf16 / fp16 operands keep their
        # relative precision); the result differs from the eager update only by fp32 rounding.
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))  # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if tl.max(m_new - m_i, 0) > 8.0:  # the first block always (m_i = -inf)
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        pr = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(pr, 1)
        pv_dtype = tl.float16 if PV_FP16 else vv.dtype
        acc = tl.dot(pr.to(pv_dtype), vv.to(pv_dtype), acc)
        return acc, m_i, l_i

    @triton.jit
    def _online_softmax_step(q, kk, vv, valid, acc, m_i, l_i, qk_scale, PV_FP16: tl.constexpr):
        # One block of key rows (K `kk`, V `vv`) into the online softmax state. Shared by the pointer kernel and
        # the TMA one.
        return _online_softmax_scores(tl.dot(q, tl.trans(kk)), vv, valid, acc, m_i, l_i, qk_scale, PV_FP16)

    @triton.jit
    def _online_softmax_step2(q, k0, v0, valid0, k1, v1, valid1, acc, m_i, l_i, qk_scale, PV_FP16: tl.constexpr):
        # Two blocks of key rows at once: one running-max update, one rescale of the accumulator and one pass of
        # row sums for both (half the bookkeeping per key row of two single steps); same result up to fp32 rounding.
        s0 = tl.where(valid0[None, :], tl.dot(q, tl.trans(k0)) * qk_scale, float("-inf"))
        s1 = tl.where(valid1[None, :], tl.dot(q, tl.trans(k1)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.maximum(tl.max(s0, 1), tl.max(s1, 1)))
        alpha = tl.exp2(m_i - m_new)
        p0 = tl.exp2(s0 - m_new[:, None])
        p1 = tl.exp2(s1 - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p0, 1) + tl.sum(p1, 1)
        pv_dtype = tl.float16 if PV_FP16 else v0.dtype
        acc = acc * alpha[:, None] + tl.dot(p0.to(pv_dtype), v0.to(pv_dtype))
        acc = tl.dot(p1.to(pv_dtype), v1.to(pv_dtype), acc)
        return acc, m_new, l_i
