"""The VSA kernel's second launch variant (vsa_kernel.py has the rule and the pointer kernel): Q, K and V tiles come in
through TMA tensor descriptors (Hopper and later: an asynchronous bulk copy into shared memory per 64-row block, no
per-element address arithmetic or registers for addresses, pipelined over num_stages) and full query tiles go out the
same way. Same rule, same grid, same online softmax (vsa_softmax._online_softmax_step) as the pointer kernel.

Selected with triton_video_attention(..., tma=True) (KERNEL_CONFIG's "tma"); it runs only where `tma_supported` holds
and the pointer kernel runs otherwise. Two views of a [B, S, H, D] tensor (`tma_view`):
- "rows": a 2-D [B * S, H * D] descriptor with [64, D] blocks at (b * S + row, h * D) -- the plain 2-D tile the
  Triton tutorials pipeline; needs heads packed within a row (stride(2) == D: contiguous q/k/v and views of a fused
  [B, S, 3, H, D] QKV buffer alike) and batches evenly spaced (B == 1 or stride(0) == S * stride(1));
- "4d": a [B, S, H, D] descriptor with [1, 64, 1, D] blocks, reshaped to [64, D]: any strides TMA accepts.
"auto" picks "4d" (measured on the H200 at the 10-s shape, 4 warps, 5 stages: 44.6 ms vs 44.9 ms for "rows" on
random selections, 43.3 vs 49.0 ms on local ones; docs/BENCHMARKS.md) and "rows" where only that one applies.
Block rows past a tile's length (the next tile's, or the next batch's in the rows view) are masked in the scores as
the pointer kernel masks them; rows past the end are zero-filled by TMA. A TMA store writes its whole 64-row box, so
only full query tiles store through the descriptor; edge tiles use the masked pointer store. Host-side descriptors
travel as kernel parameters: no triton.set_allocator is needed (that is for descriptors made inside a kernel). TMA
loads at a row read from `sel` are double-buffered for num_stages 2-4 and triple-buffered from 5 (Triton 3.6's sm_90
compile): 5 stages is the fastest setting measured. A warp-specialized key loop (tl.range(..., warp_specialize=True))
was tried and removed: with Triton 3.6 on the H200 it ran 1.9x slower than this loop and gave wrong results for some
settings. So was a packed selection (each selected tile's first row << 7 | rows in one int32, gathered on the host,
so the loop makes one load per block instead of two dependent ones): 56.3 ms vs 45.6 ms; and float16
exponentials (ex2.approx.f16x2, two per instruction): 46.3 ms vs 44.7 ms and 2.5e-3 off (session 10).
"""

from __future__ import annotations

import math
import os

import torch

from .vsa_softmax import triton, triton_supported

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.3 or absent: the pointer kernel runs
    TensorDescriptor = None

TILE = 64
VIEWS = ("auto", "rows", "4d")
_TMA_MAX_STRIDE_BYTES = 1 << 40  # cuTensorMapEncodeTiled's bound on a global stride


def interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): descriptors then run on CPU tensors."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs, "runtime"):
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _rows_view_fits(x: torch.Tensor) -> bool:
    b, s, _, d = x.shape
    return x.stride(2) == d and (b == 1 or x.stride(0) == s * x.stride(1))


def _strides_4d(x: torch.Tensor) -> list[int]:
    """x's strides, a size-1 dimension's (never used to address, but TMA still checks it) replaced by the contiguous
    one: a size-1 batch of a view may carry any stride."""
    strides = list(x.stride())
    for dim in range(2, -1, -1):
        if x.shape[dim] == 1:
            strides[dim] = strides[dim + 1] * x.shape[dim + 1]
    return strides


def _fits_tma(x: torch.Tensor, strides: list[int]) -> bool:
    size = x.element_size()
    return (x.data_ptr() % 16 == 0 and strides[-1] == 1
            and all(st * size % 16 == 0 and 0 < st * size < _TMA_MAX_STRIDE_BYTES for st in strides[:-1]))


def tma_view(q, k, v, out, view: str = "auto") -> str | None:
    """The descriptor view the TMA kernel would use for these tensors ("rows" or "4d"), or None where TMA does not
    apply: the fallback rule. TMA needs Triton's TensorDescriptor, a GPU of compute capability >= 9 (or Triton's
    interpreter on CPU tensors), q/k/v that suit the pointer kernel (triton_supported) with one dtype and shape,
    `out` of that shape in bf16 / fp16 / fp32, every tensor's base 16-byte aligned with stride(-1) == 1 and its other
    strides multiples of 16 bytes, and row coordinates below 2^31."""
    if view not in VIEWS:
        raise ValueError(f"VSA tma_view {view!r}: use one of {', '.join(VIEWS)}")
    tensors = (q, k, v, out)
    if TensorDescriptor is None or not triton_supported(q) or q.dim() != 4:
        return None
    if any(t.shape != q.shape or t.device != q.device for t in tensors) or {k.dtype, v.dtype} != {q.dtype}:
        return None
    if out.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    if q.device.type == "cuda":
        if torch.cuda.get_device_capability(q.device)[0] < 9:
            return None
    elif not (q.device.type == "cpu" and interpreting()):
        return None
    b, s, h, d = q.shape
    if b * s >= 2 ** 31:
        return None
    rows = all(_rows_view_fits(t) and _fits_tma(t, [t.stride(1), 1]) for t in tensors)
    four_d = all(_fits_tma(t, _strides_4d(t)) for t in tensors)
    if view == "rows":
        return "rows" if rows else None
    if four_d:
        return "4d"
    return "rows" if view == "auto" and rows else None


def tma_supported(q, k, v, out, view: str = "auto") -> bool:
    """Whether triton_video_attention(..., tma=True) runs the TMA kernel on these tensors (else the pointer one)."""
    return tma_view(q, k, v, out, view) is not None


def _descriptor(x: torch.Tensor, view: str) -> TensorDescriptor:
    b, s, h, d = x.shape
    if view == "rows":
        return TensorDescriptor(x, [b * s, h * d], [x.stride(1), 1], [TILE, d])
    return TensorDescriptor(x, [b, s, h, d], _strides_4d(x), [1, TILE, 1, d])


if triton is not None:
    import triton.language as tl

    from .vsa_softmax import (_online_softmax_scores, _online_softmax_scores_lazy, _online_softmax_step,
                              _online_softmax_step2)

    @triton.jit
    def _tile_rows(desc, b, row, h, S, TILE: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS_VIEW: tl.constexpr):
        # TILE rows of one (batch, head) from `row` as [TILE, HEAD_DIM] (rows past the tensor: zeros).
        if ROWS_VIEW:
            x = desc.load([b * S + row, h * HEAD_DIM])
        else:
            x = desc.load([b, row, h, 0]).reshape(TILE, HEAD_DIM)
        return x

    @triton.jit
    def _key_block(i, n_prefix, n_blocks, P, sel_base, starts, sizes, NSEL, TILE: tl.constexpr):
        # Key block i of a video query tile: the prefix's 64-row blocks, then its selected tiles; from n_blocks on,
        # an empty block (length 0) at row 0, for the second half of a last pair or a pipelined loop's look-ahead.
        in_prefix = i < n_prefix
        kt = tl.load(sel_base + tl.minimum(tl.maximum(i - n_prefix, 0), NSEL - 1))  # always in bounds
        start = tl.where(in_prefix, i * TILE, tl.load(starts + kt))
        length = tl.where(in_prefix, P - i * TILE, tl.load(sizes + kt))  # prefix: >= the block's last row
        live = i < n_blocks
        return tl.where(live, start, 0), tl.where(live, length, 0)

    @triton.jit
    def _vsa_video_fwd_tma(q_desc, k_desc, v_desc, o_desc, O, starts, sizes, sel, S, P, H, T, NSEL, qk_scale,
                           sob, sos, soh, HEAD_DIM: tl.constexpr, TILE: tl.constexpr, ROWS_VIEW: tl.constexpr,
                           PV_FP16: tl.constexpr, PAIRS: tl.constexpr, LOOKAHEAD: tl.constexpr,
                           LAZY: tl.constexpr):
        # One program per (video query tile, batch * head), as _vsa_video_fwd. One key loop over the prefix blocks
        # and then the selected tiles (one loop for the pipeliner to schedule), in one of three forms:
        # PAIRS == 2: two key blocks per iteration (_online_softmax_step2);
        # LOOKAHEAD: the next block's scores q . k^T are issued before this block's softmax, so the tensor cores
        # can run them while the softmax does (loop-carried, FlashAttention-3's intra-warpgroup overlap written
        # out; one spare score block at the end);
        # else one block per iteration. LAZY (one block per iteration, with or without LOOKAHEAD): the conditional
        # rescale of _online_softmax_scores_lazy.
        tile = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        q_start = tl.load(starts + tile)
        q_len = tl.load(sizes + tile)
        # rows past q_len are the next tile's: their outputs are computed and never stored
        q = _tile_rows(q_desc, b, q_start, h, S, TILE, HEAD_DIM, ROWS_VIEW)
        m_i = tl.full((TILE,), float("-inf"), tl.float32)
        l_i = tl.zeros((TILE,), tl.float32)
        acc = tl.zeros((TILE, HEAD_DIM), tl.float32)
        cols = tl.arange(0, TILE)
        n_prefix = tl.cdiv(P, TILE)
        n_blocks = n_prefix + NSEL
        sel_base = sel + (bh * T + tile) * NSEL
        if PAIRS == 2:
            for i in tl.range(0, n_blocks, 2):
                start0, length0 = _key_block(i, n_prefix, n_blocks, P, sel_base, starts, sizes, NSEL, TILE)
                start1, length1 = _key_block(i + 1, n_prefix, n_blocks, P, sel_base, starts, sizes, NSEL, TILE)
                k0 = _tile_rows(k_desc, b, start0, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                v0 = _tile_rows(v_desc, b, start0, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                k1 = _tile_rows(k_desc, b, start1, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                v1 = _tile_rows(v_desc, b, start1, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                acc, m_i, l_i = _online_softmax_step2(q, k0, v0, cols < length0, k1, v1, cols < length1, acc, m_i,
                                                      l_i, qk_scale, PV_FP16)
        elif LOOKAHEAD:
            start, length = _key_block(0, n_prefix, n_blocks, P, sel_base, starts, sizes, NSEL, TILE)
            s = tl.dot(q, tl.trans(_tile_rows(k_desc, b, start, h, S, TILE, HEAD_DIM, ROWS_VIEW)))
            for i in tl.range(0, n_blocks):
                vv = _tile_rows(v_desc, b, start, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                start_n, length_n = _key_block(i + 1, n_prefix, n_blocks, P, sel_base, starts, sizes, NSEL, TILE)
                s_n = tl.dot(q, tl.trans(_tile_rows(k_desc, b, start_n, h, S, TILE, HEAD_DIM, ROWS_VIEW)))
                if LAZY:
                    acc, m_i, l_i = _online_softmax_scores_lazy(s, vv, cols < length, acc, m_i, l_i, qk_scale,
                                                                PV_FP16)
                else:
                    acc, m_i, l_i = _online_softmax_scores(s, vv, cols < length, acc, m_i, l_i, qk_scale, PV_FP16)
                s, start, length = s_n, start_n, length_n
        else:
            for i in tl.range(0, n_blocks):
                start, length = _key_block(i, n_prefix, n_blocks, P, sel_base, starts, sizes, NSEL, TILE)
                kk = _tile_rows(k_desc, b, start, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                vv = _tile_rows(v_desc, b, start, h, S, TILE, HEAD_DIM, ROWS_VIEW)
                if LAZY:
                    acc, m_i, l_i = _online_softmax_scores_lazy(tl.dot(q, tl.trans(kk)), vv, cols < length, acc,
                                                                m_i, l_i, qk_scale, PV_FP16)
                else:
                    acc, m_i, l_i = _online_softmax_step(q, kk, vv, cols < length, acc, m_i, l_i, qk_scale,
                                                         PV_FP16)
        out = (acc / l_i[:, None]).to(o_desc.dtype)
        # A TMA store writes the whole box: only a full tile's; an edge tile stores through masked pointers.
        if q_len == TILE:
            if ROWS_VIEW:
                o_desc.store([b * S + q_start, h * HEAD_DIM], out)
            else:
                o_desc.store([b, q_start, h, 0], out.reshape(1, TILE, 1, HEAD_DIM))
        if q_len < TILE:
            dims = tl.arange(0, HEAD_DIM)
            q_rows = (q_start + cols).to(tl.int64)
            tl.store(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + q_rows[:, None] * sos + dims[None, :],
                     out, mask=cols[:, None] < q_len)


def launch_tma(q, k, v, out, num_prefix: int, starts, sizes, sel, pv_fp16: bool, view: str, num_warps: int,
               num_stages: int, pairs: int = 1, lookahead: bool = False, lazy: bool = False) -> torch.Tensor:
    """Run _vsa_video_fwd_tma (`view` as tma_view resolved it; `sel` int32 contiguous [B, H, T, k]; `pairs` 1 or 2
    key blocks per iteration; for pairs 1, `lookahead` the next block's scores first and `lazy` the conditional
    rescale); returns out."""
    if pairs not in (1, 2):
        raise ValueError(f"VSA TMA kernel: pairs must be 1 or 2, got {pairs!r}")
    b, s, h, d = q.shape
    t, nsel = sel.shape[2], sel.shape[3]
    descs = [_descriptor(x, view) for x in (q, k, v, out)]
    _vsa_video_fwd_tma[(t, b * h)](*descs, out, starts, sizes, sel, s, num_prefix, h, t, nsel,
                                   d ** -0.5 * math.log2(math.e), out.stride(0), out.stride(1), out.stride(2),
                                   HEAD_DIM=d, TILE=TILE, ROWS_VIEW=view == "rows", PV_FP16=bool(pv_fp16),
                                   PAIRS=int(pairs), LOOKAHEAD=bool(lookahead) and pairs == 1,
                                   LAZY=bool(lazy) and pairs == 1, num_warps=num_warps, num_stages=num_stages)
    return out
