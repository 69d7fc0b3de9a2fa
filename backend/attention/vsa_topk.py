"""The k largest entries of each row of a score matrix, as column indices in ascending order: VSA's tile selection
(vsa_kernel.select_tiles) after the block scores.

torch.topk followed by a sort of its indices is two kernels over the whole score tensor: 3.8 ms per block at the
10-s shape on the H200 (56 heads, 1,188 tiles, k = 119; bench/vsa.py --kernel-only, "select" line), against 2.1 ms
for this kernel at 2 warps per row; the whole selection went from 5.5 to 4.1 ms (docs/BENCHMARKS.md, session 10).
The Triton kernel does both in one pass per row, in registers: a radix search over the scores' bit patterns finds
the k-th largest value (32 rounds of a count); the row's entries above it, and as many of those equal to it as k
still needs (lowest columns first), are written at their rank in column order (a cumulative count). torch.topk
leaves the choice among ties unspecified, so the two agree wherever the k-th value is not tied (random and trained
scores alike).
"""

from __future__ import annotations

import torch

from .vsa_softmax import tl, triton

MAX_COLUMNS = 8192  # one row lives in one program's registers; the torch path runs past this
#: Warps per row by the row's padded width (a power of two) where measured; else 4 up to 2048 columns, 8 past.
#: Fewer warps per row: more rows per SM, and the radix search's 32 counts reduce more within warps, less across.
NUM_WARPS = {2048: 2}  # H200, 66,528 rows of 1,188 (k = 119): 2.10 ms; 1 warp 2.90, 4 warps 2.37, 8 warps 2.74


def topk_ascending_torch(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[..., N] -> [..., k] long: the columns of each row's k largest scores, ascending (torch.topk's tie choice)."""
    return torch.topk(scores, k, dim=-1).indices.sort(dim=-1).values


def triton_topk_supported(scores: torch.Tensor, k: int) -> bool:
    return (triton is not None and scores.is_cuda and scores.dtype == torch.float32 and scores.dim() >= 1
            and 0 < k <= scores.shape[-1] <= MAX_COLUMNS)


def topk_ascending(scores: torch.Tensor, k: int, out_dtype=torch.long, use_triton: bool | None = None,
                   num_warps: int | None = None) -> torch.Tensor:
    """[..., N] float32 -> [..., k] `out_dtype`: the columns of each row's k largest scores in ascending order; the
    Triton kernel where it runs (use_triton None: CUDA float32 rows of at most MAX_COLUMNS), else torch. `num_warps`:
    the kernel's warps per row (default: NUM_WARPS for the row's padded width)."""
    if use_triton is None:
        use_triton = triton_topk_supported(scores, k)
    if not use_triton:
        return topk_ascending_torch(scores, k).to(out_dtype)
    n = scores.shape[-1]
    rows = scores.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], k), dtype=out_dtype, device=scores.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(n)
        warps = num_warps or NUM_WARPS.get(block, 4 if block <= 2048 else 8)
        _topk_ascending[(rows.shape[0],)](rows, out, n, k, rows.stride(0), BLOCK=block, num_warps=warps)
    return out.reshape(*scores.shape[:-1], k)


if triton is not None:
    @triton.jit
    def _topk_ascending(scores, out, N, K, stride_row, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        live = cols < N
        x = tl.load(scores + row * stride_row + cols, mask=live, other=0.0)
        # An order-preserving map of float32 to int64 in [0, 2^32): the int32 bit pattern is ordered for x >= 0
        # and reversed for x < 0 (flip the magnitude bits), then shifted up by 2^31. Columns past N get -1.
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) + 2147483648
        key = tl.where(live, key, -1)
        # The k-th largest key: the largest t with count(key >= t) >= K, built from the top bit down.
        kth = tl.sum(tl.zeros((BLOCK,), tl.int64), 0)
        for bit in tl.static_range(31, -1, -1):
            cand = kth + (1 << bit)
            kth = tl.where(tl.sum((key >= cand).to(tl.int32), 0) >= K, cand, kth)
        above = key > kth
        tied = key == kth
        take = above | (tied & (tl.cumsum(tied.to(tl.int32), 0) <= K - tl.sum(above.to(tl.int32), 0)))
        rank = tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(out + row * K + rank, cols.to(out.dtype.element_ty), mask=take)
