"""SAGE-style quantised attention: the rule, its quantisers and its float64 reference (torch only; the Triton kernel
that runs it on SM89+ GPUs is sage_kernel.py).

The rule follows SageAttention (Zhang et al., ICLR 2025: K smoothed by its mean over the sequence, INT8 Q and K with
one scale per block, INT8 QK^T with int32 accumulation) and SageAttention2 (ICML 2025: P and V in FP8 e4m3, V with
one scale per channel, P with the static scale 448 since its online-softmax values lie in [0, 1], and the P.V product
of each tile accumulated in fp32 outside the MMA: "two-level accumulation"). Per (batch, head):
- K~ = K - mean_seq(K) (fp32). Softmax is unchanged: Q.mean(K) adds one constant to each score row.
- Q in blocks of BLOCK_M rows, K~ in blocks of BLOCK_N rows: x8 = round(x / s) in [-127, 127], s = absmax(block)/127;
  with `scales="row"` one scale per row of Q and of K~ instead (the tiles stay BLOCK_M x BLOCK_N): one outlier key
  then coarsens only its own row's codes, not those of the 127 keys beside it (heavy-tailed inputs).
- S = (q8 . k8^T) * s_q * s_k * d^-1/2, exactly (integers), per (query block, key block) tile (s_q, s_k the rows'
  scales: one per block or one per row).
- Online softmax over the key tiles in order: m = max(m, rowmax S), p = exp(S - m), l = l * exp(m_old - m) + sum(p)
  (l from the unquantised p); acc = acc * exp(m_old - m) + e4m3(p * 448) . v8 (each tile's product a fresh sum).
- V per channel: v8 = e4m3(v / s_v), s_v = absmax_seq(v) / 448. Output = acc * s_v / (448 * l).
- Skip-Softmax (off by default, `skip` > 0): a key tile whose every row has exp(rowmax S - m) < skip adds nothing
  (neither to acc nor to l); its QK^T is still computed (it decides).
The tiles are the kernel's (BLOCK_M x BLOCK_N), so the reference rounds P at the same places the kernel does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BLOCK_M = 128  # query rows per Q scale (and per kernel program)
BLOCK_N = 128  # key rows per K scale (and per kernel key tile): 128 measured 0.88x of 64's kernel time (H100)
INT8_MAX = 127.0
FP8_MAX = 448.0  # e4m3fn's largest finite value: P's static scale and V's per-channel range
FP8 = torch.float8_e4m3fn


SCALES = ("block", "row")  # Q / K scale granularity: one per block of the tile (the default), or one per row


@dataclass(frozen=True)
class SageSettings:
    skip: float = 0.0  # Skip-Softmax threshold on exp(tile max - running max); 0: every tile counts
    scales: str = "block"  # one INT8 scale per Q / K block, or per row ("row": finer for heavy tails)

    def __post_init__(self):
        s = self.skip
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s < 1:
            raise ValueError(f"sage skip must be a number in [0, 1) (0: off; e.g. 0.001), got {s!r}.")
        if self.scales not in SCALES:
            raise ValueError(f"sage scales must be one of {', '.join(SCALES)}, got {self.scales!r}.")

    def spec(self) -> str:
        """The settings that differ from the defaults, as parse reads them ('skip=0.001,scales=row')."""
        parts = [f"skip={self.skip!r}"] if self.skip else []
        return ",".join(parts + ([f"scales={self.scales}"] if self.scales != "block" else []))

    @classmethod
    def parse(cls, text: str) -> "SageSettings":
        """'skip=0.001,scales=row' (each key optional) -> settings; one clear line on anything else."""
        values = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = (x.strip() for x in part.partition("="))
            try:
                if not sep or key not in ("skip", "scales"):
                    raise ValueError
                values[key] = raw if key == "scales" else float(raw)
            except ValueError:
                raise ValueError(f"sage option {part!r} is not skip=<number> or scales=block|row.") from None
        return cls(**values)


@dataclass(frozen=True)
class SageOperands:
    """The quantised operands of one attention call over `seq` rows of D channels, as the kernel reads them, each
    zero-padded along the sequence to its block size (so the kernel's loads need no masks; only the last key tile's
    scores are masked): q8 [B, H, Sq, D] int8, q_scale [B, H, Sq/q_rows]; k8 [B, H, Sk, D] int8, k_scale
    [B, H, Sk/k_rows] (fp32 scales; q_rows / k_rows rows per scale, dividing block_m / block_n; padding rows have
    scale 1); v8 [B, H, D, Sk] e4m3 (transposed: the P.V MMA reads V with the sequence contiguous, as Hopper's FP8
    MMA wants its second operand), v_scale [B, H, D] fp32. All contiguous."""
    q8: torch.Tensor
    q_scale: torch.Tensor
    k8: torch.Tensor
    k_scale: torch.Tensor
    v8: torch.Tensor
    v_scale: torch.Tensor
    seq: int
    block_m: int = BLOCK_M
    block_n: int = BLOCK_N
    q_rows: int = BLOCK_M
    k_rows: int = BLOCK_N


def divide_rn(x: torch.Tensor, by: float) -> torch.Tensor:
    """x / by rounded once (IEEE): torch's CUDA division by a Python number multiplies by its reciprocal (1 ulp off
    at times), which would make the scales depend on the device and differ from the Triton quantisers'."""
    return x / torch.full_like(x, by)


def quantize_int8_blocks(x: torch.Tensor, block: int, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, S, H, D] (any float) -> (int8 [B, H, R, D] zero-padded, fp32 scales [B, H, R / block]), R = S rounded up
    to a multiple of `pad_to` (a multiple of `block`; default `block`): one absmax scale per block of `block` rows of
    a head; an all-zero block (padding too) gets scale 1 (its values are 0 anyway)."""
    b, s, h, d = x.shape
    pad_to = pad_to or block
    assert pad_to % block == 0, (block, pad_to)
    n = -(-s // pad_to) * pad_to // block
    xf = x.transpose(1, 2).float()
    padded = torch.nn.functional.pad(xf, (0, 0, 0, n * block - s)).view(b, h, n, block, d)
    scale = divide_rn(padded.abs().amax(dim=(-1, -2)), INT8_MAX)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(padded / scale[..., None, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.view(b, h, n * block, d).contiguous(), scale  # (no padding: the ops above kept x's strides)


def quantize_v_fp8(v: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, S, H, D] -> (e4m3 [B, H, D, n * block] zero-padded, fp32 per-channel scales [B, H, D])."""
    s = v.shape[1]
    vf = v.float()
    scale = divide_rn(vf.abs().amax(dim=1), FP8_MAX)  # [B, H, D]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    v8 = torch.nn.functional.pad((vf / scale[:, None]).permute(0, 2, 3, 1), (0, -(-s // block) * block - s))
    return v8.to(FP8).contiguous(), scale


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = BLOCK_M, block_n: int = BLOCK_N,
             scales: str = "block") -> SageOperands:
    """The rule's operands from q, k, v [B, S, H, D] (module docstring): K smoothed, then the three quantised;
    `scales` "row": a Q / K scale per row, the operands still padded to the tiles."""
    k_smooth = k.float() - k.mean(dim=1, dtype=torch.float32, keepdim=True)  # (sage_kernel.quantize_on_gpu: the same)
    q_rows, k_rows = (1, 1) if scales == "row" else (block_m, block_n)
    q8, q_scale = quantize_int8_blocks(q, q_rows, block_m)
    k8, k_scale = quantize_int8_blocks(k_smooth, k_rows, block_n)
    v8, v_scale = quantize_v_fp8(v, block_n)
    return SageOperands(q8, q_scale, k8, k_scale, v8, v_scale, q.shape[1], block_m, block_n, q_rows, k_rows)


def attend_quantized(ops: SageOperands, settings: SageSettings = SageSettings(), dtype=torch.float64,
                     query_blocks: slice | None = None) -> torch.Tensor:
    """The rule in `dtype` (float64: the reference; float32: the CPU path) from its quantised operands ->
    [B, S', H, D] in `dtype` for the query rows of `query_blocks` (blocks of block_m rows; None: all rows)."""
    b, h, _, d = ops.q8.shape
    s, bm, bn = ops.seq, ops.block_m, ops.block_n
    first, stop, _ = (query_blocks or slice(None)).indices(-(-s // bm))
    q = ops.q8[:, :, first * bm:stop * bm].to(dtype).view(b, h, stop - first, bm, d)
    q_scale = ops.q_scale.repeat_interleave(ops.q_rows, -1)[:, :, first * bm:stop * bm]  # a scale per row
    q = q * (q_scale.view(b, h, stop - first, bm, 1).to(dtype) * d ** -0.5)
    k, v = ops.k8.to(dtype), ops.v8.to(dtype)  # v: [B, H, D, Sk]
    k_scale = ops.k_scale.repeat_interleave(ops.k_rows, -1).to(dtype)  # [B, H, Sk]: a scale per key row
    m = torch.full(q.shape[:-1], -math.inf, dtype=dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(q)
    log_skip = math.log(settings.skip) if settings.skip > 0 else None
    for start in range(0, s, bn):
        end = min(start + bn, s)
        kj = k[:, :, start:end] * k_scale[:, :, start:end, None]  # [B, H, n, D]
        scores = torch.einsum("bhqrd,bhnd->bhqrn", q, kj)
        tile_max = scores.amax(-1)
        m_new = torch.maximum(m, tile_max)
        p = torch.exp(scores - m_new[..., None])
        alpha = torch.exp(m - m_new)
        pv = torch.einsum("bhqrn,bhdn->bhqrd", (p * FP8_MAX).to(FP8).to(dtype), v[..., start:end])
        if log_skip is not None:  # a tile that every row of a query block finds negligible is left out
            keep = ((tile_max - m_new) >= log_skip).any(-1)[..., None]  # [B, H, nq, 1]
            alpha = torch.where(keep, alpha, torch.ones_like(alpha))
            p = p * keep[..., None]
            pv = pv * keep[..., None]
            m_new = torch.where(keep, m_new, m)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + pv
        m = m_new
    out = acc * ops.v_scale[:, :, None, None, :].to(dtype) / (FP8_MAX * l[..., None])
    out = out.view(b, h, -1, d)[:, :, : min(stop * bm, s) - first * bm]
    return out.transpose(1, 2)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, settings: SageSettings = SageSettings()
              ) -> torch.Tensor:
    """The rule in float64 from q, k, v [B, S, H, D] -> [B, S, H, D] float64."""
    return attend_quantized(quantize(q, k, v, scales=settings.scales), settings)
