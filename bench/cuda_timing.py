"""CUDA-event timing shared by the bench scripts: median milliseconds of `iters` calls after `warmup` calls, and
the peak memory allocated during the timed calls (GiB)."""

from __future__ import annotations

import statistics
import time

import torch


def timed(fn, iters: int, warmup: int = 2) -> tuple[float, float]:
    """Median ms of `iters` calls after `warmup` (CUDA events; wall clock and peak 0.0 without CUDA, for the
    benches' --tiny dry runs on the CPU) and the peak GiB allocated during the timed calls."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), 0.0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30
