"""A second model family for the tests (not shipped): proves a family plugs into the engine, executor and worker
without touching them. It computes something every rank must agree on (a running product, and the all-reduced sum
of the rank ids through its ParallelContext), steps with progress and honours Stop at step boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from comfyui_h3.backend.errors import Cancelled, RequestError


@dataclass(frozen=True)
class ToyOptions:
    scale: float = 2.0
    memory_mb: int = 1  # what memory_bytes reports (the engine registry's eviction tests set it)


@dataclass
class ToyRequest:
    values: list = field(default_factory=lambda: [1.0, 2.0])
    steps: int = 3
    step_s: float = 0.0  # seconds each step sleeps (a Stop test needs steps that take time)

    def validate(self) -> None:
        if self.steps < 1:
            raise RequestError(f"steps must be >= 1, got {self.steps}")


@dataclass
class ToyResult:
    values: list
    rank_sum: float
    world: int
    device: str
    attention: str
    pids: list


class ToyPipeline:
    def __init__(self, runtime, options: ToyOptions):
        self.runtime, self.options = runtime, options

    def run(self, request: ToyRequest, on_step=None, should_stop=None) -> ToyResult:
        import os

        p = self.runtime.parallel
        x = torch.tensor(request.values, dtype=torch.float64)
        for i in range(request.steps):
            if p.any(should_stop is not None and should_stop()):
                raise Cancelled(f"Stopped before step {i + 1}/{request.steps}.")
            x = x * self.options.scale
            if request.step_s:
                import time

                time.sleep(request.step_s)
            if on_step is not None:
                on_step(i + 1, request.steps)
        ranks = torch.tensor([float(p.rank)])
        pids = torch.zeros(p.world, dtype=torch.float64)
        pids[p.rank] = os.getpid()
        if p.is_parallel:
            import torch.distributed as dist

            dist.all_reduce(ranks)
            dist.all_reduce(pids)
        return ToyResult(x.tolist(), float(ranks.item()), p.world, str(self.runtime.device),
                         self.runtime.attention.name, [int(v) for v in pids.tolist()])


class ToyFamily:
    name = "toy"

    def check(self, config) -> None:
        if not isinstance(config.options, ToyOptions):
            raise TypeError(f"the toy family takes ToyOptions, got {type(config.options).__name__}")

    def memory_bytes(self, config) -> int:
        return config.options.memory_mb * 2**20

    def build(self, runtime, options: ToyOptions) -> ToyPipeline:
        return ToyPipeline(runtime, options)


FAMILY = ToyFamily()
REFERENCE = "toy_family:FAMILY"  # how an engine config names it (importable in the workers: tests/ is on sys.path)
