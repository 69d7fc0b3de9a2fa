"""FP8 GEMMs for the DiT blocks of H3 and SeedVR2 (WeightPolicy storage "fp8"; "fp8_emulated" for tests and CI).

The contract, stated once (fp8_kernels.py follows it on the GPU; the torch reference here is its definition):
- Weights: float8_e4m3fn [N, K] with one fp32 scale per output channel, w[n] ~= q[n] * scale[n], scale = amax / 448.
  Quantised once at load from the stored bf16 weights.
- Activations: each row of a GEMM input gets its own fp32 scale, amax(row) / 448 (at least MIN_AMAX / 448), and
  q = clamp(y / scale, -448, 448) rounded to nearest. y is the producer's fp32 result (RMSNorm + AdaLN modulation,
  SwiGLU, or the attention output), so the bf16 intermediate the bf16 path writes is never made.
- Matmul: out[m, n] = (sum_k qa[m, k] * qw[n, k]) * sa[m] * sw[n], summed in fp32, returned in bfloat16. "scaled_mm"
  mode runs torch._scaled_mm with row-wise scales (CUDA, compute capability 8.9+); "emulated" mode dequantises and
  sums the same exact fp8 products in fp32 on any device. Both modes quantise the same way.
Per-row scales keep rows independent: a row's output does not depend on the other rows, so sequence-parallel shards
and batches equal one rank. Norms, embeddings, heads and the AdaLN projection are not touched (their stored
precision); the refiner blocks (text only, ~500 rows) stay bf16 too.

On CUDA the activation quantisation is fused into its producer by Triton kernels (fp8_kernels.py); where Triton is
missing the torch reference runs instead (same numbers, a separate pass, slower). Both go through custom ops, so a
compiled block sees one opaque call per producer.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import nn

from ..errors import RequestError
from ..opaque_op import opaque_op

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_AMAX = 1e-12  # an all-zero row gets this amax: its values quantise to 0, its scale stays finite
OUT_DTYPE = torch.bfloat16  # row-wise _scaled_mm's output; FP8 storage runs with bfloat16 compute
MODES = ("scaled_mm", "emulated")
FAST_ACCUM = False  # _scaled_mm's fast accumulation trades accuracy at K = 14,336 for a few % (bench/fp8_gemm.py)
MIN_CAPABILITY = (8, 9)  # Ada / Hopper and newer have FP8 tensor cores
_REFERENCE_CHUNK = 1 << 24  # elements per fp32 temporary of the torch reference (64 MB)
_log = logging.getLogger(__name__)


class Fp8Rows(NamedTuple):
    """A GEMM input quantised per row: data float8_e4m3fn [..., K], scale float32 [...]."""

    data: torch.Tensor
    scale: torch.Tensor


# ---- quantisation, the torch reference -------------------------------------------------------------------------

def quantise_fp32(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 values [..., K] -> (float8_e4m3fn [..., K], fp32 scale [...]) by the rows' amax."""
    scale = y.abs().amax(-1).clamp_min(MIN_AMAX) / FP8_MAX
    return (y / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantise_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] weight -> (float8_e4m3fn [N, K], fp32 per-output-channel scale [N]), in row chunks so the fp32
    temporary stays small, on the weight's device."""
    n, k = weight.shape
    q = torch.empty((n, k), dtype=FP8, device=weight.device)
    scale = torch.empty(n, dtype=torch.float32, device=weight.device)
    step = max(1, _REFERENCE_CHUNK // max(k, 1))
    for a in range(0, n, step):
        q[a:a + step], scale[a:a + step] = quantise_fp32(weight[a:a + step].float())
    return q, scale


def dequantise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8 [..., K] with scale [...] -> fp32 [..., K]."""
    return q.float() * scale.unsqueeze(-1)


def _row_chunks(rows: int, width: int):
    step = max(1, _REFERENCE_CHUNK // max(width, 1))
    return ((a, min(rows, a + step)) for a in range(0, rows, step))


def _norm_modulate_reference(x, weight, eps, runs, scale, shift):
    b, seq, cols = x.shape
    q = torch.empty((b, seq, cols), dtype=FP8, device=x.device)
    s = torch.empty((b, seq), dtype=torch.float32, device=x.device)
    w = weight.float()
    for start, stop, r in runs:
        for a, z in _row_chunks(stop - start, cols * b):
            y = torch.nn.functional.rms_norm(x[:, start + a:start + z].float(), (cols,), w, eps)
            if r >= 0:
                y = y * (1.0 + scale[r].float()) + shift[r].float()
            q[:, start + a:start + z], s[:, start + a:start + z] = quantise_fp32(y)
    return q, s


def _rows_reference(x2d, swiglu):
    rows, width = x2d.shape
    cols = width // 2 if swiglu else width
    q = torch.empty((rows, cols), dtype=FP8, device=x2d.device)
    s = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    for a, z in _row_chunks(rows, width):
        y = x2d[a:z].float()
        if swiglu:
            y = y[:, :cols] * torch.nn.functional.silu(y[:, cols:])
        q[a:z], s[a:z] = quantise_fp32(y)
    return q, s


# ---- the fused kernels, when they can run ----------------------------------------------------------------------

_KERNELS = None


def _kernels():
    """fp8_kernels, or None when Triton is missing (then the torch reference runs: same numbers, slower)."""
    global _KERNELS
    if _KERNELS is None:
        try:
            from . import fp8_kernels
        except Exception as exc:  # noqa: BLE001 - no Triton (e.g. Windows without triton-windows)
            _log.warning("FP8 weights: Triton is unavailable (%s); activations are quantised by separate torch "
                         "passes (same numbers, slower).", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            fp8_kernels = False
        _KERNELS = fp8_kernels
    return _KERNELS or None


def _norm_modulate_impl(x, weight, eps, starts, stops, rows, scale, shift, kernels):
    runs = list(zip(starts, stops, rows))
    k = _kernels() if kernels and x.is_cuda else None
    if k is None or x.shape[-1] > k.MAX_NORM_WIDTH or x.stride(-1) != 1:
        return _norm_modulate_reference(x, weight, eps, runs, scale, shift)
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    k.norm_modulate_quant(x, weight, eps, runs, scale, shift, q, s, FP8_MAX, MIN_AMAX)
    return q, s


def _norm_modulate_fake(x, weight, eps, starts, stops, rows, scale, shift, kernels):
    return x.new_empty(x.shape, dtype=FP8), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _rows_impl(x, swiglu, kernels):
    width = x.shape[-1]
    lead = x.shape[:-1]
    x2d = x.reshape(-1, width)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    k = _kernels() if kernels and x.is_cuda and x2d.shape[0] else None
    if k is None:
        q, s = _rows_reference(x2d, swiglu)
    else:
        cols = width // 2 if swiglu else width
        q = torch.empty((x2d.shape[0], cols), dtype=FP8, device=x.device)
        s = torch.empty(x2d.shape[0], dtype=torch.float32, device=x.device)
        k.rows_quant(x2d, swiglu, q, s, FP8_MAX, MIN_AMAX)
    return q.view(*lead, q.shape[-1]), s.view(lead)


def _rows_fake(x, swiglu, kernels):
    cols = x.shape[-1] // 2 if swiglu else x.shape[-1]
    return x.new_empty((*x.shape[:-1], cols), dtype=FP8), x.new_empty(x.shape[:-1], dtype=torch.float32)


_norm_modulate_op = opaque_op(
    "fp8_norm_modulate",
    "(Tensor x, Tensor weight, float eps, int[] starts, int[] stops, int[] rows, Tensor scale, Tensor shift, "
    "bool kernels) -> (Tensor, Tensor)", _norm_modulate_impl, _norm_modulate_fake)
_rows_op = opaque_op("fp8_quantise_rows", "(Tensor x, bool swiglu, bool kernels) -> (Tensor, Tensor)",
                      _rows_impl, _rows_fake)


# ---- the producers a block calls -------------------------------------------------------------------------------

def covering_runs(runs, seq: int) -> list[tuple[int, int, int]]:
    """Runs (start, stop, table_row), in row order as h3_ops.RowSegments builds them, plus the rows no run covers,
    as runs with table row -1 (normalised, not modulated, as the bf16 path leaves them). No sorting here: once a
    block recompiles for a second layout, Dynamo may hold the bounds as symbolic ints, which it cannot sort."""
    out, at = [], 0
    for start, stop, r in runs:
        if start > at:
            out.append((at, start, -1))
        out.append((start, stop, r))
        at = max(at, stop)
    if at < seq:
        out.append((at, seq, -1))
    return out


def norm_modulate_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, runs, scale: torch.Tensor,
                       shift: torch.Tensor, kernels: bool) -> Fp8Rows:
    """rms_norm(x) * (1 + scale[row]) + shift[row], quantised per row. x [B, S, C]; runs (start, stop, table_row)
    as h3_ops.RowSegments holds them; scale / shift [R, C]. `kernels`: the fused Triton kernel where it can run."""
    full = covering_runs(runs, x.shape[1])
    q, s = _norm_modulate_op(x, weight, float(eps), [r[0] for r in full], [r[1] for r in full],
                             [r[2] for r in full], scale, shift, kernels)
    return Fp8Rows(q, s)


def swiglu_rows(h: torch.Tensor, kernels: bool) -> Fp8Rows:
    """h [..., 2F] = [value | gate] -> value * silu(gate) [..., F], quantised per row."""
    return Fp8Rows(*_rows_op(h, True, kernels))


def quantise_rows(x: torch.Tensor, kernels: bool) -> Fp8Rows:
    """Any [..., K] activation, quantised per row."""
    return Fp8Rows(*_rows_op(x, False, kernels))


# ---- the matmul and the layer ----------------------------------------------------------------------------------

def fp8_matmul(a: Fp8Rows, weight: torch.Tensor, weight_scale: torch.Tensor, emulate: bool,
               fast_accum: bool = FAST_ACCUM, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [..., K] rows x weight [N, K] (per-channel scales [N]) -> [..., N] bfloat16, plus `bias` [N] (bfloat16)
    added to that bfloat16 result, as a bf16 Linear adds its bias (the same two roundings in both modes)."""
    k = a.data.shape[-1]
    lead = a.data.shape[:-1]
    qa = a.data.reshape(-1, k)
    sa = a.scale.reshape(-1, 1).float()
    if emulate:  # fp8 x fp8 products are exact in fp32; summed in fp32, then scaled, as the tensor cores do
        out = ((qa.float() @ weight.float().t()) * sa * weight_scale.float().unsqueeze(0)).to(OUT_DTYPE)
    else:
        out = torch._scaled_mm(qa.contiguous(), weight.t(), scale_a=sa.contiguous(),
                               scale_b=weight_scale.view(1, -1), out_dtype=OUT_DTYPE, use_fast_accum=fast_accum)
        if isinstance(out, tuple):  # torch < 2.5 returned (out, amax)
            out = out[0]
    if bias is not None:
        out = out + bias.to(OUT_DTYPE)
    return out.view(*lead, weight.shape[0])


class Fp8Linear(nn.Module):
    """A Linear with float8_e4m3fn weights and per-output-channel scales, and an optional bias (kept in bfloat16,
    added to the bfloat16 product). Takes Fp8Rows made by the producer (norm_modulate_rows, swiglu_rows) or
    a tensor, which it quantises per row itself. Returns bfloat16."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, emulate: bool,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if weight.dtype != FP8 or weight.dim() != 2 or weight_scale.shape != weight.shape[:1]:
            raise ValueError(f"Fp8Linear takes float8_e4m3fn [N, K] weights with [N] scales, got {weight.dtype} "
                             f"{tuple(weight.shape)} and {tuple(weight_scale.shape)}.")
        if bias is not None and tuple(bias.shape) != tuple(weight.shape[:1]):
            raise ValueError(f"Fp8Linear's bias must be [{weight.shape[0]}], got {tuple(bias.shape)}.")
        self.out_features, self.in_features = weight.shape
        self.emulate = emulate
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.float())
        self.register_buffer("bias", None if bias is None else bias.to(OUT_DTYPE))

    @classmethod
    def from_weight(cls, weight: torch.Tensor, emulate: bool, bias: torch.Tensor | None = None) -> "Fp8Linear":
        """Quantised from a stored weight: a float8_e4m3fn one as it is (scale 1: a release cast to fp8 without
        scales), any other by its channels' amax."""
        if not emulate:
            check_gemm_shape(weight.shape)
        weight = weight.detach()
        if weight.dtype == FP8:
            return cls(weight, torch.ones(weight.shape[0], device=weight.device), emulate, bias)
        return cls(*quantise_weight(weight), emulate, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, emulate: bool) -> "Fp8Linear":
        return cls.from_weight(linear.weight, emulate, None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        if self.weight.dtype != FP8:  # e.g. a later module.to(dtype) cast the codes without their scales
            raise RuntimeError(f"Fp8Linear weight was cast to {self.weight.dtype}; FP8 layers must not be cast.")
        rows = x if isinstance(x, Fp8Rows) else quantise_rows(x, kernels=not self.emulate)
        return fp8_matmul(rows, self.weight, self.weight_scale, self.emulate, bias=self.bias)

    def extra_repr(self) -> str:
        mode = "emulated" if self.emulate else "scaled_mm"
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 {mode}"


def check_gemm_shape(shape) -> None:
    """_scaled_mm needs both matrix sides in multiples of 16."""
    n, k = shape
    if n % 16 or k % 16:
        raise RequestError(f"FP8 weights need GEMM sides in multiples of 16; this model has a [{n}, {k}] layer. "
                           "Choose bf16 weights.")


# ---- can this device run it ------------------------------------------------------------------------------------

def fp8_unsupported(device: str | torch.device) -> str | None:
    """Why `device` cannot run FP8 GEMMs (one line naming it and what to do), or None. Reads the device's compute
    capability only (no kernel runs): usable in the process that holds the engine registry."""
    device = torch.device(device)
    if device.type != "cuda":
        return (f"FP8 weights need an NVIDIA GPU with FP8 tensor cores (compute capability 8.9 or newer: RTX 40xx, "
                f"L4/L40, H100/H200 and later); this engine runs on the {device.type.upper()}. Choose bf16 weights.")
    if not torch.cuda.is_available():
        return None  # this process sees no GPU (e.g. a Ray head): the worker checks its own
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return None  # an id this process cannot see: the engine reports it where it starts
    capability = torch.cuda.get_device_capability(index)
    if tuple(capability) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        return (f"FP8 weights need compute capability 8.9 or newer (RTX 40xx, L4/L40, H100/H200 and later); "
                f"cuda:{index} ({name}) is {capability[0]}.{capability[1]}. Choose bf16 weights.")
    return None


def check_fp8_config(config) -> None:
    """An engine config's FP8 storage, before a worker starts: bfloat16 compute (row-wise _scaled_mm's output) and
    GPUs with FP8 tensor cores (a Ray cluster's GPUs are checked by each worker, before its weights load). ValueError
    naming what to change; nothing for the other storages."""
    storage = config.weights.storage
    if storage not in ("fp8", "fp8_emulated"):
        return
    if storage == "fp8" and (config.executor != "ray" or config.device == "cpu"):
        for device in config.devices():
            reason = fp8_unsupported(device)
            if reason:
                raise ValueError(reason)
    if config.compute_dtype != "bfloat16":
        raise ValueError(f"FP8 weights run with bfloat16 compute; the dtype is {config.compute_dtype}. Choose "
                         "dtype bfloat16, or bf16 weights.")


def check_scaled_mm(device: str | torch.device) -> None:
    """On the rank's own device, before any weight loads: the capability check, then one tiny row-wise
    _scaled_mm (the kernel exists only for some GPU / torch pairs: e.g. torch 2.4 has no row-wise scaling)."""
    reason = fp8_unsupported(device)
    if reason:
        raise RequestError(reason)
    device = torch.device(device)
    a = torch.ones(16, 32, device=device).to(FP8)
    w = torch.ones(16, 32, device=device).to(FP8)
    try:
        fp8_matmul(Fp8Rows(a, torch.ones(16, device=device)), w, torch.ones(16, device=device), emulate=False)
    except Exception as exc:  # noqa: BLE001 - any failure means: this torch cannot run it here
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RequestError(f"FP8 weights: torch {torch.__version__} cannot run a row-wise scaled FP8 matmul on "
                           f"{torch.cuda.get_device_name(device)} ({line}); update PyTorch (2.5 or newer) or "
                           "choose bf16 weights.") from exc


def gemm_weight_bytes(module: nn.Module) -> int:
    """Bytes of the FP8 GEMM weights and their scales inside `module`."""
    return sum(m.weight.numel() * m.weight.element_size() + m.weight_scale.numel() * 4
               for m in module.modules() if isinstance(m, Fp8Linear))
