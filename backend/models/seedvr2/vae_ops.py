"""Memory-lean building blocks of the SeedVR2 VAE: causal 3D convs that stream over time slices, and per-frame
GroupNorm / attention / depth-to-space done in bounded pieces.

Every op here is exact: a piece computes the same numbers as the whole op (up to kernel summation order), so the
memory knobs never change results beyond fp32 noise.

- Time: a causal conv pads only the front of time -- on the first slice with copies of frame 0 (the official
  ``extend_head``), on later slices with the frames the previous slice left over (``CausalStream.memory``: the padded
  input from the first frame the previous slice could not use as a window start on; ``kernel - stride`` frames when
  the lengths divide). Slicing the video in time therefore equals the whole pass.
- Space: a conv whose padded input exceeds ``chunk_bytes`` runs in bands of output rows, each band reading its input
  rows plus the kernel's halo (and zero padding only at the frame's real edges), written into one output. This also
  keeps every kernel call below 2**31 elements (large frames otherwise fail in cuDNN).
- GroupNorm works per frame (the official folds time into the batch), in frame chunks, and by channel groups when one
  frame is larger than ``chunk_bytes`` (groups are contiguous channels, so a group chunk is an exact GroupNorm).
- The mid-block attention is per frame over its h*w tokens, one frame at a time, queries in chunks so that no score
  block larger than ``chunk_bytes`` exists even on SDPA's math backend (fused backends never build one).
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_CHUNK_BYTES = 512 * 2**20


class CausalStream:
    """State of one pass over a video cut in time slices: each causal conv's carried frames, whether the current
    slice is the first (front padding by frame 0, the temporal upsamplers drop frame 0's duplicate), whether a later
    slice follows (otherwise nothing is carried), and the memory bound of one piece of work."""

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.chunk_bytes = int(chunk_bytes)
        self.memory: Dict[nn.Module, torch.Tensor] = {}
        self.first = True
        self.keep = False


def _count(size: int, per: int) -> int:
    return max(1, min(size, per))


class CausalConv3d(nn.Conv3d):
    """Conv3d that is causal in time and pads space itself (``spatial_pad`` = top, bottom, left, right zeros).

    The parameters are a plain Conv3d's (same state-dict keys as the official ``InflatedCausalConv3d``); the module's
    own padding is 0 and ``front`` frames are prepended in time (``2 * official temporal padding``).
    """

    def __init__(self, cin: int, cout: int, kernel, stride=1, front: int = 0,
                 spatial_pad: Tuple[int, int, int, int] = (0, 0, 0, 0), bias: bool = True):
        super().__init__(cin, cout, kernel, stride=stride, padding=0, bias=bias)
        self.front = front
        self.spatial_pad = tuple(spatial_pad)

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:  # type: ignore[override]
        kt, kh, kw = self.kernel_size
        st, sh, sw = self.stride
        if stream.first:
            head = x[:, :, :1].expand(-1, -1, self.front, -1, -1) if self.front else None
        else:
            head = stream.memory.pop(self, None)
        nh = 0 if head is None else head.shape[2]
        tp = nh + x.shape[2]
        if tp < kt:
            raise ValueError(f"causal conv needs {kt} frames, got {tp} (a time slice too short)")
        t_out = (tp - kt) // st + 1
        if stream.keep and t_out * st < tp:
            start = t_out * st  # the first window start this slice cannot take: carried to the next slice
            parts = ([head[:, :, start:]] if start < nh else []) + [x[:, :, max(0, start - nh):]]
            stream.memory[self] = torch.cat(parts, 2)  # a copy: never keeps the whole slice alive
        return self._conv(head, x, nh, tp, t_out, stream.chunk_bytes)

    def _conv(self, head, x, nh, tp, t_out, chunk_bytes) -> torch.Tensor:
        b, c, _, h, w = x.shape
        kt, kh, kw = self.kernel_size
        st, sh, sw = self.stride
        top, bottom, left, right = self.spatial_pad
        h_out = (h + top + bottom - kh) // sh + 1
        w_out = (w + left + right - kw) // sw + 1
        # output rows per band: its padded input ((rows - 1) * sh + kh rows) stays within chunk_bytes
        in_row_bytes = b * c * tp * (w + left + right) * x.element_size()
        rows = _count(h_out, (chunk_bytes // max(in_row_bytes, 1) - kh) // sh + 1)
        if rows >= h_out:
            return F.conv3d(self._padded(head, x, nh, tp, 0, h_out), self.weight, self.bias, self.stride)
        out = x.new_empty(b, self.out_channels, t_out, h_out, w_out)
        for r0 in range(0, h_out, rows):
            r1 = min(h_out, r0 + rows)
            out[:, :, :, r0:r1] = F.conv3d(self._padded(head, x, nh, tp, r0, r1), self.weight, self.bias, self.stride)
        return out

    def _padded(self, head, x, nh, tp, r0, r1) -> torch.Tensor:
        """The zero-padded, time-extended input of output rows [r0, r1): one buffer, one copy of each source."""
        b, c, t, h, w = x.shape
        kh, sh = self.kernel_size[1], self.stride[1]
        top, bottom, left, right = self.spatial_pad
        lo, hi = r0 * sh - top, (r1 - 1) * sh + kh - top  # input rows, may reach into the padding
        a, z = max(lo, 0), min(hi, h)
        pad_top, pad_bottom = a - lo, hi - z
        if nh == 0 and not (pad_top or pad_bottom or left or right):
            return x[:, :, :, a:z]
        buf = x.new_empty(b, c, tp, hi - lo, w + left + right)
        for sl in (buf[:, :, :, :pad_top], buf[:, :, :, hi - lo - pad_bottom:], buf[..., :left], buf[..., w + left:]):
            sl.zero_()
        inner = buf[:, :, :, pad_top:pad_top + z - a, left:left + w]
        if nh:
            inner[:, :, :nh].copy_(head[:, :, :, a:z])
        inner[:, :, nh:].copy_(x[:, :, :, a:z])
        return buf


def group_norm(norm: nn.GroupNorm, x: torch.Tensor, chunk_bytes: int, silu: bool = False) -> torch.Tensor:
    """GroupNorm of each frame of x [B, C, T, H, W] (optionally followed by SiLU), in frame / group chunks."""
    b, c, t, h, w = x.shape
    out = torch.empty_like(x)
    frame_bytes = b * c * h * w * x.element_size()
    groups = norm.num_groups
    per_group = c // groups
    if frame_bytes <= chunk_bytes:
        g_step = groups
    else:  # largest divisor of the group count whose channel chunk fits (at least one group)
        fit = max(1, chunk_bytes * groups // frame_bytes)
        g_step = max(d for d in range(1, groups + 1) if groups % d == 0 and d <= fit)
    frames = _count(t, chunk_bytes // max(frame_bytes, 1))
    for t0 in range(0, t, frames):
        t1 = min(t, t0 + frames)
        xt = x[:, :, t0:t1].transpose(1, 2).reshape(b * (t1 - t0), c, h, w)
        for g0 in range(0, groups, g_step):
            c0, c1 = g0 * per_group, (g0 + g_step) * per_group
            y = F.group_norm(xt[:, c0:c1], g_step, norm.weight[c0:c1], norm.bias[c0:c1], norm.eps)
            if silu:
                y = F.silu(y, inplace=True)
            out[:, c0:c1, t0:t1] = y.reshape(b, t1 - t0, c1 - c0, h, w).transpose(1, 2)
        del xt
    return out


class FrameAttention(nn.Module):
    """The mid block's single-head self-attention over each frame's h*w tokens (the official diffusers ``Attention``
    with a GroupNorm, biased q/k/v/out projections and the residual); state-dict names are the official ones."""

    def __init__(self, channels: int, groups: int, eps: float):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=eps)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x: torch.Tensor, chunk_bytes: int) -> torch.Tensor:
        b, c, t, h, w = x.shape
        n = h * w
        out = torch.empty_like(x)
        gn = self.group_norm
        # rows of queries whose fp32 score block stays under chunk_bytes
        q_rows = _count(n, chunk_bytes // (4 * n))
        for i in range(b):
            for j in range(t):
                frame = x[i, :, j]
                tok = F.group_norm(frame.unsqueeze(0), gn.num_groups, gn.weight, gn.bias, gn.eps)
                tok = tok.reshape(c, n).t()
                q, k, v = self.to_q(tok), self.to_k(tok), self.to_v(tok)
                del tok
                k, v = k[None, None], v[None, None]
                att = torch.empty_like(q)
                for r0 in range(0, n, q_rows):
                    att[r0:r0 + q_rows] = F.scaled_dot_product_attention(q[None, None, r0:r0 + q_rows], k, v)[0, 0]
                del q, k, v
                y = self.to_out[0](att)
                del att
                out[i, :, j] = y.t().reshape(c, h, w) + frame
        return out


def depth_to_space(conv: nn.Conv3d, x: torch.Tensor, s: int, r: int, drop_first_dup: bool,
                   chunk_bytes: int) -> torch.Tensor:
    """The official upsampler's ``upscale_conv`` (1x1x1, C -> s*s*r*C) and depth-to-space with channel index
    (x, y, z, c), c fastest: out[c, f*r + z, h*s + x, w*s + y]. ``drop_first_dup``: remove frame 1 (frame 0's copy,
    the first slice of a temporal upsample). Done one input frame and a band of rows at a time."""
    b, c, t, h, w = x.shape
    t_out = t * r - (1 if drop_first_dup else 0)
    out = x.new_empty(b, c, t_out, h * s, w * s)
    rows = _count(h, chunk_bytes // max(2 * b * c * s * s * r * w * x.element_size(), 1))
    for f in range(t):
        for r0 in range(0, h, rows):
            r1 = min(h, r0 + rows)
            u = F.conv3d(x[:, :, f:f + 1, r0:r1], conv.weight, conv.bias)
            u = u.view(b, s, s, r, c, r1 - r0, w).permute(0, 4, 3, 5, 1, 6, 2).reshape(b, c, r, (r1 - r0) * s, w * s)
            for z in range(r):
                k = f * r + z
                if drop_first_dup and k == 1:
                    continue
                k -= 1 if drop_first_dup and k > 1 else 0
                out[:, :, k, r0 * s:r1 * s] = u[:, :, z]
    return out
