"""Requests take finite numbers only: a NaN or an infinity in a mask, a frame, a waveform or a latent spreads through
the whole denoise (attention mixes every row) and comes out as a black, silent clip with NaN latents. Checked where a
request is validated, naming the input, in slices so a long float clip needs no full-size temporary."""

from __future__ import annotations

import math

import numpy as np
import torch

from .errors import RequestError

_SLICE = 16  # first-axis items per check: bounds the boolean temporary for a long clip


def count_non_finite(value) -> int:
    """How many NaN / infinite entries a float tensor, array or number has (0 for integer data and None)."""
    if value is None:
        return 0
    if isinstance(value, (bool, int, np.integer)):
        return 0
    if isinstance(value, (float, np.floating)):
        return 0 if math.isfinite(value) else 1
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return 0
        parts = value.split(_SLICE) if value.ndim else [value]
        return sum(int((~torch.isfinite(part)).sum()) for part in parts)
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        return 0
    parts = [array[i:i + _SLICE] for i in range(0, len(array), _SLICE)] if array.ndim else [array]
    return sum(int(np.count_nonzero(~np.isfinite(part))) for part in parts)


def check_finite(value, what: str) -> None:
    """RequestError naming `what` when `value` (tensor, array or number; None passes) holds NaN or infinity."""
    bad = count_non_finite(value)
    if not bad:
        return
    if np.ndim(value) == 0 and not isinstance(value, torch.Tensor):
        raise RequestError(f"The {what} must be a finite number, got {value}.")
    total = value.numel() if isinstance(value, torch.Tensor) else np.size(value)
    raise RequestError(f"The {what} holds {bad} NaN or infinite value(s) of {total}: fix the input that made it "
                       "(MiniMax-H3 would turn it into a black, silent result).")
