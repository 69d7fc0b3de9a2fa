"""Small tensor ops the H3 DiT is built from: timestep sinusoid, 3-axis rotary, row-segment AdaLN modulation.

Row segments: the packed sequence is a few long runs of rows sharing one AdaLN table row (the target video is one
run of ~70k rows, text/vision tokens a handful of short ones). Modulating per run with broadcast in-place ops reads
and writes each row once and never materialises the `[seq, hidden]` per-row gathers a naive `table[row_index]` makes
(six of them per block, 0.8 GB each at the 10-s shape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def timestep_sinusoid(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[N] timesteps in [0, 1] -> [N, dim] float32 embedding, cos half first (flip_sin_to_cos, no freq shift)."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    angles = timesteps.float()[:, None] * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    if dim % 2:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


def rope_inv_freq(freq_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, 2 * freq_dim, 2, dtype=torch.float32) / (2 * freq_dim)))


def rope_tables(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids [seq, 3] (t, h, w; any float dtype, cast to fp32 like the released model) -> cos, sin
    [seq, 6 * freq_dim] fp32: per axis `freq_dim` angles, axes concatenated, then the block repeated once so the
    rotate-half pairing (i, i + 3 * freq_dim) shares an angle."""
    angles = position_ids.to(torch.float32)[:, :, None] * inv_freq.to(position_ids.device)[None, None, :]
    angles = angles.flatten(1)  # [seq, 3 * F] in (t..., h..., w...) order
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the leading `cos.shape[-1]` channels of every head of x [B, S, H, D] (rotate-half convention).
    Returns a new tensor; the tail channels pass through."""
    rot = cos.shape[-1]
    half = rot // 2
    c = cos.to(x.dtype)[None, :, None, :]
    s = sin.to(x.dtype)[None, :, None, :]
    x_rot = x[..., :rot]
    x1, x2 = x_rot[..., :half], x_rot[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    out = torch.empty_like(x)
    out[..., :rot] = x_rot * c + rotated * s
    out[..., rot:] = x[..., rot:]
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


@dataclass(frozen=True)
class RowSegments:
    """Runs of consecutive packed rows that share one table row: `(start, stop, table_row)` triples, host-side.

    Built once per forward from a host tensor (the layout is built on the host), so applying it never syncs
    with the device."""

    runs: tuple[tuple[int, int, int], ...]

    @staticmethod
    def from_rows(table_rows: torch.Tensor) -> "RowSegments":
        rows = table_rows.detach().cpu().to(torch.long)
        if rows.numel() == 0:
            return RowSegments(())
        change = torch.nonzero(rows[1:] != rows[:-1]).flatten() + 1
        starts = [0] + change.tolist()
        stops = change.tolist() + [rows.numel()]
        values = rows[starts].tolist()
        return RowSegments(tuple(zip(starts, stops, values)))

    def modulate_(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """In place on x [B, S, C]: x = x * (1 + scale[row]) + shift[row]; scale/shift [R, C]."""
        for start, stop, r in self.runs:
            x[:, start:stop].mul_(1.0 + scale[r]).add_(shift[r])
        return x

    def gated_add_(self, x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """In place on x [B, S, C]: x += gate[row] * y."""
        for start, stop, r in self.runs:
            x[:, start:stop].addcmul_(gate[r], y[:, start:stop])
        return x
