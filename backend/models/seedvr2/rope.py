"""SeedVR2 window RoPE: the 3B's "mmrope3d" (video and text q/k) and the 7B's "pixel" 3D RoPE (video q/k only).

Equal to the official ``models/dit_v2/rope.py`` (``NaMMRotaryEmbedding3d``, 3B) and ``models/dit/rope.py``
(``NaRotaryEmbedding3d``, 7B) as applied per window in the window attention, which use rotary-embedding-torch's
``get_axial_freqs`` + ``apply_rotary_emb``.

Contract (stated once here):
- A table is ``(cos, sin)``, float32, shape ``[n, rot]``: one row per token of one window in row-major (t, h, w)
  order (or per text token), one column per rotated channel. Windows of equal shape share a table, so a shape
  group ``[G, n, heads, head_dim]`` of window_attention is rotated with one table.
- Rotated channels are the first ``rot`` of each head: ``[t-axis a | h-axis a | w-axis a]`` with ``a`` channels per
  axis; the remaining ``head_dim - rot`` channels are untouched. Inside an axis block frequency j drives the
  *interleaved* pair (2j, 2j+1) (rotary-embedding-torch's ``rotate_half``, not the half-split GPT-NeoX pairing):
  (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin).
- 3B "mmrope3d" (rope_dim = 128 in the released config): axis dim ``d = rope_dim // 3`` (42), ``d // 2`` (21)
  frequencies ``1 / 10000 ** (2j / d)``, so a = 42 and rot = 126 (channels 126, 127 untouched). Positions are
  integers: video token at window-local (dt, dh, dw) -> (L_txt + dt, dh, dw); text token j -> (j, j, j) (the same
  for every window, so the text stays shared).
- 7B "pixel" (module dim = head_dim // 2 = 64): axis dim ``d = 64 // 3`` (21), ``d // 2`` (10) frequencies
  ``linspace(1, 128, 10) * pi``, so a = 20 and rot = 60 (channels 60..127 untouched). Position on an axis of
  window extent n is ``linspace(-1, 1, n)`` (n = 1 gives -1). Text is not rotated.
- Frequencies: the official code rotates with the ``rope.rope.freqs`` buffer each checkpoint stores, so a table
  takes the frequencies the DiT adopted from its checkpoint (dit.py): ``freqs`` (a tuple of their values) and
  ``freqs_dtype`` (the stored dtype's name), both part of the cache key; ``freqs=None`` means the formula below in
  float32 (files without usable buffers, e.g. fp8 ones).
- Precision, as the official code with a buffer of that dtype: positions are cast to ``freqs_dtype``, the angles
  ``position * frequency`` are computed in it (float32 for fp32 files and the formula, whose frequencies come from
  the same ops as the official code), then widened to float32 for cos / sin. Tables are made on the CPU
  (deterministic) and moved to the device. Rotation runs in float32 and returns the input dtype.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Optional, Sequence, Tuple

import torch

Table = Tuple[torch.Tensor, torch.Tensor]

MMROPE_THETA = 10000.0
PIXEL_MAX_FREQ = 256.0


def mmrope3d_frequencies(rope_dim: int = 128) -> torch.Tensor:
    """The 3B's per-axis "lang" frequencies, float32 [(rope_dim // 3) // 2]."""
    d = rope_dim // 3
    if d < 2:
        raise ValueError(f"mmrope3d rope_dim {rope_dim} is too small: it needs at least 6 channels (2 per axis)")
    return 1.0 / (MMROPE_THETA ** (torch.arange(0, d, 2)[: d // 2].float() / d))


def pixel_frequencies(head_dim: int = 128) -> torch.Tensor:
    """The 7B's per-axis "pixel" frequencies, float32 [((head_dim // 2) // 3) // 2]."""
    d = (head_dim // 2) // 3
    if d < 2:
        raise ValueError(f"pixel RoPE head_dim {head_dim} is too small: it needs at least 12 channels")
    return torch.linspace(1.0, PIXEL_MAX_FREQ / 2, d // 2) * math.pi


Freqs = Optional[Tuple[float, ...]]


#: dtypes the angles may be computed in (the stored buffer's); anything else is computed in float32.
ANGLE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _freqs(freqs: Freqs, dtype: str, formula: Callable[[], torch.Tensor]) -> torch.Tensor:
    if freqs is None:
        return formula()
    return torch.tensor(freqs, dtype=torch.float32).to(ANGLE_DTYPES.get(dtype, torch.float32))


def _axis_angles(pos: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    # [n] x [m] -> [n, 2m] in freqs' dtype, each frequency repeated for its interleaved channel pair.
    return (pos.to(freqs.dtype)[:, None] * freqs[None, :]).repeat_interleave(2, dim=-1)


def _table(ang: torch.Tensor, device: str) -> Table:
    ang = ang.float()  # the official code widens the angles to float32 before cos / sin
    return ang.cos().to(device), ang.sin().to(device)


def _grid_angles(axes: Sequence[torch.Tensor], freqs: torch.Tensor) -> torch.Tensor:
    # Positions per axis (t, h, w) -> [t*h*w, 3 * 2m] in row-major (t, h, w) order.
    t, h, w = (_axis_angles(p, freqs) for p in axes)
    nt, nh, nw = t.shape[0], h.shape[0], w.shape[0]
    c = t.shape[1]
    out = torch.cat(
        (
            t[:, None, None, :].expand(nt, nh, nw, c),
            h[None, :, None, :].expand(nt, nh, nw, c),
            w[None, None, :, :].expand(nt, nh, nw, c),
        ),
        dim=-1,
    )
    return out.reshape(nt * nh * nw, 3 * c)


def _check_shape(shape: Sequence[int]) -> Tuple[int, int, int]:
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ValueError(f"window shape {tuple(shape)} must be three positive sizes (t, h, w)")
    return int(shape[0]), int(shape[1]), int(shape[2])


@lru_cache(maxsize=256)
def _mm_video(shape: Tuple[int, int, int], txt_len: int, rope_dim: int, device: str, freqs: Freqs,
              dtype: str) -> Table:
    t, h, w = shape
    ang = _grid_angles(
        (torch.arange(txt_len, txt_len + t), torch.arange(h), torch.arange(w)),
        _freqs(freqs, dtype, lambda: mmrope3d_frequencies(rope_dim)),
    )
    return _table(ang, device)


@lru_cache(maxsize=64)
def _mm_text(txt_len: int, rope_dim: int, device: str, freqs: Freqs, dtype: str) -> Table:
    ang = _axis_angles(torch.arange(txt_len), _freqs(freqs, dtype, lambda: mmrope3d_frequencies(rope_dim)))
    return _table(ang.repeat(1, 3), device)


@lru_cache(maxsize=256)
def _pixel_video(shape: Tuple[int, int, int], head_dim: int, device: str, freqs: Freqs, dtype: str) -> Table:
    axes = tuple(torch.linspace(-1.0, 1.0, n) for n in shape)
    return _table(_grid_angles(axes, _freqs(freqs, dtype, lambda: pixel_frequencies(head_dim))), device)


def _key(freqs: Freqs, count: int) -> Freqs:
    if freqs is None:
        return None
    freqs = tuple(float(f) for f in freqs)
    if len(freqs) != count:
        raise ValueError(f"RoPE needs {count} frequencies per axis, got {len(freqs)}")
    return freqs


def mmrope3d_video_table(
    window_shape: Sequence[int], txt_len: int, rope_dim: int = 128, device: torch.device | str = "cpu",
    freqs: Freqs = None, freqs_dtype: str = "float32",
) -> Table:
    """3B table of one window shape (t, h, w) with L_txt = ``txt_len``: cos/sin [t*h*w, 3 * 2 * ((rope_dim//3)//2)]."""
    if txt_len < 0:
        raise ValueError(f"text length {txt_len} must be >= 0")
    return _mm_video(_check_shape(window_shape), int(txt_len), int(rope_dim), str(torch.device(device)),
                     _key(freqs, (rope_dim // 3) // 2), freqs_dtype)


def mmrope3d_text_table(txt_len: int, rope_dim: int = 128, device: torch.device | str = "cpu",
                        freqs: Freqs = None, freqs_dtype: str = "float32") -> Table:
    """3B text table: cos/sin [txt_len, 3 * 2 * ((rope_dim//3)//2)], text token j at position j on every axis."""
    if txt_len < 0:
        raise ValueError(f"text length {txt_len} must be >= 0")
    return _mm_text(int(txt_len), int(rope_dim), str(torch.device(device)), _key(freqs, (rope_dim // 3) // 2),
                    freqs_dtype)


def pixel_video_table(window_shape: Sequence[int], head_dim: int = 128, device: torch.device | str = "cpu",
                      freqs: Freqs = None, freqs_dtype: str = "float32") -> Table:
    """7B table of one window shape (t, h, w): cos/sin [t*h*w, 3 * 2 * (((head_dim//2)//3)//2)]."""
    return _pixel_video(_check_shape(window_shape), int(head_dim), str(torch.device(device)),
                        _key(freqs, ((head_dim // 2) // 3) // 2), freqs_dtype)


def apply_rope(x: torch.Tensor, table: Table) -> torch.Tensor:
    """Rotate x [..., n, heads, head_dim] with a table [n, rot] (the same rotation for every head and leading
    index, e.g. every window G of a shape group). Channels >= rot pass through unchanged. Returns x's dtype."""
    cos, sin = table
    n, rot = cos.shape
    if x.dim() < 3 or x.shape[-3] != n or x.shape[-1] < rot:
        raise ValueError(
            f"RoPE input has shape {tuple(x.shape)}; expected [..., {n}, heads, head_dim >= {rot}] for this table"
        )
    xf = x.float()
    xr, rest = xf[..., :rot], xf[..., rot:]
    pairs = xr.unflatten(-1, (rot // 2, 2))
    rotated_half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    c = cos.to(device=x.device, dtype=torch.float32)[:, None, :]
    s = sin.to(device=x.device, dtype=torch.float32)[:, None, :]
    out = torch.cat((xr * c + rotated_half * s, rest), dim=-1)
    return out.to(x.dtype)
