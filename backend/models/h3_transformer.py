"""Our MiniMax-H3 DiT: weight-compatible with the released `transformer/` and `transformer_ref/` partitions.

Parameter names follow the checkpoint keys exactly (`transformer_blocks.{i}.attn.to_q.weight`, ...), so a released
state dict loads strictly. Compute differs from a literal port where it pays: Q/K/V run as one fused GEMM (weights
concatenated after loading), AdaLN modulation is applied per run of rows (see h3_ops.RowSegments), the output heads
project only the rows they return, and attention goes through backend.attention.dispatch.

Forward contract (one packed request; the batch axis replicates one layout):
  video_rows  [B, Nv, in_channels * prod(patch)]   rows in the order of layout.video_indices
  audio_rows  [B, Na, audio_in_channels]           rows in the order of layout.audio_indices
  text_states [B, Nt, text_dim]                    rows in the order of layout.text_indices
  timesteps   [K] distinct noise levels t in [0, 1] (1 = clean); row_timestep_index [S] indexes them
  -> (video velocity [B, Nv, 96], audio velocity [B, Na, 32]) in float32-or-head dtype, same row orders.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

import torch
from torch import nn

from ..attention.dispatch import AttentionFn, get_attention
from .block_offload import stream_blocks
from .fp8_linear import Fp8Linear, Fp8Rows, norm_modulate_rows, swiglu_rows
from .h3_ops import RowSegments, apply_rope_, rms_norm, rope_inv_freq, rope_tables, timestep_sinusoid

MODALITY_COUNT = 3  # AdaLN table row = timestep_index * 3 + tag (0 video, 1 text, 2 audio): a checkpoint contract.

# Stored in float32 in the released mixed-precision checkpoint; everything else is bfloat16.
FP32_MODULE_PREFIXES = ("proj_in.", "audio_proj_in.", "time_embedder.", "proj_out.", "audio_proj_out.")


@dataclass
class H3TransformerConfig:
    num_attention_heads: int = 56
    attention_head_dim: int = 128
    hidden_size: int = 5376
    num_layers: int = 50
    num_refiner_layers: int = 2
    ffn_dim: int = 14336
    in_channels: int = 24
    audio_in_channels: int = 32
    patch_size: tuple = (1, 2, 2)
    text_dim: int = 5120
    freq_dim: int = 256
    time_embed_hidden_dim: int = 5376
    time_embed_dim: int = 2688
    rope_freq_dim: int = 16
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qk_norm_eps: float = 1e-5
    final_norm_eps: float = 1e-5
    # 0: the time embedder and full-width AdaLN projections (the release, a diffusers folder). > 0: a "pruned" native
    # DiT (ComfyUI's curve form): a [adaln_curve_grid, time_embed_dim] table replaces the time embedder and the AdaLN
    # projections read its interpolated rows without silu; time_embed_dim is then the curve's width (see curve_rows).
    adaln_curve_grid: int = 0
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, raw: dict) -> "H3TransformerConfig":
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in raw.items() if k in known}
        if "patch_size" in values:
            values["patch_size"] = tuple(values["patch_size"])
        return cls(**values, extra={k: v for k, v in raw.items() if k not in known})

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "H3TransformerConfig":
        from .checkpoint import read_json, reading

        with reading(path):  # a value the config cannot take is an error naming the file
            return cls.from_dict(read_json(path))

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("extra")
        out["patch_size"] = list(self.patch_size)
        return out

    @property
    def video_patch_dim(self) -> int:
        return self.in_channels * self.patch_size[0] * self.patch_size[1] * self.patch_size[2]


class H3Attention(nn.Module):
    """Self-attention over the packed sequence; per-head RMSNorm on q/k; optional rotary on the leading channels.
    A FastH3 student's blocks add `to_gate_compress` (add_gate): the gate [B, S, H, D] of VSA's coarse branch, a
    plain projection of the attention input handed to the attention kernel with q, k, v (attention/vsa_kernel.py)."""

    def __init__(self, hidden: int, heads: int, head_dim: int, qk_eps: float):
        super().__init__()
        self.heads, self.head_dim, self.qk_eps = heads, head_dim, qk_eps
        inner = heads * head_dim
        self.to_q = nn.Linear(hidden, inner, bias=False)
        self.to_k = nn.Linear(hidden, inner, bias=False)
        self.to_v = nn.Linear(hidden, inner, bias=False)
        self.norm_q = nn.RMSNorm(head_dim, eps=qk_eps)
        self.norm_k = nn.RMSNorm(head_dim, eps=qk_eps)
        self.to_out = nn.ModuleList([nn.Linear(inner, hidden, bias=False)])
        self.to_gate_compress: nn.Linear | None = None  # add_gate(): a FastH3 student's learned VSA gate
        self.register_buffer("qkv_weight", None, persistent=False)  # set by fuse_qkv()
        self.qkv_fp8: Fp8Linear | None = None  # replaces qkv_weight under FP8 storage (H3Block.use_fp8_gemms)

    def add_gate(self, weight: torch.Tensor) -> None:
        """Install the learned gate projection [inner, hidden] (before fuse_qkv: it joins the fused GEMM)."""
        if self.qkv_weight is not None or self.qkv_fp8 is not None:
            raise RuntimeError("add_gate must come before fuse_qkv / FP8 quantisation.")
        gate = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        gate.weight = nn.Parameter(weight, requires_grad=False)
        self.to_gate_compress = gate

    def fuse_qkv(self) -> None:
        """One [3*inner, hidden] GEMM instead of three ([4*inner, hidden] with the gate); the separate weights are
        dropped to keep memory flat."""
        if self.qkv_weight is not None or self.qkv_fp8 is not None:
            return
        gate = [] if self.to_gate_compress is None else [self.to_gate_compress]
        parts = [self.to_q, self.to_k, self.to_v] + gate
        fused = torch.cat([lin.weight.data for lin in parts], dim=0)
        self.qkv_weight = fused
        for lin in parts:
            lin.weight = nn.Parameter(fused.new_empty(0), requires_grad=False)

    def forward(self, x: torch.Tensor | Fp8Rows, rope: tuple[torch.Tensor, torch.Tensor] | None,
                attention: AttentionFn):
        gate = None
        if self.qkv_fp8 is not None or self.qkv_weight is not None:
            qkv = self.qkv_fp8(x) if self.qkv_fp8 is not None else torch.nn.functional.linear(x, self.qkv_weight)
            b, s = qkv.shape[:2]
            q, k, v, *rest = qkv.view(b, s, -1, self.heads, self.head_dim).unbind(2)
            gate = rest[0] if rest else None
        else:
            b, s, _ = x.shape
            q = self.to_q(x).view(b, s, self.heads, self.head_dim)
            k = self.to_k(x).view(b, s, self.heads, self.head_dim)
            v = self.to_v(x).view(b, s, self.heads, self.head_dim)
            if self.to_gate_compress is not None:
                gate = self.to_gate_compress(x).view(b, s, self.heads, self.head_dim)
        q = rms_norm(q, self.norm_q.weight, self.qk_eps)
        k = rms_norm(k, self.norm_k.weight, self.qk_eps)
        if rope is not None:
            q = apply_rope_(q, *rope)
            k = apply_rope_(k, *rope)
        out = attention(q, k, v) if gate is None else attention(q, k, v, gate)
        return self.to_out[0](out.reshape(b, s, self.heads * self.head_dim))


class H3FeedForward(nn.Module):
    """SwiGLU: net.0.proj -> [hidden | gate] halves, hidden * silu(gate), net.2 back to the model width."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.net = nn.ModuleList([_Proj(dim, inner * 2), nn.Identity(), nn.Linear(inner, dim, bias=False)])

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        h = self.net[0].proj(x)
        if isinstance(self.net[2], Fp8Linear):  # SwiGLU and its row quantisation in one pass
            return self.net[2](swiglu_rows(h, kernels=not self.net[2].emulate))
        value, gate = h.chunk(2, dim=-1)
        return self.net[2](value * torch.nn.functional.silu(gate))


class _Proj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out, bias=False)


class H3RefinerBlock(nn.Module):
    """Pre-norm block over the text stream: no AdaLN, no rotary."""

    def __init__(self, cfg: H3TransformerConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self.norm1 = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = H3Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.attention_head_dim, cfg.qk_norm_eps)
        self.norm2 = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.ff = H3FeedForward(cfg.hidden_size, cfg.ffn_dim)

    def forward(self, x: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        x = x + self.attn(rms_norm(x, self.norm1.weight, self.eps), None, attention)
        return x + self.ff(rms_norm(x, self.norm2.weight, self.eps))


class H3TokenRefiner(nn.Module):
    def __init__(self, cfg: H3TransformerConfig):
        super().__init__()
        self.refiner_blocks = nn.ModuleList([H3RefinerBlock(cfg) for _ in range(cfg.num_refiner_layers)])
        self.final_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.final_norm_eps)

    def forward(self, x: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        for block in self.refiner_blocks:
            x = block(x, attention)
        return rms_norm(x, self.final_norm.weight, self.final_norm.eps)


def curve_rows(table: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """A pruned DiT's time embedding: the rows of its curve table [G, width] at [K] t values, by ComfyUI's rule
    (comfy/ldm/minimax/model.py, use_adaln_curves): grid point g is t = g / (G - 1); t is clamped to [0, 1], the lower
    row is floor(t * (G - 1)) capped at G - 2 (t = 1 reads the last interval's end), and the two rows are blended
    linearly by the fractional part, in float32. The projections after it are affine, so the modulation between two
    grid points is the same blend of the modulations at those points."""
    table = table.to(torch.float32)
    pos = timesteps.to(torch.float32).clamp(0.0, 1.0) * (table.shape[0] - 1)
    low = pos.floor().long().clamp(max=table.shape[0] - 2)
    return torch.lerp(table[low], table[low + 1], (pos - low).unsqueeze(1))


def _adaln_input(temb: torch.Tensor, dtype: torch.dtype, silu: bool) -> torch.Tensor:
    return (torch.nn.functional.silu(temb) if silu else temb).to(dtype)


def adaln_table(temb: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """A block's AdaLN projection: temb [K, time_embed_dim] -> table [K * 3, 6 * hidden] (row = timestep_index * 3 +
    tag; columns: shift/scale/gate msa, shift/scale/gate mlp). silu at temb's precision (fp32), cast to the
    projection's dtype afterwards, as the released model does (no silu for a pruned DiT's curve rows). The one home of
    this arithmetic: the direct path and the AdaLN table cache (pipelines/h3/adaln_cache.py) both call it, so their
    tables are equal bit for bit."""
    out = torch.nn.functional.linear(_adaln_input(temb, weight.dtype, silu), weight, bias)
    return out.view(-1, weight.shape[0] // MODALITY_COUNT)


def norm_out_table(temb: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """The output norm's modulation: temb [K, time_embed_dim] -> [K, 2 * hidden] (shift | scale), row = timestep."""
    return torch.nn.functional.linear(_adaln_input(temb, weight.dtype, silu), weight, bias)


@dataclass(frozen=True)
class ModulationTables:
    """One step's AdaLN modulation, computed ahead (the table cache): `blocks[i]` [R, 6 * hidden] for block i, its
    rows the ones the step's AdaLN segments index (the cache keeps only the (timestep, tag) rows the step uses and
    numbers the segments' rows to match); `out` [K, 2 * hidden], the output norm's (row = timestep index)."""

    blocks: tuple[torch.Tensor, ...]
    out: torch.Tensor


class H3AdaLNProjection(nn.Module):
    """temb [K, time_embed_dim] -> six tables [K * 3, hidden] (shift/scale/gate msa, shift/scale/gate mlp)."""

    def __init__(self, time_embed_dim: int, hidden: int, silu: bool = True):
        super().__init__()
        self.hidden = hidden
        self.silu = silu  # False in a pruned DiT: its input is the curve table's rows (curve_rows)
        self.linear = nn.Linear(time_embed_dim, 6 * hidden * MODALITY_COUNT, bias=True)

    def forward(self, temb: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
        """`dtype`: the tables' dtype when it is not the projection's (a pruned DiT projects in float32)."""
        if self.linear.weight.numel() == 0:
            raise RuntimeError("This DiT's AdaLN projection weights are offloaded (weight policy adaln='cache'): "
                               "pass the step's ModulationTables to the forward (modulation=).")
        table = adaln_table(temb, self.linear.weight, self.linear.bias, self.silu)
        return (table if dtype is None else table.to(dtype)).chunk(6, dim=-1)


class H3Block(H3RefinerBlock):
    """The refiner block's layers plus the per-block AdaLN projection, with rotary attention."""

    def __init__(self, cfg: H3TransformerConfig):
        super().__init__(cfg)
        self.adaln_proj = H3AdaLNProjection(cfg.time_embed_dim, cfg.hidden_size, silu=not cfg.adaln_curve_grid)
        self.fp8: str | None = None  # fp8_linear.MODES when use_fp8_gemms() made the GEMMs FP8

    def forward(  # noqa: D102 - different signature from the refiner's on purpose
        self,
        x: torch.Tensor,
        modulation: tuple[torch.Tensor, ...],
        segments: RowSegments,
        rope: tuple[torch.Tensor, torch.Tensor],
        attention: AttentionFn,
    ) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = modulation
        h = self._modulated(x, self.norm1.weight, segments, scale1, shift1)
        x = segments.gated_add_(x, self.attn(h, rope, attention), gate1)
        h = self._modulated(x, self.norm2.weight, segments, scale2, shift2)
        return segments.gated_add_(x, self.ff(h), gate2)

    def _modulated(self, x, weight, segments: RowSegments, scale, shift) -> torch.Tensor | Fp8Rows:
        if self.fp8 is not None:  # the next GEMM is FP8: norm, modulation and row quantisation in one pass
            return norm_modulate_rows(x, weight, self.eps, segments.runs, scale, shift, self.fp8 == "scaled_mm")
        return segments.modulate_(rms_norm(x, weight, self.eps), scale, shift)

    def use_fp8_gemms(self, emulate: bool) -> None:
        """Hold the four GEMM weights (fused QKV, attention out, SwiGLU in and out) in FP8 with per-channel scales
        and feed them rows quantised where they are produced (fp8_linear.py). Norms and adaln_proj stay as stored."""
        if self.fp8 is not None:
            return
        attn, ff = self.attn, self.ff
        attn.fuse_qkv()
        attn.qkv_fp8 = Fp8Linear.from_weight(attn.qkv_weight, emulate)
        attn.qkv_weight = None
        attn.to_out[0] = Fp8Linear.from_weight(attn.to_out[0].weight, emulate)
        ff.net[0].proj = Fp8Linear.from_weight(ff.net[0].proj.weight, emulate)
        ff.net[2] = Fp8Linear.from_weight(ff.net[2].weight, emulate)
        self.fp8 = "emulated" if emulate else "scaled_mm"


class H3TimeEmbedding(nn.Module):
    def __init__(self, freq_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(freq_dim, hidden, bias=True)
        self.linear_2 = nn.Linear(hidden, out_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.nn.functional.silu(self.linear_1(x)))


class H3NormOut(nn.Module):
    def __init__(self, hidden: int, time_embed_dim: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.linear = nn.Linear(time_embed_dim, 2 * hidden, bias=True)


class H3Transformer(nn.Module):
    def __init__(self, cfg: H3TransformerConfig, attention: str | AttentionFn = "sdpa"):
        super().__init__()
        self.config = cfg
        self.attention = get_attention(attention) if isinstance(attention, str) else attention
        hidden = cfg.hidden_size
        self.proj_in = nn.Linear(cfg.video_patch_dim, hidden, bias=True)
        self.audio_proj_in = nn.Linear(cfg.audio_in_channels, hidden, bias=True)
        self.context_embedder = nn.Linear(cfg.text_dim, hidden, bias=True)
        self.pruned = cfg.adaln_curve_grid > 0
        if self.pruned:  # ComfyUI's curve form: the table replaces the time embedder (curve_rows)
            self.time_embedder = None
            self.register_buffer("adaln_t_table", torch.empty(cfg.adaln_curve_grid, cfg.time_embed_dim,
                                                              dtype=torch.float32))
        else:
            self.time_embedder = H3TimeEmbedding(cfg.freq_dim, cfg.time_embed_hidden_dim, cfg.time_embed_dim)
        self.register_buffer("rope_inv_freq", rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta), persistent=False)
        self.token_refiner = H3TokenRefiner(cfg)
        self.transformer_blocks = nn.ModuleList([H3Block(cfg) for _ in range(cfg.num_layers)])
        self.norm_out = H3NormOut(hidden, cfg.time_embed_dim, cfg.final_norm_eps)
        self.proj_out = nn.Linear(hidden, cfg.video_patch_dim, bias=True)
        self.audio_proj_out = nn.Linear(hidden, cfg.audio_in_channels, bias=True)
        self.block_offload = None  # a BlockStreamer under the offload placement (pipelines/h3/offload.py)
        self.vsa_gates = False  # True once a FastH3 student's learned gates are installed (models/fasth3.py)

    def fuse_projections(self) -> None:
        for module in self.modules():
            if isinstance(module, H3Attention):
                module.fuse_qkv()

    def time_embedding(self, timesteps: torch.Tensor) -> torch.Tensor:
        """[K] t values -> temb [K, time_embed_dim] at the time embedder's precision (fp32 in the release); for a
        pruned DiT the curve table's interpolated rows (float32), which its projections take without silu."""
        if self.pruned:
            return curve_rows(self.adaln_t_table, timesteps)
        emb = timestep_sinusoid(timesteps, self.config.freq_dim)
        return self.time_embedder(emb.to(self.time_embedder.linear_1.weight.dtype))

    def forward(
        self,
        video_rows: torch.Tensor,
        audio_rows: torch.Tensor,
        text_states: torch.Tensor,
        timesteps: torch.Tensor,
        row_timestep_index: torch.Tensor,
        token_tags: torch.Tensor,
        position_ids: torch.Tensor,
        video_indices: torch.Tensor,
        audio_indices: torch.Tensor,
        text_indices: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        segments: tuple[RowSegments, RowSegments] | None = None,
        shard=None,
        attention_plan=None,
        modulation: ModulationTables | None = None,
        step_cache=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`rope` and `segments` (AdaLN segments, norm-out segments) may be passed precomputed for the rows this
        call owns (all rows, or the shard's when sequence-parallel): they depend only on the layout and the step's
        timestep plan, not on the activations. `shard` (parallel.ulysses.SequenceShard): this rank embeds and runs
        only its rows, attention goes through Ulysses all-to-all, and the 128-wide head outputs are gathered.
        `attention_plan`: the attention backend's per-request plan (attention/registry.py), given to every block's
        attention over the packed sequence; None for dense backends. `modulation`: the step's AdaLN tables computed
        ahead (ModulationTables); then `segments` must be the ones numbered for them, and the projection weights are
        not read (they may be offloaded). `step_cache` (pipelines/h3/step_cache.py, begun for this step): after its
        front blocks it decides whether the rest run or their residual is reused (then no later block is streamed
        in)."""
        if modulation is not None and segments is None:
            raise ValueError("modulation tables need the segments numbered for them (pipelines/h3/adaln_cache.py).")
        seq = position_ids.shape[0]
        start, stop, local = (0, seq, seq) if shard is None else (shard.start, shard.valid_stop, shard.local_len)
        adaln_rows = row_timestep_index.to(torch.long) * MODALITY_COUNT + token_tags.to(torch.long)
        if rope is None:
            rope = rope_tables(position_ids, self.rope_inv_freq)
            if shard is not None:
                rope = (shard.local(rope[0]), shard.local(rope[1]))
        if segments is None:
            rows = (adaln_rows, row_timestep_index) if shard is None else (shard.local(adaln_rows),
                                                                           shard.local(row_timestep_index))
            segments = (RowSegments.from_rows(rows[0]), RowSegments.from_rows(rows[1]))
        adaln_segments, out_segments = segments
        attention = self.attention
        if attention_plan is not None:
            backend = attention
            attention = lambda q, k, v, gate=None: backend(q, k, v, attention_plan, gate)  # noqa: E731
        if shard is not None:
            attention = shard.attention(attention)  # Ulysses: heads <-> rows all-to-all around it

        text = self.context_embedder(text_states.to(self.context_embedder.weight.dtype))
        text = self.token_refiner(text, self.attention)  # text-only attention: every rank refines all of it
        x = text.new_zeros((text.shape[0], local, text.shape[-1]))
        for indices, rows, embed in ((text_indices, None, None), (video_indices, video_rows, self.proj_in),
                                     (audio_indices, audio_rows, self.audio_proj_in)):
            mine = (indices >= start) & (indices < stop) if shard is not None else None
            where = indices if mine is None else indices[mine] - start
            values = text if rows is None else embed(rows.to(embed.weight.dtype))
            x[:, where] = (values if mine is None else values[:, mine]).to(x.dtype)

        temb = self.time_embedding(timesteps) if modulation is None else None
        # a pruned DiT projects in float32 (as ComfyUI's curve form does); its tables are cast to the stream's dtype
        mod_dtype = x.dtype if self.pruned else None
        # the blocks add into x in place: the cache keeps copies of the rows going in and after its front blocks
        x_in = x.clone() if step_cache is not None else None
        x_front = None
        blocks = stream_blocks(self.transformer_blocks, self.block_offload)
        for i, block in enumerate(blocks):
            if step_cache is not None and i == step_cache.front:
                if step_cache.reuse(x, x_in):
                    x = x + step_cache.back_residual()
                    if hasattr(blocks, "close"):  # streamed: release the block it holds, load none after it
                        blocks.close()
                    break
                x_front = x.clone()
            mod = block.adaln_proj(temb, mod_dtype) if modulation is None else modulation.blocks[i].chunk(6, dim=-1)
            x = block(x, mod, adaln_segments, rope, attention)
        if step_cache is not None and x_front is not None:
            step_cache.remember(x - x_front)

        if modulation is None:
            lin = self.norm_out.linear
            table = norm_out_table(temb, lin.weight, lin.bias, silu=not self.pruned)
            shift, scale = (table if mod_dtype is None else table.to(mod_dtype)).chunk(2, dim=-1)
        else:
            shift, scale = modulation.out.chunk(2, dim=-1)
        x = out_segments.modulate_(rms_norm(x, self.norm_out.norm.weight, self.norm_out.norm.eps), scale, shift)
        if shard is None:
            # Project only the rows each head returns: same per-row math as projecting all rows, far fewer FLOPs.
            video = self.proj_out(x[:, video_indices].to(self.proj_out.weight.dtype))
            audio = self.audio_proj_out(x[:, audio_indices].to(self.audio_proj_out.weight.dtype))
            return video, audio
        x = x.to(self.proj_out.weight.dtype)
        heads = torch.cat([self.proj_out(x), self.audio_proj_out(x).to(self.proj_out.weight.dtype)], dim=-1)
        heads = shard.gather_rows(heads)  # [B, S, 96 + 32]
        split = self.proj_out.out_features
        return heads[:, video_indices, :split], heads[:, audio_indices, split:]


def load_h3_transformer(
    folder: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    attention: str | AttentionFn = "sdpa",
    fuse: bool = True,
    storage: str = "compute",
    adapter: str | os.PathLike | None = None,
    loras: Sequence = (),
) -> H3Transformer:
    """Build on the meta device (no host copy of 33B params), then assign the checkpoint's tensors strictly.
    `adapter`: a FastH3 student's adapter file (models/fasth3.py), fused into the weights right after they load
    (before the QKV fusion and any FP8 quantisation), its learned VSA gates installed; `loras`: LoraChoice
    (models/lora.py), merged after it in that order.

    dtype None keeps the stored mixed precision; otherwise every tensor but the float32 modules is cast to it.
    storage (runtime.WeightPolicy): "compute" as loaded; "fp8" / "fp8_emulated" the blocks' GEMM weights quantised
    to FP8 after loading (H3Block.use_fp8_gemms; "fp8" checks the device can run them before anything loads)."""
    from .checkpoint import load_into, reading

    check_storage(storage, device)
    folder = os.fspath(folder)
    config = os.path.join(folder, "config.json")
    cfg = H3TransformerConfig.from_json(config)
    attention = get_attention(attention) if isinstance(attention, str) else attention  # not the file's fault
    with reading(config), torch.device("meta"):  # e.g. a width the head count does not divide: names the config
        model = H3Transformer(cfg, attention)

    def dtype_for(key: str, stored: torch.dtype) -> torch.dtype:
        if dtype is None:
            return stored
        return torch.float32 if key.startswith(FP32_MODULE_PREFIXES) else dtype

    load_into(model, folder, device=device, dtype_for=dtype_for)
    return finish_loading(model, cfg, device, fuse=fuse, storage=storage, adapter=adapter, loras=loras)


def check_storage(storage: str, device) -> None:
    """A weight storage name load_h3_transformer takes; "fp8" also needs a device that runs FP8 GEMMs."""
    from .fp8_linear import check_scaled_mm

    if storage not in ("compute", "fp8", "fp8_emulated"):
        raise ValueError(f"weight storage must be 'compute', 'fp8' or 'fp8_emulated', got {storage!r}.")
    if storage == "fp8":
        check_scaled_mm(device)


def finish_loading(model: H3Transformer, cfg: H3TransformerConfig, device, fuse: bool = True,
                   storage: str = "compute", adapter: str | os.PathLike | None = None,
                   loras: Sequence = ()) -> H3Transformer:
    """After the weights are in (from a folder, or a native single file: models/native_load.py): the student's
    adapter, the LoRAs (model.loras: their manifest entries), the rotary table, the fused QKV and the FP8 storage."""
    if adapter is not None:
        from .fasth3 import fuse_adapter, read_adapter

        fuse_adapter(model, read_adapter(adapter))
    from .lora_apply import apply_loras

    apply_loras(model, loras)  # model.loras: their manifest entries; the base copies a later switch needs
    model.rope_inv_freq = rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta).to(device)
    if fuse:
        model.fuse_projections()
    if storage in ("fp8", "fp8_emulated"):
        for block in model.transformer_blocks:
            block.use_fp8_gemms(emulate=storage == "fp8_emulated")
    return model.eval().requires_grad_(False)
