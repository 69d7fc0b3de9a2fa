"""The dense attention kernels (torch SDPA with cuDNN first, SDPA's own choice, a float32 reference), registered
by name in registry.py (the contract is stated there). They take no per-request plan."""

from __future__ import annotations

import contextlib
import torch
import torch.nn.functional as F

from ..opaque_op import opaque_op
from .registry import AttentionBackend, AttentionFn, get_backend, register  # noqa: F401 - AttentionFn re-exported


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # SDPA wants [B, H, S, D]; transposed views cost nothing and the fused kernels honour the strides.
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def _cudnn_first_context():
    """Prefer cuDNN attention on CUDA: on the H200 it runs at ~570 TFLOP/s vs ~355 for flash at H3 shapes."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        try:
            return sdpa_kernel(order, set_priority=True)
        except TypeError:  # torch without set_priority: plain allow-list, torch picks among them
            return sdpa_kernel(order)
    except ImportError:
        return contextlib.nullcontext()


def _sdpa_cudnn_first_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with _cudnn_first_context() if q.is_cuda else contextlib.nullcontext():
        return _sdpa(q, k, v).contiguous()  # already so where q is: the kernel's output follows q's layout


def _sdpa_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))  # [B, S, H, D] contiguous, as the eager call returns


# Opaque to torch.compile: a compiled block calls exactly the eager path (cuDNN first, by the priority context above,
# whatever this torch's Inductor does with SDPA), so compiled and eager attention are the same kernel. Measured on the
# H200 at the 5-s shape: the cuDNN kernel itself takes 76.7-78.4 ms in our compiled block either way (traced or opaque)
# vs 71.5 ms in diffusers' eager block and 73.0 ms alone -- the same kernel on equal shapes; why is not known yet
# (bench/dit_block.py --profile; docs/BENCHMARKS.md).
_sdpa_cudnn_first = opaque_op("sdpa_cudnn_first", "(Tensor q, Tensor k, Tensor v) -> Tensor",
                              _sdpa_cudnn_first_eager, _sdpa_fake)


def _math_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Plain softmax(QK^T/sqrt(d))V in float32: the slow, obviously-right backend tests compare against.
    scale = q.shape[-1] ** -0.5
    qf, kf, vf = (t.transpose(1, 2).float() for t in (q, k, v))
    probs = torch.softmax(qf @ kf.transpose(-1, -2) * scale, dim=-1)
    return (probs @ vf).transpose(1, 2).to(q.dtype)


def _dense(kernel):
    def fn(q, k, v, plan=None):
        return kernel(q, k, v)

    return fn


register(AttentionBackend("sdpa", _dense(_sdpa_cudnn_first),
                          "torch SDPA, cuDNN attention first on CUDA (fastest dense kernel on the H200)"))
register(AttentionBackend("math", _dense(_math_reference), "float32 softmax(QK^T)V reference (slow; for checks)"))
register(AttentionBackend("sdpa_default", _dense(_sdpa), "torch SDPA with torch's own kernel choice"))


def get_attention(name: str = "sdpa") -> AttentionBackend:
    """The registered backend `name` (callable as attention(q, k, v, plan=None))."""
    return get_backend(name)
