"""SeedVR2 joint window attention for one sample, batched by window shape.

What it computes (equal to the official ``NaSwinAttention`` / ``NaMMSRTransformerBlock`` attention core, same in the
3B and 7B code): for every window of a ``WindowLayout``, full attention over the joint sequence
``[that window's video tokens (window order) ; all L_txt text tokens]`` -- video first, text after, no mask; the
text queries, keys and values are the same for every window (the official code repeats the text after each
window). Video outputs go back to canonical (t, h, w) order; each text token's output is the mean of its outputs
over all windows of the sample (the official ``repeat_concat_idx`` un-concat: reshape to [L_txt, windows] and mean).

RoPE is not applied here: the caller rotates q/k before calling. In the official code RoPE comes after the q/k
RMSNorm and after the window partition, with window-local positions (``window_shape``): the 7B ("pixel") rotates
video q/k only, with per-window-shape tables; the 3B ("mmrope3d") rotates video q/k (positions restart at each
window origin) and text q/k (text position j on every axis, the same table for every window, so the text stays
shared). Each video token lies in exactly one window of a layout, so rotating it in canonical order is equivalent.

Speed: windows of equal shape are gathered into one ``[G, n + L_txt, heads, head_dim]`` batch and attended with a
single kernel call per shape group (<= 27 per layer at the released settings), never one call per window. The kernel
is an attention backend callable ``fn(q, k, v, plan=None)`` on ``[batch, seq, heads, head_dim]``
(backend/attention/registry.py), so other kernels plug in unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .windows import WindowLayout

AttentionFn = Callable[..., torch.Tensor]

# Per (layout, device): the canonical token ids of each shape group, [G, n] int64 on the device. Layouts come from
# an lru cache (stable objects), so the id plus an identity check is a safe key; bounded like that cache.
_INDEX_CACHE: Dict[Tuple[int, str], Tuple[WindowLayout, List[torch.Tensor]]] = {}
_INDEX_CACHE_MAX = 128


def group_token_ids(layout: WindowLayout, device: torch.device) -> List[torch.Tensor]:
    """Canonical token ids of every shape group's windows, [G, n] int64 on ``device`` (cached)."""
    key = (id(layout), str(device))
    hit = _INDEX_CACHE.get(key)
    if hit is not None and hit[0] is layout:
        return hit[1]
    ids = [layout.perm[g.rows].to(device) for g in layout.groups]
    if len(_INDEX_CACHE) >= _INDEX_CACHE_MAX:
        _INDEX_CACHE.clear()
    _INDEX_CACHE[key] = (layout, ids)
    return ids


def _default_attention() -> AttentionFn:
    from ...attention.registry import get_backend

    return get_backend("sdpa")


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
    """Joint window attention of one sample.

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
    heads, dim = q_vid.shape[1:]
    for name, x, rows in (("k_vid", k_vid, n_vid), ("v_vid", v_vid, n_vid), ("k_txt", k_txt, q_txt.shape[0]),
                          ("v_txt", v_txt, q_txt.shape[0]), ("q_txt", q_txt, q_txt.shape[0])):
        if tuple(x.shape) != (rows, heads, dim):
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {(rows, heads, dim)}")
    fn = attention if attention is not None else _default_attention()
    n_txt = q_txt.shape[0]

    vid_out = torch.empty_like(q_vid)
    # fp32 accumulation of the per-window text outputs (a bf16 running sum over ~100 windows would lose bits).
    txt_sum = torch.zeros(n_txt, heads, dim, dtype=torch.float32, device=q_txt.device)
    for group, ids in zip(layout.groups, group_token_ids(layout, q_vid.device)):
        g, n = ids.shape

        def joint(vid: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
            return torch.cat([vid[ids], txt.unsqueeze(0).expand(g, n_txt, heads, dim)], dim=1)

        out = fn(joint(q_vid, q_txt), joint(k_vid, k_txt), joint(v_vid, v_txt), plan)  # [G, n + L_txt, h, d]
        vid_out.index_copy_(0, ids.reshape(-1), out[:, :n].reshape(g * n, heads, dim).to(vid_out.dtype))
        if n_txt:
            txt_sum += out[:, n:].sum(0, dtype=torch.float32)
    txt_out = (txt_sum / len(layout.windows)).to(q_txt.dtype)
    return vid_out, txt_out
