"""CUDA-event timing shared by the bench scripts: median milliseconds of `iters` calls after `warmup` calls, and
the peak memory allocated during the timed calls (GiB)."""

from __future__ import annotations

import statistics

import torch


def timed(fn, iters: int, warmup: int = 2) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
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
