"""The "sage" attention backend: SAGE-style quantised dense attention (sage_rule.py: the rule; sage_kernel.py: its
Triton kernel). Lossy and opt-in. On CUDA it needs FP8 tensor cores (compute capability 8.9+) and is refused at
engine start elsewhere (no silent fallback to another kernel); on the CPU it runs the same rule in torch (float32),
slow, for the tiny model and for checks. Its settings are a SageSettings ("sage:skip=0.001": Skip-Softmax;
"sage:scales=row": a Q / K scale per row)."""

from __future__ import annotations

import torch

from .registry import AttentionBackend, register
from .sage_kernel import fp8_capable, kernel_supported, sage_attention
from .sage_rule import SageSettings, attend_quantized, quantize


def check_device(device: torch.device, who: str = "Attention 'sage'",
                 instead: str = "choose attention sdpa (exact) or vsa") -> None:
    """One clear line where the SAGE kernels cannot run: a CUDA GPU without FP8 MMA, or without Triton. `who` /
    `instead`: what needs them and what to choose then (the vsa backend's precision sage says its own)."""
    if device.type != "cuda":
        return
    ok, what = fp8_capable(device)
    if not ok:
        raise ValueError(f"{who} needs FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
                         f"Blackwell); {what} has none: {instead}.")
    from .sage_kernel import triton

    if triton is None:
        raise ValueError(f"{who} runs a Triton kernel on the GPU and Triton is not installed: pip install triton, "
                         f"or {instead}.")


def backend(settings: SageSettings) -> AttentionBackend:
    @torch.compiler.disable  # eager inside compiled blocks: the quantisers and the kernel launch stay as written
    def attend(q, k, v, plan=None):
        if q.is_cuda:
            if not kernel_supported(q):
                raise ValueError(f"Attention 'sage' cannot run on {q.device} with head size {q.shape[-1]} (FP8 tensor "
                                 "cores, Triton and a power-of-two head size 16-256 are needed).")
            return sage_attention(q, k, v, settings)
        ops = quantize(q, k, v, scales=settings.scales)
        return attend_quantized(ops, settings, dtype=torch.float32).to(q.dtype).contiguous()

    name = "sage" if settings == SageSettings() else f"sage:{settings.spec()}"
    return AttentionBackend(name, attend, _DESCRIPTION, settings=SageSettings, configure=backend,
                            check_device=check_device)


_DESCRIPTION = ("SAGE quantised attention (lossy, opt-in): INT8 Q.K^T after smoothing K, FP8 P.V; a Triton kernel "
                "on GPUs with FP8 tensor cores (Ada / Hopper), the same rule in torch on the CPU")

register(backend(SageSettings()))
