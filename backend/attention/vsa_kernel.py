"""Video Sparse Attention over rows in tile order (vsa_plan.py): the rule, its float64 reference, the Triton kernel
and the torch fallback that runs the same rule where Triton or a GPU is absent.

The rule, per (batch, head), with P prefix rows first and T video tiles after them:
- block scores: mean-pooled Q of each video tile . mean-pooled K of each video tile * d^-1/2 (pooled over the tile's
  true rows); each video query tile keeps its top-k video tiles (ties: the lowest tiles in the Triton selection,
  vsa_topk.py; torch.topk's choice elsewhere), sorted ascending;
- prefix queries attend every row (dense); video queries attend every prefix row and the rows of their k tiles;
- exact softmax attention over the attended rows.
The Triton kernel runs one program per (video query tile, batch * head): a 64-row query tile (edge tiles masked),
online softmax in fp32 over the prefix in 64-row blocks and then over the selected tiles, bf16 / fp16 operands on the
tensor cores (64x64 tiles, head_dim up to 256: 4 warps, 2-3 stages suit the H200's shared memory). Prefix queries
(a few percent of the rows) go through dense SDPA. A second launch variant loads the tiles through TMA tensor
descriptors (vsa_kernel_tma.py; KERNEL_CONFIG["tma"], Hopper and later).

The coarse branch (only for a DiT with learned gates, FastVideo's FastH3 student; FastVideo's VSA-H3 and vLLM-Omni's
port define it so): every block of rows -- the segment-pure prefix blocks and the video tiles, VSAPlan.block_sizes --
mean-pools q, k and v (fp32); block scores = pooled q . pooled k * d^-1/2 over ALL blocks, softmax, @ pooled v gives
one row per block; each row then gets out += that row of its block * its gate (gate [B, S, H, D], the to_gate_compress
projection of the attention input, no activation). It runs on dense and sparse steps alike.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import vsa_kernel_tma
from .vsa_topk import topk_ascending
from .vsa_softmax import tl, triton, triton_supported  # noqa: F401 - triton_supported re-exported


def pooled(x: torch.Tensor, num_prefix: int, tile_sizes: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[B, S, H, D] -> mean over each video tile's rows [B, H, T, D] in `dtype`. Equal tiles lie in contiguous runs
    (vsa_plan.tile_order), so each run is a [B, n, size, H, D] view summed in `dtype` (no converted copy of x)."""
    b, _, h, d = x.shape
    sizes, counts = torch.unique_consecutive(tile_sizes.cpu(), return_counts=True)
    parts, row = [], num_prefix
    for size, count in zip(sizes.tolist(), counts.tolist()):
        run = x[:, row:row + size * count].unflatten(1, (count, size))
        parts.append(run.sum(2, dtype=dtype) / size)
        row += size * count
    return torch.cat(parts, dim=1).transpose(1, 2)


def select_tiles(q: torch.Tensor, k: torch.Tensor, num_prefix: int, tile_sizes: torch.Tensor, topk: int,
                 dtype=torch.float32, out_dtype=torch.long) -> torch.Tensor:
    """The top-k video tiles of each video query tile: [B, H, T, k] `out_dtype`, ascending (vsa_topk.py: one Triton
    pass on CUDA float32 scores, torch.topk + sort elsewhere)."""
    qp = pooled(q, num_prefix, tile_sizes, dtype)
    kp = pooled(k, num_prefix, tile_sizes, dtype)
    scores = qp @ kp.transpose(-1, -2) * q.shape[-1] ** -0.5
    return topk_ascending(scores, topk, out_dtype)


def add_coarse_(out, q, k, v, gate, block_sizes: torch.Tensor, chunk_blocks: int = 256) -> torch.Tensor:
    """Add the coarse branch (module docstring) to `out` [B, S, H, D] in place and return it: rows in block order,
    `block_sizes` [N] the rows of each block from row 0 (prefix blocks, then tiles). Equal blocks are contiguous
    runs, so pooling and the broadcast back are views; the sum is formed in fp32 and rounded once, a run's
    `chunk_blocks` blocks at a time (bounded fp32 scratch at any length)."""
    sizes = block_sizes.cpu()
    qp, kp, vp = (pooled(x, 0, sizes) for x in (q, k, v))  # [B, H, N, D] fp32
    scores = qp @ kp.transpose(-1, -2) * q.shape[-1] ** -0.5
    per_block = (torch.softmax(scores, dim=-1) @ vp).transpose(1, 2)  # [B, N, H, D] fp32
    runs, counts = torch.unique_consecutive(sizes, return_counts=True)
    row = block = 0
    for size, count in zip(runs.tolist(), counts.tolist()):
        for first in range(0, count, chunk_blocks):
            n = min(chunk_blocks, count - first)
            rows = slice(row + first * size, row + (first + n) * size)
            target = out[:, rows].unflatten(1, (n, size))
            mix = per_block[:, block + first:block + first + n].unsqueeze(2) * gate[:, rows].unflatten(1, (n, size))
            target.copy_(mix.add_(target))
        row, block = row + size * count, block + count
    return out


def reference(q, k, v, num_prefix: int, tile_sizes: torch.Tensor, topk: int, gate=None,
              prefix_sizes: torch.Tensor | None = None):
    """The rule in float64 with explicit loops (slow; for tests). -> (out [B, S, H, D] float64, selection).
    With `gate`: plus the coarse branch over the prefix blocks (`prefix_sizes`; None: 64-row blocks) and tiles."""
    qd, kd, vd = (t.double() for t in (q, k, v))
    b, s, h, d = q.shape
    p = num_prefix
    starts = [p + int(x) for x in torch.cat([torch.zeros(1, dtype=torch.long), tile_sizes.cumsum(0)[:-1]])]
    scale = d ** -0.5
    # Selection written out on its own (not select_tiles): each tile's mean row, scores, top-k, ascending.
    spans = [slice(st, st + int(n)) for st, n in zip(starts, tile_sizes.tolist())]
    qp = torch.stack([qd[:, sp].mean(1) for sp in spans], dim=2)  # [B, H, T, D]
    kp = torch.stack([kd[:, sp].mean(1) for sp in spans], dim=2)
    sel = torch.topk(torch.einsum("bhtd,bhsd->bhts", qp, kp) * scale, topk, dim=-1).indices.sort(-1).values
    out = torch.zeros(b, s, h, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            qh, kh, vh = qd[bi, :, hi], kd[bi, :, hi], vd[bi, :, hi]
            if p:
                out[bi, :p, hi] = torch.softmax(qh[:p] @ kh.T * scale, -1) @ vh
            for ti, start in enumerate(starts):
                rows = slice(start, start + int(tile_sizes[ti]))
                keys = list(range(p))
                for tj in sel[bi, hi, ti].tolist():
                    keys += range(starts[tj], starts[tj] + int(tile_sizes[tj]))
                keys = torch.tensor(keys)
                out[bi, rows, hi] = torch.softmax(qh[rows] @ kh[keys].T * scale, -1) @ vh[keys]
    if gate is not None:
        if prefix_sizes is None:
            prefix_sizes = torch.tensor([min(64, p - r) for r in range(0, p, 64)], dtype=torch.long)
        blocks, row = [], 0
        for n in prefix_sizes.tolist() + tile_sizes.tolist():
            blocks.append(list(range(row, row + int(n))))
            row += int(n)
        gd = gate.double()
        for bi in range(b):
            for hi in range(h):
                means = [torch.stack([x[bi, r, hi] for r in rows]).mean(0) for x in (qd, kd, vd) for rows in blocks]
                n = len(blocks)
                qm, km, vm = torch.stack(means[:n]), torch.stack(means[n:2 * n]), torch.stack(means[2 * n:])
                coarse = torch.softmax(qm @ km.T * scale, -1) @ vm  # [N, D]
                for j, rows in enumerate(blocks):
                    for r in rows:
                        out[bi, r, hi] += coarse[j] * gd[bi, r, hi]
    return out, sel


def torch_video_attention(q, k, v, num_prefix: int, tile_of: torch.Tensor, sel: torch.Tensor,
                          mask_budget: int = 1 << 26) -> torch.Tensor:
    """The video queries' rows of the rule with a block mask through SDPA (fp32): [B, S - P, H, D] in q's dtype.
    Where Triton or a GPU is absent. Works through (heads, query rows) chunks whose boolean mask holds about
    `mask_budget` entries, so memory stays bounded at any length (it is slow: the masked keys are still computed)."""
    b, s, h, d = q.shape
    p, t = num_prefix, sel.shape[2]
    block = torch.zeros(b, h, t, t, dtype=torch.bool, device=q.device)
    block.scatter_(-1, sel, True)
    out = q.new_empty((b, s - p, h, d))
    heads = max(1, min(h, mask_budget // max(1, b * s * (s - p))))
    rows = max(1, min(s - p, mask_budget // max(1, b * heads * s)))
    for h0 in range(0, h, heads):
        hs = slice(h0, min(h, h0 + heads))
        kh, vh = (x[:, :, hs].transpose(1, 2).float() for x in (k, v))
        for r0 in range(0, s - p, rows):
            rs = slice(r0, min(s - p, r0 + rows))
            video = block[:, hs][:, :, tile_of[rs]][:, :, :, tile_of]  # [B, heads, rows, Sv]
            mask = torch.cat([video.new_ones(video.shape[:3] + (p,)), video], dim=-1)
            qh = q[:, p + rs.start:p + rs.stop, hs].transpose(1, 2).float()
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
            out[:, rs, hs] = o.transpose(1, 2).to(q.dtype)
    return out


if triton is not None:
    from .vsa_softmax import _online_softmax_step

    @triton.jit
    def _attend_keys(q, acc, m_i, l_i, k_base, v_base, keys, valid, sks, svs, qk_scale, dims,
                     PV_FP16: tl.constexpr):
        # One block of key rows (`keys` int64 row indices, `valid` mask) into the online softmax state.
        kk = tl.load(k_base + keys[:, None] * sks + dims[None, :], mask=valid[:, None], other=0.0)
        vv = tl.load(v_base + keys[:, None] * svs + dims[None, :], mask=valid[:, None], other=0.0)
        return _online_softmax_step(q, kk, vv, valid, acc, m_i, l_i, qk_scale, PV_FP16)

    @triton.jit
    def _vsa_video_fwd(Q, K, V, O, starts, sizes, sel, P, H, T, NSEL, qk_scale,
                       sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
                       HEAD_DIM: tl.constexpr, TILE: tl.constexpr, PAIRS: tl.constexpr, PV_FP16: tl.constexpr):
        # One program per (video query tile, batch * head); keys in blocks of TILE * PAIRS rows: PAIRS selected
        # tiles side by side (a wider tensor-core tile and half the softmax bookkeeping per key row).
        tile = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        q_start = tl.load(starts + tile)
        q_len = tl.load(sizes + tile)
        rows = tl.arange(0, TILE)
        dims = tl.arange(0, HEAD_DIM)
        q_rows = (q_start + rows).to(tl.int64)
        q = tl.load(Q + b * sqb + h * sqh + q_rows[:, None] * sqs + dims[None, :],
                    mask=rows[:, None] < q_len, other=0.0)
        m_i = tl.full((TILE,), float("-inf"), tl.float32)
        l_i = tl.zeros((TILE,), tl.float32)
        acc = tl.zeros((TILE, HEAD_DIM), tl.float32)
        k_base = K + b * skb + h * skh
        v_base = V + b * svb + h * svh
        cols = tl.arange(0, TILE * PAIRS)
        for k_start in range(0, P, TILE * PAIRS):  # the prefix: every query attends all of it
            keys = (k_start + cols).to(tl.int64)  # row offsets pass 2^31 elements past ~100k rows of fused qkv
            acc, m_i, l_i = _attend_keys(q, acc, m_i, l_i, k_base, v_base, keys, keys < P, sks, svs, qk_scale,
                                         dims, PV_FP16)
        sel_base = sel + (bh * T + tile) * NSEL
        within = cols % TILE
        for j in range(0, NSEL, PAIRS):  # this tile's selected video tiles, PAIRS at a time
            kt = tl.load(sel_base + j)
            start = tl.load(starts + kt)
            length = tl.load(sizes + kt)
            if PAIRS == 2:
                more = j + 1 < NSEL
                kt2 = tl.load(sel_base + j + 1, mask=more, other=0)
                second = cols >= TILE
                start = tl.where(second, tl.load(starts + kt2), start)
                length = tl.where(second, tl.where(more, tl.load(sizes + kt2), 0), length)
            keys = (start + within).to(tl.int64)
            acc, m_i, l_i = _attend_keys(q, acc, m_i, l_i, k_base, v_base, keys, within < length, sks, svs,
                                         qk_scale, dims, PV_FP16)
        out = acc / l_i[:, None]
        tl.store(O + b * sob + h * soh + q_rows[:, None] * sos + dims[None, :],
                 out.to(O.dtype.element_ty), mask=rows[:, None] < q_len)


#: Launch settings measured on the H200 (bench/vsa.py --tune, 10-s shape, 56 heads, ~10% of tiles; docs/BENCHMARKS.md,
#: "VSA"): one selected tile per key block, 4 warps, 3 stages: 56.0 ms. Two tiles per block: 76.0 ms; 8 warps: >= 109 ms;
#: P.V in fp16: +23% time for no accuracy gain (the bf16 output's own rounding dominates the error).
#: "tma": the TMA-descriptor variant (vsa_kernel_tma.py; one tile per key block, "pairs" unused), run where
#: vsa_kernel_tma.tma_supported holds (Hopper and later), else this pointer kernel; "tma_view": "auto" / "rows" /
#: "4d"; "tma_stages": its num_stages. Measured on the H200 at the 10-s shape (bench/vsa.py --kernel-only, 4 warps):
#: TMA, 4-D view, 5 stages 44.6 ms (389 TFLOP/s on the attended blocks) vs this kernel's 55.5 ms on random
#: selections; 43.3 vs 55.5 ms on local ones; 8 warps >= 74 ms for both (session 10, with the FMA softmax update:
#: 44.4 / 42.3 ms vs the pointer kernel's 54.0 / 53.3 ms). The TMA loop's other forms, each correct
#: (tests/attention/test_vsa.py) and each slower there (session 10, docs/runs/h200-2026-12-02b): "tma_pairs": 2
#: (two tiles per key block) 55-57 ms vs 45-46 ms; "tma_lookahead" (next block's QK^T before this block's softmax) 46-48 ms;
#: "tma_lazy" (rescale only when a row max grows by more than 2^8) 46-50 ms. Kept for other GPUs and head sizes.
KERNEL_CONFIG = {"pairs": 1, "num_warps": 4, "num_stages": 3, "tma": True, "tma_view": "auto", "tma_stages": 5,
                 "tma_pairs": 1, "tma_lookahead": False, "tma_lazy": False}


def triton_video_attention(q, k, v, num_prefix: int, starts: torch.Tensor, sizes: torch.Tensor,
                           sel: torch.Tensor, out: torch.Tensor | None = None, pv_fp16: bool = False,
                           **config) -> torch.Tensor:
    """Fill the video rows of `out` [B, S, H, D] (q's dtype unless `out` says otherwise, e.g. float32 to see the
    kernel's own arithmetic) with the rule's output; returns out. `starts`, `sizes` int32 [T] (positions in tile
    order; tiles of at most 64 rows), `sel` [B, H, T, k] int32 / long. `pv_fp16`: probabilities times V in fp16 (V
    must fit fp16's range); `config` overrides KERNEL_CONFIG."""
    b, s, h, d = q.shape
    t, nsel = sel.shape[2], sel.shape[3]
    out = torch.empty_like(q) if out is None else out
    sel = sel.to(torch.int32).contiguous()
    settings = {**KERNEL_CONFIG, **config}
    if settings["tma"]:
        view = vsa_kernel_tma.tma_view(q, k, v, out, settings["tma_view"])
        if view is not None:
            return vsa_kernel_tma.launch_tma(q, k, v, out, num_prefix, starts, sizes, sel, pv_fp16, view,
                                             int(settings["num_warps"]), int(settings["tma_stages"]),
                                             int(settings["tma_pairs"]), bool(settings["tma_lookahead"]),
                                             bool(settings["tma_lazy"]))
    grid = (t, b * h)
    _vsa_video_fwd[grid](q, k, v, out, starts, sizes, sel, num_prefix, h, t, nsel, d ** -0.5 * math.log2(math.e),
                         q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                         v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                         HEAD_DIM=d, TILE=64, PAIRS=int(settings["pairs"]), PV_FP16=bool(pv_fp16),
                         num_warps=int(settings["num_warps"]), num_stages=int(settings["num_stages"]))
    return out


def sparse_attention(q, k, v, plan, dense, use_triton: bool | None = None) -> torch.Tensor:
    """One sparse step of the rule on rows in tile order: prefix queries through `dense` (q, k, v) -> out, video
    queries through the Triton kernel (CUDA) or the torch fallback."""
    p = plan.num_prefix
    starts, sizes, tile_of = plan.tables(q.device)
    if use_triton is None:
        use_triton = q.is_cuda and triton_supported(q)
    sel = select_tiles(q, k, p, plan.tile_sizes, plan.topk, out_dtype=torch.int32 if use_triton else torch.long)
    if use_triton:
        out = triton_video_attention(q, k, v, p, starts, sizes, sel)
    else:
        out = torch.empty_like(q)
        out[:, p:] = torch_video_attention(q, k, v, p, tile_of, sel)
    if p:
        if use_triton:
            out[:, :p] = dense(q[:, :p], k, v)
        else:  # the CPU's bf16 SDPA accumulates coarser than the rule's fp32: run the prefix queries in fp32 too
            out[:, :p] = dense(q[:, :p].float(), k.float(), v.float()).to(q.dtype)
    return out
