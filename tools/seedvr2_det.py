"""Deterministic tensors for the SeedVR2 golden fixtures, shared by the golden scripts (run in the official code's
venv) and the tests that rebuild the same weights (the fixtures store per-tensor sums, not the weights): values from
exact int64 arithmetic, identical on every platform and torch version. Only torch is imported."""

from __future__ import annotations

import math

import torch


def det_uniform(shape, salt: int) -> torch.Tensor:
    """float32 values in [-1, 1) of `shape`; `salt` picks the stream."""
    x = torch.arange(math.prod(shape), dtype=torch.int64) + salt * 1_000_003
    for _ in range(3):
        x = (x * 1103515245 + 12345) % 2**31
        x = x ^ (x >> 16)
    return (x.double() / 2**30 - 1).float().reshape(tuple(shape))


def det_dit_weights(shapes) -> dict:
    """DiT weights for named shapes (sorted names salt the draws): a matrix [out, in] uniform with variance 1/in; a
    vector 1 + 0.3 u for norm weights and ada scales (they sit around 1), 0.3 u otherwise."""
    out = {}
    for i, name in enumerate(sorted(shapes)):
        u = det_uniform(tuple(shapes[name]), salt=100_000 + i)
        if len(shapes[name]) == 2:
            out[name] = u * (3.0 / shapes[name][1]) ** 0.5
        elif name.endswith("weight") or name.endswith("_scale"):
            out[name] = 1 + 0.3 * u
        else:
            out[name] = 0.3 * u
    return out


def det_vae_weights(shapes, decoder_out_gain: float) -> dict:
    """VAE weights: convs / linears uniform with variance 1/fan_in (the decoder's conv_out scaled by
    `decoder_out_gain`), norm weights 1 + 0.2 u, other vectors 0.1 u; names sorted, salted 200_000 + index."""
    out = {}
    for i, name in enumerate(sorted(shapes)):
        shape = tuple(shapes[name])
        u = det_uniform(shape, salt=200_000 + i)
        if len(shape) >= 2:
            w = u * (3.0 / math.prod(shape[1:])) ** 0.5
            out[name] = w * decoder_out_gain if name.startswith("decoder.conv_out.") else w
        elif "norm" in name and name.endswith("weight"):
            out[name] = 1 + 0.2 * u
        else:
            out[name] = 0.1 * u
    return out
