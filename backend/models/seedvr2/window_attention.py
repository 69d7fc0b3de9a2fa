"""SeedVR2 joint window attention for one sample, batched by window shape.

What it computes (equal to the official ``NaSwinAttention`` / ``NaMMSRTransformerBlock`` attention core, same in the
3B and 7B code): for every window of a ``WindowLayout``, full attention over the joint sequence
``[that window's video tokens (window order) ; all L_txt text tokens]`` -- video first, text after, no mask; the
text queries, keys and values are the same for every window (the official code repeats the text after each
window). Video outputs go back to canonical (t, h, w) order; each text token's output is the mean of its outputs
over all windows of the sample (the official ``repeat_concat_idx`` un-concat: reshape to [L_txt, windows] and mean).

RoPE: ``window_attention`` takes rotated q/k. ``window_attention_rows`` (the DiT's entry point, on one rank's rows
of a layer, see routing.py) rotates each gathered group's video q/k itself when given a table per window shape: a
window's table has window-local positions, and windows of one shape share it. In the official code RoPE comes after
the q/k RMSNorm and after the window partition (``window_shape``): the 7B ("pixel") rotates video q/k only; the 3B
("mmrope3d") rotates video q/k (positions restart at each window origin) and text q/k (text position j on every
axis, the same table for every window, so the caller rotates the text once).

Speed: windows of equal shape are gathered into one ``[G, n + L_txt, heads, head_dim]`` batch and attended with a
single kernel call per shape group (<= 27 per layer at the released settings), never one call per window. The kernel
is an attention backend callable ``fn(q, k, v, plan=None)`` on ``[batch, seq, heads, head_dim]``
(backend/attention/registry.py), so other kernels plug in unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch

from .routing import LayerRows, canonical_rows
from .windows import WindowLayout

AttentionFn = Callable[..., torch.Tensor]
Table = Tuple[torch.Tensor, torch.Tensor]
# shape (t, h, w) of a window -> its RoPE table (cos, sin) [t*h*w, rot] float32 (rope.py); None: no rotation.
RopeFn = Callable[[Tuple[int, int, int]], Table]


def group_token_ids(layout: WindowLayout, device: torch.device) -> List[torch.Tensor]:
    """Canonical token ids of every shape group's windows, [G, n] int64 on ``device`` (cached)."""
    return [idx for _, idx in canonical_rows(layout, device).groups]


def _default_attention() -> AttentionFn:
    from ...attention.registry import get_backend

    return get_backend("sdpa")


def _rotate_(x: torch.Tensor, table: Table) -> None:
    """RoPE in place on x [G, n, heads, head_dim] (a gathered copy the caller owns) with a window table [n, rot]:
    the arithmetic of rope.apply_rope (float32, interleaved pairs), without its full-size float32 output."""
    cos, sin = table
    rot = cos.shape[1]
    c = cos[:, None, 0::2].to(device=x.device, dtype=torch.float32)  # one value per pair: [n, 1, rot/2]
    s = sin[:, None, 0::2].to(device=x.device, dtype=torch.float32)
    x0 = x[..., 0:rot:2].float()
    x1 = x[..., 1:rot:2].float()
    even = x0 * c - x1 * s
    odd = x1 * c + x0 * s
    x[..., 0:rot:2] = even
    x[..., 1:rot:2] = odd


def window_attention_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_txt: torch.Tensor,
    k_txt: torch.Tensor,
    v_txt: torch.Tensor,
    rows: LayerRows,
    attention: Optional[AttentionFn] = None,
    plan: Any = None,
    rope: Optional[RopeFn] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Joint window attention on one rank's rows of one layer (the DiT's entry point).

    q/k/v: [n_local, heads, head_dim] in the local order of ``rows`` (routing.py); q/k normalised, not rotated.
    q/k/v_txt: [L_txt, heads, head_dim], final (text RoPE, if any, already applied).
    rope: the video table of a window shape; each group's gathered q/k are rotated with it (window-local positions).
    Returns (video out [n_local, heads, head_dim] in the local order, q's dtype; text out summed over this rank's
    windows [L_txt, heads, head_dim] float32, NOT divided: the caller reduces over ranks and divides by
    ``rows.total_windows``). One ``attention`` call per shape group, batch = the group's windows.
    """
    n_local = rows.n_local
    if q.dim() != 3 or q.shape[0] != n_local:
        raise ValueError(f"video q has shape {tuple(q.shape)}; expected [{n_local}, heads, head_dim] for these rows")
    heads, dim = q.shape[1:]
    n_txt = q_txt.shape[0]
    for name, x, count in (("k", k, n_local), ("v", v, n_local), ("q_txt", q_txt, n_txt), ("k_txt", k_txt, n_txt),
                           ("v_txt", v_txt, n_txt)):
        if tuple(x.shape) != (count, heads, dim):
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {(count, heads, dim)}")
    fn = attention if attention is not None else _default_attention()

    vid_out = torch.empty((n_local, heads, dim), dtype=q.dtype, device=q.device)
    # float32 accumulation of the per-window text outputs (a bf16 running sum over ~100 windows would lose bits).
    txt_sum = torch.zeros(n_txt, heads, dim, dtype=torch.float32, device=q.device)
    for shape, idx in rows.groups:
        g, n = idx.shape
        flat = idx.reshape(-1)

        def joint(vid: torch.Tensor, txt: torch.Tensor, rotate: bool) -> torch.Tensor:
            part = vid.index_select(0, flat).view(g, n, heads, dim)
            if rotate and rope is not None:
                _rotate_(part, rope(shape))
            if not n_txt:
                return part
            return torch.cat([part, txt.unsqueeze(0).expand(g, n_txt, heads, dim)], dim=1)

        out = fn(joint(q, q_txt, True), joint(k, k_txt, True), joint(v, v_txt, False), plan)  # [G, n + L_txt, h, d]
        vid_out.index_copy_(0, flat, out[:, :n].reshape(g * n, heads, dim).to(vid_out.dtype))
        if n_txt:
            txt_sum += out[:, n:].sum(0, dtype=torch.float32)
    return vid_out, txt_sum


def window_attention(
    q_vid: torch.Tensor,
    k_vid: torch.Tensor,
    v_vid: torch.Tensor,
    q_txt: torch.Tensor,
    k_txt: torch.Tensor,
    v_txt: torch.Tensor,
    layout: WindowLayout,
    attention: Optional[AttentionFn] = None,
    plan: Any = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Joint window attention of one whole sample in canonical order.

    q/k/v_vid: [L_vid, heads, head_dim] in canonical (t, h, w) order, L_vid = T*H*W of ``layout.grid``.
    q/k/v_txt: [L_txt, heads, head_dim] (L_txt may be 0).
    Returns (video out [L_vid, heads, head_dim] canonical order, text out [L_txt, heads, head_dim] = mean over
    windows). ``attention`` defaults to the registry's "sdpa" backend; ``plan`` is passed through to it.
    """
    n_vid = layout.perm.numel()
    if q_vid.dim() != 3 or q_vid.shape[0] != n_vid:
        raise ValueError(
            f"video q has shape {tuple(q_vid.shape)}; expected [{n_vid}, heads, head_dim] for grid {layout.grid}"
        )
    rows = canonical_rows(layout, q_vid.device)
    vid, txt_sum = window_attention_rows(q_vid, k_vid, v_vid, q_txt, k_txt, v_txt, rows, attention, plan)
    return vid, (txt_sum / rows.total_windows).to(q_txt.dtype)
