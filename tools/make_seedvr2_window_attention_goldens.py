"""Write tests/fixtures/seedvr2_window_attention.safetensors from the OFFICIAL SeedVR joint window attention.

Usage (in a separate environment with torch, einops 0.7.0, omegaconf and safetensors; never the project venv):
    python tools/make_seedvr2_window_attention_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out ...]

The checkout (github.com/ByteDance-Seed/SeedVR) is imported from the given path and is never committed. For each
case, tiny random q/k/v (float32, CPU) for one sample go through the official attention path of
``NaSwinAttention.forward`` (models/dit_v2/nablocks/attention/mmattn.py; the 7B's models/dit/nablocks/mmsr_block.py
is the same code): ``get_window_op`` + ``na.window_idx`` (window partition / reverse), ``na.repeat_concat_idx``
(every window's video tokens followed by the sample's text tokens, text pooled back by the mean over windows), and
the varlen attention over ``cu_seqlens``. Left out on purpose, because they are not part of the attention brick:
the qkv/out projections, the q/k RMSNorm and RoPE (applied by the caller), and the official ``.bfloat16()`` cast
before flash-attn (the goldens are float32). flash-attn is not installable on CPU, so its varlen call is replaced
by an exact float32 per-segment softmax(QK^T/sqrt(d))V over the same ``cu_seqlens``.

The window counts of some cases are not the models' (4, 3, 3): counts only set the window size, and small counts
relative to a tiny grid give several windows, cropped edges and shifted windows in a fixture of a few kB. One case
uses (4, 3, 3) itself.
"""

from __future__ import annotations

import json

from seedvr2_official import official_checkout, write_golden  # noqa: E402 - tools/ is sys.path[0] for a script

HEADS, HEAD_DIM, TXT_LEN = 2, 8, 5
# (grid (T, H, W), window counts): uneven edges in both schemes; equal regular windows vs 9 shifted shapes; the
# models' own counts on a grid small enough to be one window.
CASES = [
    ((3, 5, 7), (2, 20, 25)),
    ((2, 6, 9), (1, 20, 25)),
    ((2, 3, 5), (4, 3, 3)),
]
METHODS = ("720pwin_by_size_bysize", "720pswin_by_size_bysize")


def _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, **_):
    # Stand-in for flash_attn_varlen_func (float32, exact): independent full attention per segment.
    import torch

    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    assert bounds == cu_seqlens_k.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (x[a:b].transpose(0, 1).double() for x in (q, k, v))  # h l d
        p = torch.softmax(qs @ ks.transpose(-1, -2) / HEAD_DIM**0.5, dim=-1)
        out[a:b] = (p @ vs).transpose(0, 1).to(q.dtype)
    return out


def _official_attention(torch, F, na, get_window_op, q, k, v, tq, tk, tv, grid, counts, method):
    """Lines of NaSwinAttention.forward from the window partition to the window reverse, with the official helpers."""
    vid_shape = torch.tensor([list(grid)])
    txt_shape = torch.tensor([[tq.shape[0]]])
    window_op = get_window_op(method)

    def make_window(x):
        t, h, w, _ = x.shape
        return [x[st, sh, sw] for (st, sh, sw) in window_op((t, h, w), counts)]

    window_partition, window_reverse, window_shape, window_count = na.window_idx(vid_shape, make_window)
    vid_q, vid_k, vid_v = (window_partition(x) for x in (q, k, v))
    txt_len = txt_shape.prod(-1)
    vid_len_win = window_shape.prod(-1)
    txt_len_win = txt_len.repeat_interleave(window_count)
    all_len_win = vid_len_win + txt_len_win
    concat_win, unconcat_win = na.repeat_concat_idx(vid_len_win, txt_len, window_count)
    cu = F.pad(all_len_win.cumsum(0), (1, 0)).int()
    out = _varlen_attention(
        q=concat_win(vid_q, tq), k=concat_win(vid_k, tk), v=concat_win(vid_v, tv),
        cu_seqlens_q=cu, cu_seqlens_k=cu,
    ).type_as(vid_q)
    vid_out, txt_out = unconcat_win(out)
    vid_out = window_reverse(vid_out)
    windows = [[s.start, s.stop, h.start, h.stop, w.start, w.stop] for s, h, w in window_op(tuple(grid), counts)]
    return vid_out, txt_out, windows


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_window_attention.safetensors")
    import torch
    import torch.nn.functional as F

    from models.dit_v2 import na
    from models.dit_v2.window import get_window_op

    gen = torch.Generator().manual_seed(1234)
    tensors, meta_cases = {}, []
    for i, (grid, counts) in enumerate(CASES):
        n = grid[0] * grid[1] * grid[2]
        q, k, v = (torch.randn(n, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
        tq, tk, tv = (torch.randn(TXT_LEN, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
        for name, x in zip(("q_vid", "k_vid", "v_vid", "q_txt", "k_txt", "v_txt"), (q, k, v, tq, tk, tv)):
            tensors[f"{i}.{name}"] = x.contiguous()
        case = {"grid": list(grid), "counts": list(counts), "layouts": {}}
        for method in METHODS:
            vid_out, txt_out, windows = _official_attention(
                torch, F, na, get_window_op, q, k, v, tq, tk, tv, grid, counts, method
            )
            tensors[f"{i}.{method}.out_vid"] = vid_out.contiguous()
            tensors[f"{i}.{method}.out_txt"] = txt_out.contiguous()
            case["layouts"][method] = windows
        meta_cases.append(case)

    meta = {
        "source": "github.com/ByteDance-Seed/SeedVR",
        "commit": commit,
        "made_by": "tools/make_seedvr2_window_attention_goldens.py",
        "cases": json.dumps(meta_cases, separators=(",", ":")),
    }
    write_golden(args.out, tensors, meta, f", {len(CASES)} grids")


if __name__ == "__main__":
    main()
