"""The "vsa" attention backend: Video Sparse Attention over H3's target video (vsa_plan.py: tiles, permutation,
schedule; vsa_kernel.py: the rule and its kernels). Its settings are a VSASettings, carried by the engine's
AttentionSpec("vsa", VSASettings(...)); the backend's name shows them ("vsa:topk=0.1,dense=0.2"; "vsa": defaults).
At precision "sage" the sparse steps run vsa_sage.py (INT8 Q.K^T, FP8 P.V; lossy, GPUs with FP8 MMA or the CPU)."""

from __future__ import annotations

import functools

import torch

from . import vsa_sage
from .dispatch import _sdpa_cudnn_first
from .registry import AttentionBackend, AttentionSpec, register
from .sage import check_device as check_fp8_device
from .vsa_kernel import add_coarse_, sparse_attention
from .vsa_plan import VSASettings, make_plan


def _attend(q, k, v, plan=None, gate=None, sparse=None):
    # No plan (the text refiner, an all-dense request) or a dense step: the dense backend, bit for bit.
    out = _sdpa_cudnn_first(q, k, v) if plan is None or not plan.sparse else (sparse or _sparse)(q, k, v, plan)
    if gate is None:
        return out
    if plan is None:
        raise ValueError("Learned VSA gates (a FastH3 student's) need the request's VSA plan: this attention call "
                         "has none.")
    return _coarse(out, q, k, v, gate, plan)


@torch.compiler.disable
def _coarse(out, q, k, v, gate, plan):
    # Eager like _sparse: the block runs read the plan's host-side sizes.
    return add_coarse_(out, q, k, v, gate, plan.block_sizes)


@torch.compiler.disable
def _sparse(q, k, v, plan):
    # Eager inside compiled blocks (one graph break around it): the tile selection reads host-side tile sizes and
    # launches its own kernel; tracing it would specialise the graph on each request's plan.
    return sparse_attention(q, k, v, plan, _sdpa_cudnn_first)


@torch.compiler.disable
def _sparse_sage(q, k, v, plan):
    # As _sparse, at SAGE precision (vsa_sage.py).
    return vsa_sage.sparse_attention(q, k, v, plan, _sdpa_cudnn_first)


def _check_sage_device(device: torch.device) -> None:
    check_fp8_device(device, "VSA at precision sage", "choose precision bf16")


def backend(settings: VSASettings) -> AttentionBackend:
    name = "vsa" if settings == VSASettings() else f"vsa:{settings.spec()}"
    sage = settings.precision == "sage"
    fn = functools.partial(_attend, sparse=_sparse_sage) if sage else _attend
    return AttentionBackend(name, fn, _DESCRIPTION, lambda layout: make_plan(layout, settings),
                            settings=VSASettings, configure=backend, gated=True,
                            check_device=_check_sage_device if sage else None)


_DESCRIPTION = ("Video Sparse Attention: target video in 4x4x4 tiles, each video tile attends the prompt/condition "
                "rows and its top-k tiles (Triton on CUDA), after dense first steps (topk / dense steps: loader "
                "widgets); applies a FastH3 student's learned gates")

register(backend(VSASettings()))


def spec(topk: float, dense_steps: float, precision: str = "bf16") -> AttentionSpec:
    """The engine's attention for these settings (VSASettings checks them: one clear line if bad)."""
    return AttentionSpec("vsa", VSASettings(float(topk), float(dense_steps), precision))
