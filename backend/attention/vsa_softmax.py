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
    def _online_softmax_step(q, kk, vv, valid, acc, m_i, l_i, qk_scale, PV_FP16: tl.constexpr):
        # One block of key rows (K `kk`, V `vv`; `valid` marks the block's own keys) into the online softmax
        # state. Shared by the pointer kernel and the TMA one.
        s = tl.dot(q, tl.trans(kk)) * qk_scale  # log2 domain
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        pr = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        if PV_FP16:  # probabilities keep 3 more mantissa bits in fp16 (V must fit fp16's range)
            acc = acc * alpha[:, None] + tl.dot(pr.to(tl.float16), vv.to(tl.float16))
        else:
            acc = acc * alpha[:, None] + tl.dot(pr.to(vv.dtype), vv)
        return acc, m_new, l_i
