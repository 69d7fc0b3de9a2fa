"""SAGE attention (backend/attention/sage_kernel.py) next to cuDNN's bf16 attention at H3's head shape, one GPU:
time (quantisers + kernel, and the kernel alone), effective TFLOP/s (4 S^2 H D / t), and the error table against a
float64 softmax (query rows sampled; every key) for the kernel, the float64 rule and bf16 SDPA, with outlier inputs.

    python bench/sage_attention.py                       # 10-s shape (73,888 rows), 56 x 128 heads, sweep + errors
    python bench/sage_attention.py --rows 36944 --json out.json
    python bench/sage_attention.py --cpu-errors --error-rows 4133   # the rule's error only, float64 on the CPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfyui_h3.backend.attention import sage_kernel  # noqa: E402
from comfyui_h3.backend.attention import sage_rule as rule  # noqa: E402
from comfyui_h3.backend.attention.dispatch import _sdpa_cudnn_first_eager  # noqa: E402


def timed(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def inputs(kind: str, rows: int, heads: int, dim: int, seed: int, device: str = "cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (1, rows, heads, dim)
    if kind == "gaussian":
        q, k, v = (torch.randn(shape, device=device, generator=g) for _ in range(3))
    elif kind == "heavy_tails":  # Student-t (3 dof) Q and K: a few channels far outside the rest
        torch.manual_seed(seed)
        t = torch.distributions.StudentT(torch.tensor(3.0, device=device))
        q, k = t.sample(shape), t.sample(shape)
        v = torch.randn(shape, device=device, generator=g)
    elif kind == "k_mean":  # K with a large per-channel mean over the sequence (what the smoothing is for)
        q, k, v = (torch.randn(shape, device=device, generator=g) for _ in range(3))
        k = k + 8 * torch.randn((1, 1, heads, dim), device=device, generator=g)
    elif kind == "peaked":  # sharp attention: Q scaled up
        q, k, v = (torch.randn(shape, device=device, generator=g) for _ in range(3))
        q = q * 4
    else:
        raise ValueError(kind)
    return tuple(t.to(torch.bfloat16) for t in (q, k, v))


def exact_rows(q, k, v, rows: torch.Tensor) -> torch.Tensor:
    """float64 softmax attention for the sampled query rows [B, R, H, D] (every key)."""
    qd = q[:, rows].double().transpose(1, 2)
    kd, vd = k.double().transpose(1, 2), v.double().transpose(1, 2)
    out = torch.softmax(qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ vd
    return out.transpose(1, 2)


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def errors(kind: str, rows: int, dim: int, sample_blocks: int, scales: str, device: str = "cuda") -> dict:
    """The error table's row for one input kind and scale granularity; on the CPU only the float64 rule's."""
    heads = 2  # the rule is per head; two heads of the released shape keep float64 within memory
    q, k, v = inputs(kind, rows, heads, dim, seed=1, device=device)
    ops = rule.quantize(q, k, v, scales=scales)
    settings = rule.SageSettings(scales=scales)
    blocks = slice(0, sample_blocks)
    idx = torch.arange(0, min(sample_blocks * rule.BLOCK_M, rows), device=device)
    want = exact_rows(q, k, v, idx)
    reference = rule.attend_quantized(ops, settings, query_blocks=blocks)
    row = {"inputs": kind, "scales": scales, "rows": rows, "sampled_query_rows": int(idx.numel()), "heads": heads,
           "rule_f64_vs_exact": rel(reference, want)}
    if device == "cuda":
        kernel = sage_kernel.attend_operands(ops, settings, torch.empty(q.shape, dtype=torch.float32,
                                                                        device="cuda"))[:, idx]
        bf16 = _sdpa_cudnn_first_eager(q, k, v)[:, idx]
        row.update(kernel_vs_exact=rel(kernel, want), kernel_vs_rule_f64=rel(kernel, reference),
                   bf16_sdpa_vs_exact=rel(bf16, want))
    return row


def error_table(rows_list: str, dim: int, device: str) -> list[dict]:
    table = []
    for rows in (int(r) for r in rows_list.split(",") if r):
        for kind in ("gaussian", "heavy_tails", "k_mean", "peaked"):
            for scales in rule.SCALES:
                table.append(errors(kind, rows, dim, sample_blocks=8, scales=scales, device=device))
                print(json.dumps(table[-1]), flush=True)
    return table


def write(report: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(report, fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=73888, help="10-s shape: 72,576 video + 810 audio + 502 text rows")
    ap.add_argument("--heads", type=int, default=56)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--error-rows", default="4133,36944,73888")
    ap.add_argument("--cpu-errors", action="store_true", help="only the float64 rule's error table, on the CPU")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.cpu_errors:
        write({"device": "cpu", "errors": error_table(args.error_rows, args.dim, "cpu")}, args.json)
        return
    dev = torch.device("cuda")
    ok, what = sage_kernel.fp8_capable(dev)
    print(f"device: {what}; torch {torch.__version__}; triton {sage_kernel.triton.__version__}", flush=True)
    if not ok:
        raise SystemExit("needs FP8 tensor cores")
    report = {"device": what, "rows": args.rows, "heads": args.heads, "dim": args.dim, "timings_ms": {}}
    flops = 4.0 * args.rows ** 2 * args.heads * args.dim
    q, k, v = inputs("gaussian", args.rows, args.heads, args.dim, seed=0)

    def record(label, ms):
        report["timings_ms"][label] = ms
        print(f"{label:44s} {ms:9.2f} ms  {flops / ms / 1e9:7.0f} TFLOP/s", flush=True)

    record("cudnn_bf16", timed(lambda: _sdpa_cudnn_first_eager(q, k, v), args.iters))
    record("sage_quantize_torch", timed(lambda: rule.quantize(q, k, v), args.iters))
    record("sage_quantize_triton", timed(lambda: sage_kernel.quantize_on_gpu(q, k, v), args.iters))
    out = torch.empty(q.shape, dtype=q.dtype, device=dev)
    configs = [(sage_kernel.KERNEL_CONFIG["num_warps"], sage_kernel.KERNEL_CONFIG["num_stages"], rule.BLOCK_N)]
    if not args.no_sweep:
        configs += [c for c in itertools.product((8,), (3, 4), (64, 128)) if c not in configs]
    best = None
    for warps, stages, block_n in configs:
        ops = sage_kernel.quantize_on_gpu(q, k, v, block_n=block_n)
        sage_kernel.KERNEL_CONFIG.update(num_warps=warps, num_stages=stages)
        try:
            ms = timed(lambda: sage_kernel.attend_operands(ops, rule.SageSettings(), out), args.iters)
        except Exception as exc:  # noqa: BLE001 - a config that does not fit shared memory
            print(f"kernel warps={warps} stages={stages} block_n={block_n}: {type(exc).__name__}: {exc}"[:200])
            continue
        record(f"sage_kernel_w{warps}_s{stages}_n{block_n}", ms)
        if best is None or ms < best[0]:
            best = (ms, warps, stages, block_n)
    _, warps, stages, block_n = best
    sage_kernel.KERNEL_CONFIG.update(num_warps=warps, num_stages=stages)
    report["best_kernel"] = {"num_warps": warps, "num_stages": stages, "block_n": block_n}

    def whole():
        return sage_kernel.attend_operands(sage_kernel.quantize_on_gpu(q, k, v, block_n=block_n),
                                           rule.SageSettings(), out)

    record("sage_quantize_plus_kernel_best", timed(whole, args.iters))
    skip_ops = sage_kernel.quantize_on_gpu(q, k, v, block_n=block_n)
    record("sage_kernel_best_skip_0.001", timed(
        lambda: sage_kernel.attend_operands(skip_ops, rule.SageSettings(0.001), out), args.iters))
    row_ops = sage_kernel.quantize_on_gpu(q, k, v, block_n=block_n, scales="row")
    record("sage_kernel_best_scales_row", timed(
        lambda: sage_kernel.attend_operands(row_ops, rule.SageSettings(scales="row"), out), args.iters))
    t = report["timings_ms"]
    report["ratio_vs_cudnn"] = {"kernel": t[f"sage_kernel_w{warps}_s{stages}_n{block_n}"] / t["cudnn_bf16"],
                                "quantize_plus_kernel": t["sage_quantize_plus_kernel_best"] / t["cudnn_bf16"],
                                "kernel_scales_row": t["sage_kernel_best_scales_row"] / t["cudnn_bf16"]}
    print("ratio vs cuDNN bf16:", report["ratio_vs_cudnn"], flush=True)
    del q, k, v, out, skip_ops, row_ops
    torch.cuda.empty_cache()
    report["errors"] = error_table(args.error_rows, args.dim, "cuda")
    write(report, args.json)


if __name__ == "__main__":
    main()
