"""Where a GPU call's time goes, kernel by kernel: torch.profiler over a few calls, CUDA kernels grouped by name and
sorted by time per call, each tagged gemm / attention / other (the elementwise and reduction passes around them).

    from kernel_profile import kernel_table
    rows, totals = kernel_table(fn, iters=3)
"""

from __future__ import annotations

import re

import torch

# Kernel-name patterns of cuBLAS / CUTLASS GEMMs and of the fused attention kernels torch dispatches to.
_GEMM = re.compile(r"gemm|nvjet|sm90_xmma|cutlass.*(?:gemm|wgmma)|scaled_mm", re.IGNORECASE)
_ATTENTION = re.compile(r"cudnn|fmha|flash|attention|sdpa|_vsa_", re.IGNORECASE)


def kernel_kind(name: str) -> str:
    if _ATTENTION.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "other"


def kernel_table(fn, iters: int = 3, top: int = 25) -> tuple[list[dict], dict]:
    """Profile `iters` calls of fn (after one untimed call). Returns the `top` kernels by device time per call
    ({name, kind, calls_per_iter, ms_per_iter}) and the per-call totals by kind (ms)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn()
        sync()
    grouped: dict[str, list[float]] = {}
    for event in prof.events():
        if cuda:  # device-side events only: the kernels and copies themselves, never the CPU ops that launched them
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(event, "device_time", None)
            us = event.cuda_time if us is None else us
        else:  # a CPU dry run: the outermost ops (their children's time is inside theirs)
            if event.cpu_parent is not None:
                continue
            us = event.cpu_time_total
        grouped.setdefault(event.name, []).append(us)
    rows, totals = [], {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for name, times in grouped.items():
        kind = kernel_kind(name)
        ms = sum(times) / 1e3 / iters
        totals[kind] += ms
        rows.append({"name": name[:110], "kind": kind, "calls_per_iter": len(times) / iters, "ms_per_iter": ms})
    rows.sort(key=lambda r: -r["ms_per_iter"])
    return rows[:top], totals


def print_table(label: str, rows: list[dict], totals: dict) -> None:
    print(f"--- kernels of {label} (ms per call) ---", flush=True)
    for r in rows:
        print(f"{r['ms_per_iter']:9.3f}  x{r['calls_per_iter']:<5g} {r['kind']:<9} {r['name']}", flush=True)
    print("totals: " + ", ".join(f"{k} {v:.3f} ms" for k, v in totals.items()), flush=True)
