"""The memory layout of the SeedVR2 VAE's activations: NCDHW, or channels_last_3d (channel stride 1), in which cuDNN
runs its NDHWC conv kernels without transposing each conv's input and output. The VAE's ops allocate what they write
in the layout of what they read, so the layout a pass is entered in holds end to end."""

from __future__ import annotations

from typing import Optional

import torch

# The layout of a VAE pass: "auto" = channels_last_3d on CUDA, True = everywhere (the CPU tests of the layout),
# False = NCDHW everywhere (the benchmarks' "before").
CHANNELS_LAST = "auto"


def channels_last_for(x: torch.Tensor) -> bool:
    """Whether a VAE pass over x runs in channels_last_3d (see CHANNELS_LAST)."""
    return CHANNELS_LAST is True or (CHANNELS_LAST == "auto" and x.is_cuda)


def is_channels_last(x: torch.Tensor) -> bool:
    """x's channel stride is 1 (channels_last_3d or a view of it); a single channel counts as NCDHW."""
    return x.dim() == 5 and x.shape[1] > 1 and x.stride(1) == 1


def empty_like_layout(ref: torch.Tensor, shape, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """An uninitialised 5-D tensor of `shape` on ref's device (ref's dtype unless given), channels_last_3d when
    ref is channels-last."""
    fmt = torch.channels_last_3d if is_channels_last(ref) else torch.contiguous_format
    return torch.empty(tuple(shape), dtype=dtype or ref.dtype, device=ref.device, memory_format=fmt)
