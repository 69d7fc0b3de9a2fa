"""Runtime: what one worker rank runs with, built once when the rank starts and handed to its model family's
`build`. Families read their device, parallel context, attention backend, weight policy and compute dtype here;
nothing below a family passes rank/world ints, backend names or dtype strings around.

WeightPolicy is how weights are stored and where they live, applied by the family's one loader. Compute dtype is
separate and explicit: a weight's dtype never decides the arithmetic. By default weights are stored in the compute
dtype (the checkpoint's float32-only modules stay float32) and stay resident on the device; FP8 storage and blocks
streamed from pinned host memory are the shared alternatives, and a family's own policies extend the class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention.registry import AttentionBackend, AttentionSpec, get_backend
from .parallel.context import ParallelContext

# "compute": weights held in the compute dtype. "fp8": the DiT blocks' GEMM weights in float8 e4m3 with per-channel
# scales, run through torch._scaled_mm (CUDA, compute capability 8.9+; models/fp8_linear.py). "fp8_emulated": the
# same quantisation with dequantised fp32 matmuls on any device, for tests and CI (not offered to users).
STORAGES = ("compute", "fp8", "fp8_emulated")
# "resident": every weight on the rank's device for the engine's life; "offload": the main model's blocks in pinned
# host memory, streamed to the device as they run (models/block_offload.py; a family that opts in says how many stay).
PLACEMENTS = ("resident", "offload")


@dataclass(frozen=True)
class WeightPolicy:
    """The capabilities families share: how weights are stored, where they live and, when the main model's blocks
    stream, how many stay on the device. A family with policies of its own (H3's: pipelines/h3/weights.py) extends
    this class; which values a family can apply is its own check."""

    storage: str = "compute"
    placement: str = "resident"
    resident_blocks: int | None = None  # placement "offload": main-model blocks kept on the device; None = auto

    def validate(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"weight storage must be one of {STORAGES}, got {self.storage!r}.")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"weight placement must be one of {PLACEMENTS}, got {self.placement!r}.")
        if self.resident_blocks is not None and (self.placement != "offload" or isinstance(self.resident_blocks, bool)
                                                 or not isinstance(self.resident_blocks, int)
                                                 or self.resident_blocks < 0):
            raise ValueError(f"resident_blocks is a number >= 0 with placement 'offload' (None: auto), got "
                             f"{self.resident_blocks!r} with placement {self.placement!r}.")


@dataclass
class Runtime:
    device: torch.device
    parallel: ParallelContext
    attention: AttentionBackend
    compute_dtype: torch.dtype
    weights: WeightPolicy = field(default_factory=WeightPolicy)
    cpu_threads: int = 0

    @classmethod
    def make(cls, device: str, parallel: ParallelContext, attention: "AttentionSpec | str", compute_dtype: str,
             weights: WeightPolicy | None = None, cpu_threads: int = 0) -> "Runtime":
        weights = weights or WeightPolicy()
        weights.validate()
        backend = get_backend(attention)
        if backend.check_device is not None:
            backend.check_device(torch.device(device))
        return cls(torch.device(device), parallel, backend, getattr(torch, compute_dtype), weights, cpu_threads)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"
