"""A straightforward port of the official SeedVR2 DiT forward, for the benchmark's "peer" column only (never used by
the package). It runs on the same SeedVR2DiT module's weights and keeps the official program's shape:
- per layer, the video is partitioned into its windows (a gather into window order), each window's tokens are
  concatenated with a copy of the text (repeat-concat), one attention call runs per window over the packed sequence,
  the text copies are averaged back and the video is scattered back to canonical order (the reverse partition);
- whole-sequence ops, no row chunking (the MLP's hidden pair for all rows at once);
- RoPE tables built per window.
Numerically it computes the same function as our forward (bf16 rounding aside)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from comfyui_h3.backend.models.seedvr2 import rope as R
from comfyui_h3.backend.models.seedvr2.dit import rms_norm
from comfyui_h3.backend.models.seedvr2.windows import layer_window_methods, window_layout, window_shape


def _mod(e, ada, name, i):
    return e[:, i, 1] + getattr(ada, f"{name}_scale"), e[:, i, 0] + getattr(ada, f"{name}_shift"), \
        e[:, i, 2] + getattr(ada, f"{name}_gate")


def _qkv(x, attn, stream, cfg, mod):
    y = rms_norm(x, None, cfg.norm_eps)
    if mod is not None:
        y = y * mod[0] + mod[1]
    qkv = attn.proj_qkv.of(stream)(y).view(x.shape[0], 3, cfg.heads, cfg.head_dim)
    return (rms_norm(qkv[:, 0], attn.norm_q.of(stream).weight, cfg.norm_eps),
            rms_norm(qkv[:, 1], attn.norm_k.of(stream).weight, cfg.norm_eps), qkv[:, 2])


@torch.no_grad()
def naive_forward(dit, vid: torch.Tensor, txt: torch.Tensor, timestep: float = 1000.0) -> torch.Tensor:
    cfg = dit.config
    tokens, grid = dit._patchify(vid)
    x = dit.vid_in.proj(tokens)
    t = dit.txt_in(txt.to(vid.dtype))
    e = dit.emb_in(timestep, vid.dtype, vid.device).view(cfg.dim, 2, 3)
    L = txt.shape[0]
    methods = layer_window_methods(cfg.layers)
    for i, blk in enumerate(dit.blocks):
        layout = window_layout(methods[i], grid, cfg.window_counts)
        perm = layout.perm.to(vid.device)
        last = i == cfg.layers - 1
        v_scale, v_shift, v_gate = _mod(e, blk.ada.of("vid"), "attn", 0)
        q, k, v = _qkv(x, blk.attn, "vid", cfg, (v_scale, v_shift))
        tmod = None if not blk.text_modulated else _mod(e, blk.ada.of("txt"), "attn", 0)
        tq, tk, tv = _qkv(t, blk.attn, "txt", cfg, None if tmod is None else tmod[:2])
        if cfg.rope == "mmrope3d":
            ttab = R.mmrope3d_text_table(L, cfg.rope_dim, device=vid.device)
            tq, tk = R.apply_rope(tq, ttab), R.apply_rope(tk, ttab)
        # partition: window order, then per window [video ; text] packed, one attention call per window
        q, k, v = q[perm], k[perm], v[perm]
        outs, txt_outs, at = [], [], 0
        for win in layout.windows:
            shape = window_shape(win)
            n = shape[0] * shape[1] * shape[2]
            if cfg.rope == "mmrope3d":
                tab = R.mmrope3d_video_table(shape, L, cfg.rope_dim, device=vid.device)
            else:
                tab = R.pixel_video_table(shape, cfg.head_dim, device=vid.device)
            qw = torch.cat([R.apply_rope(q[at:at + n], tab), tq])
            kw = torch.cat([R.apply_rope(k[at:at + n], tab), tk])
            vw = torch.cat([v[at:at + n], tv])
            o = F.scaled_dot_product_attention(qw.transpose(0, 1)[None], kw.transpose(0, 1)[None],
                                               vw.transpose(0, 1)[None])[0].transpose(0, 1)
            outs.append(o[:n])
            txt_outs.append(o[n:].float())
            at += n
        o = torch.empty_like(v)
        o[perm] = torch.cat(outs)  # reverse partition
        txt_o = torch.stack(txt_outs).mean(0).to(t.dtype)
        x = x + blk.attn.proj_out.of("vid")(o.flatten(1)) * v_gate
        m_scale, m_shift, m_gate = _mod(e, blk.ada.of("vid"), "mlp", 1)
        x = x + blk.mlp.of("vid")(rms_norm(x, None, cfg.norm_eps) * m_scale + m_shift) * m_gate
        if not last:
            t = t + blk.attn.proj_out.of("txt")(txt_o.flatten(1)) * tmod[2]
            ts, tsh, tg = _mod(e, blk.ada.of("txt"), "mlp", 1)
            t = t + blk.mlp.of("txt")(rms_norm(t, None, cfg.norm_eps) * ts + tsh) * tg
    out = dit._head(x, e)
    return dit._unpatchify(out, grid)
