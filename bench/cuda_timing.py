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


def cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class EventTimer:
    """CUDA-event (or host-clock) time spent inside a module's forward (hooks: the call signature stays what callers
    inspect), or inside another method (`method`, wrapped), summed over calls."""

    def __init__(self, module, method="forward"):
        self.total_ms, self.calls, self.pending, self._open = 0.0, 0, [], None
        if method == "forward":
            module.register_forward_pre_hook(lambda *_: self._start())
            module.register_forward_hook(lambda *_: self._stop())
            return
        inner = getattr(module, method)

        def timed(*a, **k):
            self._start()
            out = inner(*a, **k)
            self._stop()
            return out

        setattr(module, method, timed)

    def _start(self):
        if torch.cuda.is_available():
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._open = time.perf_counter()

    def _stop(self):
        if torch.cuda.is_available():
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pending.append((self._open, end))
        else:
            self.total_ms += (time.perf_counter() - self._open) * 1000
        self.calls += 1

    def seconds(self) -> float:
        cuda_sync()
        self.total_ms += sum(s.elapsed_time(e) for s, e in self.pending)
        self.pending = []
        return self.total_ms / 1000

    def reset(self):
        self.seconds()
        self.total_ms, self.calls = 0.0, 0
