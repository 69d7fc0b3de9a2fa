"""Memory-lean building blocks of the SeedVR2 VAE: causal 3D convs that stream over time slices, and per-frame
GroupNorm / attention / depth-to-space done in bounded pieces.

Every op here is exact: a piece computes the same numbers as the whole op (up to summation order), so the memory
knobs never change results beyond fp32 noise.

- Time: a causal conv pads only the front of time -- on the first slice with copies of frame 0 (the official
  ``extend_head``), on later slices with the frames the previous slice left over (``CausalStream.memory``: the padded
  input from the first window start the slice could not take; ``kernel - stride`` frames when the lengths divide).
  Slicing the video in time therefore equals the whole pass.
- Space: a conv runs in bands of output rows whose padded input (kernel halo included, zero padding only at the
  frame's real edges) fits ``chunk_bytes``, written into one output. This also keeps every kernel call below 2**31
  elements (larger inputs fail in cuDNN). In channels_last_3d on CUDA each output frame of a band is written in place
  by cuDNN (a frame's rows are contiguous there), so banding costs no copy of the output.
- GroupNorm is per frame (the official folds time into the batch). ``FrameGroupNorm`` takes each (frame, group)'s
  statistics first, in fp32 over bounded chunks, then normalises (+ SiLU) any piece on demand: a conv preceded by a
  norm applies it to each band it reads, so the normalised activation is never materialised whole. (PyTorch's own
  GroupNorm kernel also runs one block per (frame, group): slow on large frames.)
- The mid-block attention is per frame over its h*w tokens, one frame at a time: in bf16 / fp16 on CUDA as two GEMMs
  around a softmax kernel on query chunks (its 512-wide head is past the fast fused kernels), otherwise on SDPA's
  fused kernels (no score matrix); where none applies, the math kernel runs on query chunks whose scores fit
  ``chunk_bytes``.
- Layout: every op here takes any strides and allocates what it writes in the layout of what it reads
  (vae_layout.py), so a pass entered in ``channels_last_3d`` (the VAE does so on CUDA)
  stays in it end to end: cuDNN then runs its NDHWC kernels without transposing each conv's input and output.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .vae_layout import empty_like_layout, is_channels_last

DEFAULT_CHUNK_BYTES = 512 * 2**20
MAX_CONV_ELEMENTS = 2**31 - 1  # per conv call, input and output (cuDNN's 32-bit-indexed kernels)
# GroupNorm statistics and normalisation by the Triton kernels of vae_kernels.py on CUDA tensors (and on CPU ones
# under TRITON_INTERPRET=1, for the tests): one read of the activation, the result written straight into the next
# conv's padded input. False: the torch path below everywhere (the benchmarks' "before").
NORM_KERNELS = True
# Banded convs on channels-last CUDA tensors write their output frames in place (conv_into): True; False: every
# band's result is copied into the output (the benchmarks' "before"); "everywhere": on the CPU too (the tests).
DIRECT_BAND_WRITES = True
_CUDNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The mid block's 512-wide single-head attention in bf16 / fp16 on CUDA as GEMMs around a Triton softmax (True);
# False: SDPA's fused kernels (the benchmarks' "before"); "everywhere": also on the CPU under TRITON_INTERPRET=1.
GEMM_ATTENTION = True
# Copies between channels-last views (a band's carried frames and plain inputs) by vae_kernels.copy_rows on CUDA
# (True); False: torch's copy_ (the benchmarks' "before"); "everywhere": on the CPU too under TRITON_INTERPRET=1.
ROW_COPIES = True
# torch.mm's fp32-result form for low-precision inputs (out_dtype; torch >= 2.8): the GEMM attention's scores
_MM_FP32_OUT = "dtype" in torch.ops.aten.mm.overloads()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.lru_cache(maxsize=None)
def _triton_available() -> bool:
    try:
        from . import vae_kernels  # noqa: F401  (triton)
    except ImportError:
        return False
    return True


def _kernels_for(x: torch.Tensor, flag, interpreted: bool = False) -> bool:
    """Whether a Triton kernel of vae_kernels.py serves x under its module flag (one of the switches above): on
    CUDA when the flag is set; on the CPU only under TRITON_INTERPRET=1 (the tests), where the flag is "everywhere"
    or ``interpreted`` makes the kernel the CPU path whenever the interpreter runs."""
    if not flag:
        return False
    if not x.is_cuda and not (x.device.type == "cpu" and _interpreting() and (interpreted or flag == "everywhere")):
        return False
    return _triton_available()


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src); channels-last views on CUDA by vae_kernels.copy_rows (torch's copy of such views takes its
    generic strided kernel, several times slower for the carried frames and plain inputs of every band)."""
    if dst.dim() == 5 and dst.dtype == src.dtype and dst.shape == src.shape and _kernels_for(dst, ROW_COPIES):
        from .vae_kernels import copy_rows, rows_are_runs

        if rows_are_runs(dst) and rows_are_runs(src):
            copy_rows(dst, src)
            return
    dst.copy_(src)


def _writes_frames_in_place(x: torch.Tensor) -> bool:
    """Whether a banded conv over x writes each output frame's rows into the output directly (cuDNN's out= form,
    channels-last CUDA tensors) instead of copying every band's result into it."""
    if not DIRECT_BAND_WRITES or not is_channels_last(x) or x.shape[0] != 1:  # batch 1: a frame's rows are contiguous
        return False
    if x.is_cuda:
        return torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled and x.dtype in _CUDNN_DTYPES
    return DIRECT_BAND_WRITES == "everywhere"


def conv_into(x: torch.Tensor, weight: torch.Tensor, stride: Tuple[int, int, int], out: torch.Tensor) -> None:
    """out = conv3d(x, weight) without bias or padding, written into ``out`` (a channels-last view of the right
    shape). On CUDA cuDNN writes it in place; elsewhere (the CPU tests of the banding) through a copy."""
    if not x.is_cuda:
        out.copy_(F.conv3d(x, weight, None, stride))
        return
    cudnn = torch.backends.cudnn
    torch.ops.aten.cudnn_convolution.out(x, weight, [0, 0, 0], list(stride), [1, 1, 1], 1, cudnn.benchmark,
                                         cudnn.deterministic or torch.are_deterministic_algorithms_enabled(),
                                         cudnn.allow_tf32, out=out)


def norm_kernels_for(x: torch.Tensor) -> bool:
    """Whether the Triton GroupNorm kernels (statistics, normalisation) serve x."""
    return _kernels_for(x, NORM_KERNELS, interpreted=True)


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
        self.piece_frames: Optional[int] = None  # vae.in_pieces: frames per piece of the full-rate layers

    def extend(self, conv: "CausalConv3d", x: torch.Tensor, pre: Optional["FrameGroupNorm"]) -> "TimeExtended":
        """conv's time-extended input of this slice (front copies of frame 0 in the first slice, else the frames the
        previous slice carried), keeping this slice's leftover for the next one. Streams over ranks override it
        (backend/parallel/seedvr2_vae_shard.py: the carried frames come from and go to the neighbouring ranks)."""
        head = None if self.first else self.memory.pop(conv, None)
        nh = conv.front if self.first else (0 if head is None else head.shape[2])
        src = TimeExtended(x, head, nh, pre)
        t_out = conv.frames_out(src.length)
        if self.keep and t_out * conv.stride[0] < src.length:  # the first window start it cannot take, onwards
            self.memory[conv] = src.gather(t_out * conv.stride[0], src.length, self.chunk_bytes)
        return src


def _count(size: int, per: int) -> int:
    return max(1, min(size, per))


class FrameGroupNorm:
    """GroupNorm (+ optional SiLU) of every frame of x [B, C, T, H, W], computed lazily: statistics now (fp32, one
    frame / group chunk at a time), normalisation of any piece ``x[:, :, t0:t1, rows]`` when called."""

    def __init__(self, norm: nn.GroupNorm, x: torch.Tensor, chunk_bytes: int, silu: bool,
                 stats: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
        """``stats``: (mean, rstd), fp32 [B, G, T], to normalise with instead of x's own (the tiled VAE's frame
        statistics): then x is not read here."""
        b, c, t, h, w = x.shape
        self.norm, self.silu, self.dtype = norm, silu, x.dtype
        g = norm.num_groups
        cg = c // g
        self.fused = norm_kernels_for(x)
        if self.fused:
            self.weight, self.bias = norm.weight.float().contiguous(), norm.bias.float().contiguous()
        if stats is not None:
            self.mean, self.rstd = stats
            return
        if self.fused:
            from .vae_kernels import group_stats

            self.mean, self.rstd = group_stats(x, g, norm.eps)
            return
        self.mean = torch.empty(b, g, t, device=x.device, dtype=torch.float32)
        self.rstd = torch.empty_like(self.mean)
        group_frame = b * cg * h * w * 4  # fp32 bytes of one group of one frame
        groups = _count(g, chunk_bytes // (group_frame * 2))
        frames = _count(t, chunk_bytes // (group_frame * groups * 2))
        for g0 in range(0, g, groups):
            g1 = min(g, g0 + groups)
            for t0 in range(0, t, frames):
                t1 = min(t, t0 + frames)
                part = x[:, g0 * cg:g1 * cg, t0:t1].float().reshape(b, g1 - g0, cg, t1 - t0, h * w)
                var, mean = torch.var_mean(part, dim=(2, 4), correction=0)
                self.mean[:, g0:g1, t0:t1] = mean
                self.rstd[:, g0:g1, t0:t1] = (var + norm.eps).rsqrt_()

    def __call__(self, part: torch.Tensor, t0: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Normalise ``part`` = x[:, :, t0:t0 + n, <any rows>, <any cols>] (all channels), into ``out`` (part's
        shape, any strides) when given."""
        if self.fused:
            from .vae_kernels import norm_apply

            if out is None:
                out = empty_like_layout(part, part.shape, self.dtype)
            return norm_apply(part, t0, self.mean, self.rstd, self.weight, self.bias, self.silu, out)
        y = self._torch(part, t0)
        if out is None:
            out = empty_like_layout(part, part.shape, self.dtype)
        return out.copy_(y)

    def _torch(self, part: torch.Tensor, t0: int) -> torch.Tensor:
        b, c, n, h, w = part.shape
        g = self.norm.num_groups
        shape = (b, g, 1, n, 1)
        y = (part.float().reshape(b, g, c // g, n, h * w) - self.mean[:, :, t0:t0 + n].reshape(shape))
        y = y.mul_(self.rstd[:, :, t0:t0 + n].reshape(shape)).view(b, c, n, h, w)
        y = y.mul_(self.norm.weight.float().view(c, 1, 1, 1)).add_(self.norm.bias.float().view(c, 1, 1, 1))
        if self.silu:
            y = F.silu(y, inplace=True)
        return y.to(self.dtype)

    def bytes_per_element(self, x: torch.Tensor) -> int:
        """Temporary bytes per input element while normalising a piece into a given buffer (torch: fp32 work copy,
        result, cast; the kernels: none)."""
        return 0 if self.fused else 8 + x.element_size()


def group_norm(norm: nn.GroupNorm, x: torch.Tensor, chunk_bytes: int, silu: bool = False) -> torch.Tensor:
    """GroupNorm of each frame of x [B, C, T, H, W] (optionally followed by SiLU), materialised in bounded pieces."""
    fn = FrameGroupNorm(norm, x, chunk_bytes, silu)
    b, c, t, h, w = x.shape
    out = torch.empty_like(x)
    row = b * c * w * (x.element_size() + fn.bytes_per_element(x))
    rows = _count(h, chunk_bytes // row)
    frames = _count(t, chunk_bytes // (row * h)) if rows == h else 1
    for t0 in range(0, t, frames):
        for r0 in range(0, h, rows):
            fn(x[:, :, t0:t0 + frames, r0:r0 + rows], t0, out[:, :, t0:t0 + frames, r0:r0 + rows])
    return out


class CausalConv3d(nn.Conv3d):
    """Conv3d that is causal in time and pads space itself (``spatial_pad`` = top, bottom, left, right zeros).

    The parameters are a plain Conv3d's (same state-dict keys as the official ``InflatedCausalConv3d``); the module's
    own padding is 0 and ``front`` frames are prepended in time (``2 * official temporal padding``). ``forward``'s
    ``pre`` (a FrameGroupNorm of x) is applied to x on the fly, band by band.
    """

    def __init__(self, cin: int, cout: int, kernel, stride=1, front: int = 0,
                 spatial_pad: Tuple[int, int, int, int] = (0, 0, 0, 0), bias: bool = True):
        super().__init__(cin, cout, kernel, stride=stride, padding=0, bias=bias)
        self.front = front
        self.spatial_pad = tuple(spatial_pad)

    def forward(self, x: torch.Tensor, stream: CausalStream,  # type: ignore[override]
                pre: Optional[FrameGroupNorm] = None) -> torch.Tensor:
        src = stream.extend(self, x, pre)
        return self._conv(src, self.frames_out(src.length), stream.chunk_bytes)

    def frames_out(self, length: int) -> int:
        """Output frames of a time-extended input of `length` frames."""
        kt, st = self.kernel_size[0], self.stride[0]
        if length < kt:
            raise ValueError(f"causal conv needs {kt} frames, got {length} (a time slice too short)")
        return (length - kt) // st + 1

    def _conv(self, src: "TimeExtended", t_out: int, chunk_bytes: int) -> torch.Tensor:
        x = src.x
        b, c, _, h, w = x.shape
        kh, sh = self.kernel_size[1], self.stride[1]
        top, bottom, left, right = self.spatial_pad
        h_out = (h + top + bottom - kh) // sh + 1
        w_out = (w + left + right - self.kernel_size[2]) // self.stride[2] + 1
        # output rows per band: its padded input ((rows - 1) * sh + kh rows) and temporaries fit chunk_bytes, and
        # its output stays below 2**31 elements (past that cuDNN falls back to a direct kernel ~10x slower: the
        # 3 -> 128 input conv of a 5-frame 2688x1536 slice is 2.6e9 elements out of 0.09e9 in)
        per_row = b * c * src.length * (w + left + right) * src.bytes_per_element()
        rows = _count(h_out, min((chunk_bytes // max(per_row, 1) - kh) // sh + 1,
                                 MAX_CONV_ELEMENTS // max(b * self.out_channels * t_out * w_out, 1)))
        if rows >= h_out:
            return F.conv3d(self._padded(src, 0, h_out), self.weight, self.bias, self.stride)
        out = empty_like_layout(x, (b, self.out_channels, t_out, h_out, w_out))
        direct = _writes_frames_in_place(x)
        for r0 in range(0, h_out, rows):
            r1 = min(h_out, r0 + rows)
            padded = self._padded(src, r0, r1)
            if direct:
                self._frames_into(padded, out[:, :, :, r0:r1])
            else:
                out[:, :, :, r0:r1] = F.conv3d(padded, self.weight, self.bias, self.stride)
        if direct and self.bias is not None:
            out.add_(self.bias.view(1, -1, 1, 1, 1))  # once over the whole output (torch adds it after cuDNN too)
        return out

    def _frames_into(self, padded: torch.Tensor, dst: torch.Tensor) -> None:
        """The conv (bias excluded) of a padded row band, one output frame at a time, straight into dst
        [B, C_out, T_out, rows, W_out] (a row band of a channels-last output). One frame of a row band is contiguous
        in channels_last_3d, as is a window of frames of the padded band, so nothing is copied before or after."""
        kt, st = self.kernel_size[0], self.stride[0]
        for j in range(dst.shape[2]):
            conv_into(padded[:, :, j * st:j * st + kt], self.weight, (1,) + tuple(self.stride[1:]), dst[:, :, j:j + 1])

    def _padded(self, src: "TimeExtended", r0: int, r1: int) -> torch.Tensor:
        """The zero-padded, time-extended input of output rows [r0, r1)."""
        x = src.x
        b, c, _, h, w = x.shape
        kh, sh = self.kernel_size[1], self.stride[1]
        top, bottom, left, right = self.spatial_pad
        lo, hi = r0 * sh - top, (r1 - 1) * sh + kh - top  # input rows, may reach into the padding
        a, z = max(lo, 0), min(hi, h)
        pad_top, pad_bottom = a - lo, hi - z
        if src.nh == 0 and src.pre is None and not (pad_top or pad_bottom or left or right):
            return x[:, :, :, a:z]  # the input itself: no copy
        buf = empty_like_layout(x, (b, c, src.length, hi - lo, w + left + right))
        for sl in (buf[:, :, :, :pad_top], buf[:, :, :, hi - lo - pad_bottom:], buf[..., :left], buf[..., w + left:]):
            sl.zero_()
        src.write(buf[:, :, :, pad_top:pad_top + z - a, left:left + w], 0, src.length, a, z)
        return buf


class TimeExtended:
    """The time-extended input of a causal conv: ``nh`` head frames (the carried ``head`` or, when it is None,
    copies of frame 0) then x, with ``pre`` applied to x's frames (the carried head already has it)."""

    def __init__(self, x: torch.Tensor, head: Optional[torch.Tensor], nh: int, pre: Optional[FrameGroupNorm]):
        self.x, self.head, self.nh, self.pre = x, head, nh, pre
        self.length = nh + x.shape[2]

    def bytes_per_element(self) -> int:
        return self.x.element_size() + (self.pre.bytes_per_element(self.x) if self.pre else 0)

    def _x_into(self, t0: int, t1: int, a: int, z: int, dst: torch.Tensor) -> None:
        part = self.x[:, :, t0:t1, a:z]
        if self.pre is not None:
            self.pre(part, t0, dst)
        else:
            _copy(dst, part)

    def write(self, dst: torch.Tensor, p0: int, p1: int, a: int, z: int) -> None:
        """Write frames [p0, p1) of the extended input, rows [a, z), into dst [B, C, p1 - p0, z - a, W] (any
        strides): the head frames (carried, or frame 0 normalised once and copied), then x's frames."""
        t = 0
        if p0 < self.nh:
            n = min(p1, self.nh) - p0
            if self.head is not None:
                _copy(dst[:, :, :n], self.head[:, :, p0:p0 + n, a:z])
            else:
                self._x_into(0, 1, a, z, dst[:, :, :1])
                if n > 1:
                    _copy(dst[:, :, 1:n], dst[:, :, :1].expand(-1, -1, n - 1, -1, -1))
            t = n
        if p1 > self.nh:
            t0 = max(p0, self.nh) - self.nh
            self._x_into(t0, p1 - self.nh, a, z, dst[:, :, t:])

    def gather(self, p0: int, p1: int, chunk_bytes: int) -> torch.Tensor:
        """Frames [p0, p1) as one new tensor (never a view that would keep x alive), built in row bands."""
        b, c, _, h, w = self.x.shape
        out = empty_like_layout(self.x, (b, c, p1 - p0, h, w))
        rows = _count(h, chunk_bytes // max(b * c * (p1 - p0) * w * self.bytes_per_element(), 1))
        for a in range(0, h, rows):
            z = min(h, a + rows)
            self.write(out[:, :, :, a:z], p0, p1, a, z)
        return out


def _sdpa_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[torch.Tensor]:
    """SDPA restricted to the kernels that never build the score matrix; None where none of them applies."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        return None
    fused = [getattr(SDPBackend, n) for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
             if hasattr(SDPBackend, n)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns why each refused kernel does not apply
            with sdpa_kernel(fused):
                return F.scaled_dot_product_attention(q, k, v)
    except RuntimeError:
        return None


def _gemm_attention_for(q: torch.Tensor) -> bool:
    """Whether the mid block's attention runs as two GEMMs around the softmax kernel: CUDA bf16 / fp16 with a head
    wider than the fused SDPA kernels' fast forms (256); there SDPA's memory-efficient kernel keeps its output in
    global memory and runs at ~125 TFLOP/s on an H200 (docs/BENCHMARKS.md). fp32 keeps SDPA (the goldens' path)."""
    if not _MM_FP32_OUT or q.shape[-1] <= 256 or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    return _kernels_for(q, GEMM_ATTENTION)


def _scores(q: torch.Tensor, kt: torch.Tensor) -> torch.Tensor:
    """q @ kt accumulated and returned in fp32 (cuBLAS's low-precision GEMM with an fp32 result on CUDA)."""
    if q.is_cuda:
        return torch.mm(q, kt, out_dtype=torch.float32)
    return torch.mm(q.float(), kt.float())  # the interpreted tests' CPU stand-in


def _gemm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_bytes: int) -> torch.Tensor:
    """Single-head attention of q, k, v [B, 1, N, D] as S = q k^T in fp32 (query chunks whose scores and
    probabilities fit chunk_bytes), P = softmax(S / sqrt(D)) rounded to q's dtype, P v -- the numerics of a flash
    kernel (fp32 scores, low-precision probabilities, fp32 accumulation), without its head-width limit."""
    from .vae_kernels import softmax_rows

    b, _, n, d = q.shape
    scale = d ** -0.5
    out = torch.empty_like(q)
    rows = _count(n, chunk_bytes // max((4 + q.element_size()) * n, 1))
    for i in range(b):
        kt, vi = k[i, 0].t(), v[i, 0]
        for r0 in range(0, n, rows):
            p = softmax_rows(_scores(q[i, 0, r0:r0 + rows], kt), scale, q.dtype)
            if p.is_cuda:
                torch.mm(p, vi, out=out[i, 0, r0:r0 + rows])  # fp32 accumulation, one rounding
            else:
                out[i, 0, r0:r0 + rows] = torch.mm(p.float(), vi.float())  # the CPU stand-in, rounded once too
            del p
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
        norm = FrameGroupNorm(self.group_norm, x, chunk_bytes, silu=False)
        for j in range(t):
            tok = norm(x[:, :, j:j + 1], j).reshape(b, c, n).transpose(1, 2)
            q, k, v = (proj(tok)[:, None] for proj in (self.to_q, self.to_k, self.to_v))
            del tok
            att = _gemm_attention(q, k, v, chunk_bytes) if _gemm_attention_for(q) else _sdpa_fused(q, k, v)
            if att is None:  # math kernel: query chunks whose fp32 scores fit chunk_bytes
                att = torch.empty_like(q)
                rows = _count(n, chunk_bytes // (4 * n * b))
                for r0 in range(0, n, rows):
                    att[:, :, r0:r0 + rows] = F.scaled_dot_product_attention(q[:, :, r0:r0 + rows], k, v)
            del q, k, v
            y = self.to_out[0](att[:, 0])
            del att
            out[:, :, j] = y.transpose(1, 2).reshape(b, c, h, w) + x[:, :, j]
        return out


def depth_to_space(conv: nn.Conv3d, x: torch.Tensor, s: int, r: int, drop_first_dup: bool,
                   chunk_bytes: int) -> torch.Tensor:
    """The official upsampler's ``upscale_conv`` (1x1x1, C -> s*s*r*C) and depth-to-space with channel index
    (x, y, z, c), c fastest: out[c, f*r + z, h*s + x, w*s + y]. ``drop_first_dup``: remove frame 1 (frame 0's copy,
    the first slice of a temporal upsample). Done one input frame and a band of rows at a time."""
    b, c, t, h, w = x.shape
    t_out = t * r - (1 if drop_first_dup else 0)
    out = empty_like_layout(x, (b, c, t_out, h * s, w * s))
    rows = _count(h, chunk_bytes // max(b * c * s * s * r * w * x.element_size(), 1))
    for f in range(t):
        for r0 in range(0, h, rows):
            r1 = min(h, r0 + rows)
            # [b, x, y, z, c, rows, w]: splitting a dimension is a view in any layout, so each output frame is one
            # strided copy (channels stay the fastest index on both sides in channels_last_3d)
            u = F.conv3d(x[:, :, f:f + 1, r0:r1], conv.weight, conv.bias)[:, :, 0].unflatten(1, (s, s, r, c))
            for z in range(r):
                k = f * r + z
                if drop_first_dup and k == 1:
                    continue
                k -= 1 if drop_first_dup and k > 1 else 0
                dst = out[:, :, k, r0 * s:r1 * s].unflatten(2, (r1 - r0, s)).unflatten(4, (w, s))  # [b,c,rows,x,w,y]
                dst.copy_(u[:, :, :, z].permute(0, 3, 4, 1, 5, 2))
    return out
