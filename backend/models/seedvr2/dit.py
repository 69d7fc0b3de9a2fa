"""SeedVR2 DiT ("NaDiT"): the released 3B and 7B one-step restoration transformers, weight-compatible with the
official checkpoints (state dict keys and shapes are the official ones) and equal to the official forward in fp32.

Contract (stated once here):
- ``forward(vid, txt, timestep)``: vid [T, H, W, vid_in_channels] latent grid, channel-last, the channels
  ``[x_t 16 | condition 16 | mask 1]``; txt [L_txt, txt_dim] text embedding; timestep a float (1000.0 at inference).
  Returns the velocity [T, H, W, vid_out_channels] (on the driver rank; None on other ranks of a routed run).
- Patching (1, 2, 2): token (t, h, w) gathers latent pixels (t, 2h + dh, 2w + dw) at input index
  ``(dh * 2 + dw) * C + c`` (dh slowest, channel fastest); the output projection unpatches the same way. Token rows
  are in canonical row-major (t, h, w) order before the routing takes them (routing.py).
- Activations run in vid's dtype (the caller casts the weights); norm statistics, RoPE and the text mean over
  windows run in float32.
- Modulation ("AdaSingle"): the timestep embedding e [6 * dim] is viewed [dim, 2, 3] = (channel, layer attn|mlp,
  shift|scale|gate); per block and stream the learned vectors are added: in = h * (e_scale + scale) + (e_shift +
  shift), out = h * (e_gate + gate) (the scale vectors sit around 1: no "1 +").
- Block per stream: x += out_attn(Attn(in_attn(norm(x)))); x += out_mlp(MLP(in_mlp(norm(x)))), norm = RMSNorm
  without affine. Attention: qkv split (qkv, head, d), per-head affine RMSNorm on q and k, then RoPE, joint window
  attention (window_attention.py), proj_out.
- 3B quirks reproduced: the last layer's mlp/ada are video-only, so its text enters attention as plain RMSNorm(txt)
  (unmodulated); the output head reuses the *attention* shift/scale slice of e (an upstream cache-key collision):
  out = RMSNorm_affine(x) * (e_scale_attn + out_scale) + (e_shift_attn + out_shift).
- Text leaves the model after the last layer, so the last layer's text output (attention out, MLP) is not computed.
- RoPE frequencies: each block rotates with the ``blocks.N.attn.rope.rope.freqs`` its checkpoint stores, as the
  official code does (the released fp16 files hold fp16-rounded values), kept as float32 values plus the stored
  dtype, in which the angles are computed as the official code computes them (rope.py). A buffer that is not
  float16/bfloat16/float32/float64 (fp8 files round it to 3 bits) gives way to the formula; a buffer that disagrees
  with the formula beyond its dtype's rounding is a foreign or damaged file and is refused (StoredRopeError naming
  the key; the loader adds the file).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..fp8_linear import Fp8Linear
from . import rope as R
from .dit_config import DiTConfig
from .routing import LayerRows, LocalRouting, WindowRouting
from .window_attention import window_attention_rows

# Rows per chunk for the per-token work (norm, modulation, projections, MLP): bounds the temporaries (the SwiGLU
# hidden pair is 2 x 6912 wide) without changing any result.
DEFAULT_CHUNK_ROWS = 16384


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, statistics and weight product in float32, result in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def timestep_sinusoid(timestep: float | torch.Tensor, dim: int = 256, dtype: torch.dtype = torch.float32,
                      device: Any = None) -> torch.Tensor:
    """[dim] float32 = [sin(t f_k) | cos(t f_k)], f_k = 10000^(-k / (dim/2)) (diffusers' get_timestep_embedding
    with flip_sin_to_cos False, shift 0, as the official TimeEmbedding calls it). The timestep is first rounded to
    the activation dtype, as the official code makes its tensor (1000.0 is exact in bf16)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=device) / half)
    t = torch.as_tensor(timestep, device=device).to(dtype).float().reshape(-1)
    if t.numel() != 1:
        raise ValueError(f"SeedVR2 timestep must be one value; got shape {tuple(t.shape)}")
    ang = t[:, None] * freqs[None, :]
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)[0]


# ---- modules (names and registration order follow the official checkpoints) --------------------------------------


class _Streams(nn.Module):
    """One module per stream (``vid``, ``txt``) or one shared by both (``all``); ``vid_only`` drops ``txt``."""

    def __init__(self, make: Callable[[], nn.Module], shared: bool, vid_only: bool = False):
        super().__init__()
        self.shared = shared
        if shared:
            self.all = make()
        else:
            self.vid = make()
            if not vid_only:
                self.txt = make()

    def of(self, stream: str) -> nn.Module:
        return self.all if self.shared else getattr(self, stream)


class _NormWeight(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class StoredRopeError(ValueError):
    """A checkpoint's RoPE frequency buffer is not the SeedVR2 one (message names the key)."""


#: Stored dtypes whose RoPE buffer is used; others (fp8) keep the formula.
_USABLE_ROPE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _StoredFreqs(nn.Module):
    """The checkpoint's ``rope.rope.freqs`` buffer. ``values`` (float32 values as a tuple, rope.py's cache key) and
    ``dtype`` (the stored dtype's name) are what the block rotates with: the formula until a state dict is loaded,
    then the stored buffer when usable. Plain attributes, so that casting the module never rounds them."""

    def __init__(self, formula: Tuple[float, ...]):
        super().__init__()
        self.register_buffer("freqs", torch.tensor(formula, dtype=torch.float32))  # meta on a meta-built model
        self.formula = formula
        self.values, self.dtype = formula, "float32"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "freqs"
        stored = state_dict.get(key)
        if isinstance(stored, torch.Tensor) and stored.device.type != "meta":
            state_dict[key] = self._adopt(key, stored)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _adopt(self, key: str, stored: torch.Tensor) -> torch.Tensor:
        formula = torch.tensor(self.formula, dtype=torch.float32)
        if stored.shape != formula.shape:
            return stored  # the strict load refuses it, naming the shapes
        if stored.dtype not in _USABLE_ROPE_DTYPES:
            self.values, self.dtype = self.formula, "float32"  # fp8: the formula's float32 values
            return formula
        values = stored.detach().to(device="cpu", dtype=torch.float32)
        info = torch.finfo(stored.dtype)
        # Rounding to the stored dtype moves a value by at most half an ulp: allow one ulp (and the tiniest normal).
        bound = formula.abs() * max(info.eps, torch.finfo(torch.float32).eps) + info.tiny
        bad = ~((values - formula).abs() <= bound)  # NaN counts as bad
        if bool(bad.any()):
            j = int(bad.nonzero()[0, 0])
            raise StoredRopeError(
                f"{key} holds RoPE frequency {float(values[j]):.6g} at index {j} where SeedVR2's is "
                f"{float(formula[j]):.6g} (more than {str(stored.dtype).replace('torch.', '')} rounding apart): "
                f"not a SeedVR2 checkpoint of this model, or a damaged one")
        self.values = tuple(values.tolist())
        self.dtype = str(stored.dtype).replace("torch.", "")  # float64 is computed in float32 (rope.py)
        return values


class _RopeHolder(nn.Module):
    def __init__(self, freqs: Tuple[float, ...]):
        super().__init__()
        self.rope = _StoredFreqs(freqs)


class _Ada(nn.Module):
    """Learned AdaSingle vectors: {layer}_shift, {layer}_scale, {layer}_gate for each layer name."""

    def __init__(self, dim: int, layers: Tuple[str, ...] = ("attn", "mlp"), gates: bool = True):
        super().__init__()
        for name in layers:
            self.register_parameter(f"{name}_shift", nn.Parameter(torch.zeros(dim)))
            self.register_parameter(f"{name}_scale", nn.Parameter(torch.ones(dim)))
            if gates:
                self.register_parameter(f"{name}_gate", nn.Parameter(torch.zeros(dim)))


class _SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.proj_in_gate = nn.Linear(dim, hidden, bias=False)
        self.proj_out = nn.Linear(hidden, dim, bias=False)
        self.proj_in = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(F.silu(self.proj_in_gate(x)).mul_(self.proj_in(x)))


class _GeluMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.proj_in = nn.Linear(dim, hidden)
        self.proj_out = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(F.gelu(self.proj_in(x), approximate="tanh"))


class _PatchProj(nn.Module):
    def __init__(self, din: int, dout: int):
        super().__init__()
        self.proj = nn.Linear(din, dout)


class _TimeEmbedding(nn.Module):
    def __init__(self, dim: int, out_dim: int, sinusoid_dim: int = 256):
        super().__init__()
        self.sinusoid_dim = sinusoid_dim
        self.proj_in = nn.Linear(sinusoid_dim, dim)
        self.proj_hid = nn.Linear(dim, dim)
        self.proj_out = nn.Linear(dim, out_dim)

    def forward(self, timestep: float | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        e = timestep_sinusoid(timestep, self.sinusoid_dim, dtype, device).to(dtype)
        e = F.silu(self.proj_in(e))
        e = F.silu(self.proj_hid(e))
        return self.proj_out(e)


class _Attention(nn.Module):
    def __init__(self, cfg: DiTConfig, shared: bool):
        super().__init__()
        inner = cfg.inner_dim
        self.proj_qkv = _Streams(lambda: nn.Linear(cfg.dim, 3 * inner, bias=False), shared)
        self.proj_out = _Streams(lambda: nn.Linear(inner, cfg.dim), shared)
        self.norm_q = _Streams(lambda: _NormWeight(cfg.head_dim), shared)
        self.norm_k = _Streams(lambda: _NormWeight(cfg.head_dim), shared)
        with torch.device("cpu"):  # the formula's values, also while the model is built on the meta device
            if cfg.rope == "mmrope3d":
                freqs = R.mmrope3d_frequencies(cfg.rope_dim)
            else:
                freqs = R.pixel_frequencies(cfg.head_dim)
        self.rope = _RopeHolder(tuple(freqs.tolist()))


class _Block(nn.Module):
    def __init__(self, cfg: DiTConfig, layer: int):
        super().__init__()
        shared = cfg.shared(layer)
        vid_only = cfg.last_layer_video_only and layer == cfg.layers - 1
        mlp_cls = _SwiGLU if cfg.mlp == "swiglu" else _GeluMLP
        self.attn = _Attention(cfg, shared)
        self.mlp = _Streams(lambda: mlp_cls(cfg.dim, cfg.mlp_hidden), shared, vid_only)
        self.ada = _Streams(lambda: _Ada(cfg.dim), shared, vid_only)
        self.text_modulated = not vid_only
        self.fp8: str | None = None  # None: the GEMM weights as loaded; "emulated" / "scaled_mm": FP8 (below)

    def use_fp8_gemms(self, emulate: bool) -> None:
        """Hold the block's GEMM weights (attention qkv and out, the MLP; every stream) in float8 e4m3 with
        per-channel scales (fp8_linear.py; a weight loaded as e4m3, a release's fp8 file, is taken as it is with
        scale 1). Biases stay bfloat16, norms and the AdaSingle vectors as loaded; each GEMM quantises its input
        per row."""
        if self.fp8 is not None:
            return
        for part in (self.attn.proj_qkv, self.attn.proj_out, self.mlp):
            for parent in list(part.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.Linear):
                        setattr(parent, name, Fp8Linear.from_linear(child, emulate))
        self.fp8 = "emulated" if emulate else "scaled_mm"


# ---- the model ------------------------------------------------------------------------------------------------------


class SeedVR2DiT(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        cfg = self.config = config
        self.chunk_rows = DEFAULT_CHUNK_ROWS
        self.vid_in = _PatchProj(cfg.patch_in_dim, cfg.dim)
        self.txt_in = nn.Linear(cfg.txt_dim, cfg.dim)
        self.emb_in = _TimeEmbedding(cfg.dim, 6 * cfg.dim)
        self.blocks = nn.ModuleList(_Block(cfg, i) for i in range(cfg.layers))
        if cfg.out_norm:
            self.vid_out_norm = _NormWeight(cfg.dim)
            self.vid_out_ada = _Ada(cfg.dim, layers=("out",), gates=False)
        self.vid_out = _PatchProj(cfg.dim, cfg.patch_out_dim)
        # Placement "offload": the BlockStreamer that brings each block's weights in around its run
        # (pipelines/seedvr2/placement.py); None: every weight where it is.
        self.block_offload = None

    # -- patching ---------------------------------------------------------------------------------------------------

    def _patchify(self, vid: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int, int]]:
        cfg = self.config
        _, ph, pw = cfg.patch
        if vid.dim() != 4 or vid.shape[-1] != cfg.vid_in_channels or vid.shape[1] % ph or vid.shape[2] % pw:
            raise ValueError(
                f"SeedVR2 DiT input has shape {tuple(vid.shape)}; expected [T, H, W, {cfg.vid_in_channels}] "
                f"with H divisible by {ph} and W by {pw}"
            )
        t, h, w, c = vid.shape
        grid = (t, h // ph, w // pw)
        tokens = vid.reshape(t, grid[1], ph, grid[2], pw, c).permute(0, 1, 3, 2, 4, 5)
        return tokens.reshape(t * grid[1] * grid[2], ph * pw * c), grid

    def _unpatchify(self, out: torch.Tensor, grid: Tuple[int, int, int]) -> torch.Tensor:
        _, ph, pw = self.config.patch
        t, h, w = grid
        c = self.config.vid_out_channels
        return out.reshape(t, h, w, ph, pw, c).permute(0, 1, 3, 2, 4, 5).reshape(t, h * ph, w * pw, c)

    # -- pieces of a block ------------------------------------------------------------------------------------------

    def _chunks(self, n: int):
        step = max(int(self.chunk_rows), 1)
        for a in range(0, n, step):
            yield a, min(a + step, n)

    def _qkv(self, x: torch.Tensor, attn: _Attention, stream: str, mod: Optional[Tuple[torch.Tensor, torch.Tensor]]):
        """x [n, dim] -> q, k (RMS-normalised, not rotated), v: [n, heads, head_dim] each, chunked by rows."""
        cfg = self.config
        n, h, d = x.shape[0], cfg.heads, cfg.head_dim
        lin = attn.proj_qkv.of(stream)
        wq, wk = attn.norm_q.of(stream).weight, attn.norm_k.of(stream).weight
        q, k, v = (torch.empty((n, h, d), dtype=x.dtype, device=x.device) for _ in range(3))
        for a, b in self._chunks(n):
            y = rms_norm(x[a:b], None, cfg.norm_eps)
            if mod is not None:
                y.mul_(mod[0]).add_(mod[1])
            qkv = lin(y).view(b - a, 3, h, d)
            q[a:b] = rms_norm(qkv[:, 0], wq, cfg.norm_eps)
            k[a:b] = rms_norm(qkv[:, 1], wk, cfg.norm_eps)
            v[a:b] = qkv[:, 2]
        return q, k, v

    def _add_attn_out(self, x: torch.Tensor, o: torch.Tensor, proj: nn.Module, gate: torch.Tensor) -> None:
        o = o.flatten(1)
        for a, b in self._chunks(x.shape[0]):
            x[a:b].add_(proj(o[a:b]).mul_(gate))

    def _add_mlp(self, x: torch.Tensor, mlp: nn.Module, scale: torch.Tensor, shift: torch.Tensor,
                 gate: torch.Tensor) -> None:
        for a, b in self._chunks(x.shape[0]):
            y = rms_norm(x[a:b], None, self.config.norm_eps).mul_(scale).add_(shift)
            x[a:b].add_(mlp(y).mul_(gate))

    @staticmethod
    def _modulation(e: torch.Tensor, ada: nn.Module):
        """(attn in (scale, shift), attn gate, mlp in (scale, shift), mlp gate) for one stream's ada vectors."""
        out = []
        for i, name in enumerate(("attn", "mlp")):
            shift = e[:, i, 0] + getattr(ada, f"{name}_shift")
            scale = e[:, i, 1] + getattr(ada, f"{name}_scale")
            gate = e[:, i, 2] + getattr(ada, f"{name}_gate")
            out += [(scale, shift), gate]
        return out

    def _block(self, i: int, x: torch.Tensor, txt: torch.Tensor, e: torch.Tensor, rows: LayerRows,
               routing: WindowRouting, attention: Any, plan: Any, txt_len: int) -> torch.Tensor:
        cfg = self.config
        blk: _Block = self.blocks[i]
        last = i == cfg.layers - 1
        vid_in, vid_gate, vid_mlp_in, vid_mlp_gate = self._modulation(e, blk.ada.of("vid"))
        if blk.text_modulated:
            txt_in, txt_gate, txt_mlp_in, txt_mlp_gate = self._modulation(e, blk.ada.of("txt"))
        else:  # 3B last layer: text enters attention as plain RMSNorm(txt)
            txt_in = None

        q, k, v = self._qkv(x, blk.attn, "vid", vid_in)
        tq, tk, tv = self._qkv(txt, blk.attn, "txt", txt_in)
        stored = dict(freqs=blk.attn.rope.rope.values, freqs_dtype=blk.attn.rope.rope.dtype)
        if cfg.rope == "mmrope3d":
            ttab = R.mmrope3d_text_table(txt_len, cfg.rope_dim, device=x.device, **stored)
            tq, tk = R.apply_rope(tq, ttab), R.apply_rope(tk, ttab)

            def rope(shape):
                return R.mmrope3d_video_table(shape, txt_len, cfg.rope_dim, device=x.device, **stored)
        else:
            def rope(shape):
                return R.pixel_video_table(shape, cfg.head_dim, device=x.device, **stored)

        o, txt_sum = window_attention_rows(q, k, v, tq, tk, tv, rows, attention=attention, plan=plan, rope=rope)
        del q, k, v
        self._add_attn_out(x, o, blk.attn.proj_out.of("vid"), vid_gate)
        del o
        self._add_mlp(x, blk.mlp.of("vid"), *vid_mlp_in, vid_mlp_gate)
        if last:  # the text is discarded after the last layer
            return txt
        txt_o = (routing.reduce_text(txt_sum) / rows.total_windows).to(txt.dtype)
        self._add_attn_out(txt, txt_o, blk.attn.proj_out.of("txt"), txt_gate)
        self._add_mlp(txt, blk.mlp.of("txt"), *txt_mlp_in, txt_mlp_gate)
        return txt

    def _head(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        out = torch.empty((x.shape[0], cfg.patch_out_dim), dtype=x.dtype, device=x.device)
        if cfg.out_norm:
            # The attention slice of e (layer 0: shift g=0, scale g=1), as the official cache collision makes it.
            scale = e[:, 0, 1] + self.vid_out_ada.out_scale
            shift = e[:, 0, 0] + self.vid_out_ada.out_shift
        for a, b in self._chunks(x.shape[0]):
            y = x[a:b]
            if cfg.out_norm:
                y = rms_norm(y, self.vid_out_norm.weight, cfg.norm_eps).mul_(scale).add_(shift)
            out[a:b] = self.vid_out.proj(y)
        return out

    # -- forward ----------------------------------------------------------------------------------------------------

    @torch.no_grad()  # inference only: the residual stream is updated in place
    def forward(
        self,
        vid: torch.Tensor,
        txt: torch.Tensor,
        timestep: float | torch.Tensor,
        routing: Optional[WindowRouting] = None,
        attention: Any = None,
        plan: Any = None,
        check: Optional[Callable[[], None]] = None,
    ) -> Optional[torch.Tensor]:
        """vid [T, H, W, vid_in_channels], txt [L_txt, txt_dim], timestep -> velocity [T, H, W, vid_out_channels]
        (None on non-driver ranks of a routed run). ``routing`` defaults to LocalRouting over the token grid;
        ``attention`` is an attention backend (fn(q, k, v, plan=None), registry "sdpa" by default), called once
        per window-shape group per layer; ``plan`` is passed through to it; ``check`` is called before every block (a
        Stop check that raises; with several ranks every rank must call it alike)."""
        cfg = self.config
        if txt.dim() != 2 or txt.shape[1] != cfg.txt_dim:
            raise ValueError(f"SeedVR2 DiT text has shape {tuple(txt.shape)}; expected [L_txt, {cfg.txt_dim}]")
        tokens, grid = self._patchify(vid)
        if routing is None:
            routing = LocalRouting(grid, cfg.layers, cfg.window_counts)
        dtype = vid.dtype
        x = self.vid_in.proj(routing.start(tokens))
        del tokens
        t = self.txt_in(txt.to(dtype))
        e = self.emb_in(timestep, dtype, vid.device).view(cfg.dim, 2, 3)
        streamer = self.block_offload
        for i in range(cfg.layers):
            if check is not None:
                check()
            if streamer is None:
                t = self._block(i, x, t, e, routing.rows(i), routing, attention, plan, txt.shape[0])
            else:
                streamer.acquire(i)
                try:
                    t = self._block(i, x, t, e, routing.rows(i), routing, attention, plan, txt.shape[0])
                finally:
                    streamer.release(i)
            if i < cfg.layers - 1:
                x = routing.advance(x, i)
        out = routing.finish(self._head(x, e))
        return None if out is None else self._unpatchify(out, grid)
