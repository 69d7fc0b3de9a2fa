"""What identifies an engine: the model family and its options, devices, parallel degree, executor, attention
backend, compute dtype and weight policy. Frozen and picklable: it is the engine registry's key and travels to every
worker, which builds its Runtime and pipeline from it. Family-specific settings (model files, VAE dtype, ...) live in
`options`, the family's own frozen dataclass; nothing here knows a family.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .attention.registry import AttentionSpec, attention_spec
from .runtime import WeightPolicy

DTYPES = ("bfloat16", "float16", "float32")
EXECUTORS = ("mp", "ray")


def resolve_devices(device: str, degree: int, gpus: str) -> tuple[str, int]:
    """A loader's (device, degree, gpus) -> the engine config's (device, world_size): the one place the `gpus` list is
    read, for the nodes and the CLI alike. `gpus`: "" (GPUs 0..degree-1, or the CPU), "all" (every visible GPU,
    the degree becomes their count) or distinct ids "0,1,..", one per rank; anything else is refused, naming it."""
    text = (gpus or "").strip().lower()
    if not text:
        return device, degree
    if device == "cpu":
        raise ValueError(f"gpus is {gpus!r} but the engine runs on the CPU: leave gpus empty (sp_degree {degree} runs "
                         f"{degree} CPU processes), or choose device cuda.")
    if text == "all":
        import torch

        count = torch.cuda.device_count()
        if count < 1:
            raise ValueError("gpus is 'all' but no CUDA GPU is visible.")
        return ("cuda:" + ",".join(str(i) for i in range(count))) if count > 1 else "cuda:0", count
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"gpus must be 'all' or GPU ids (whole numbers from 0) separated by commas, e.g. 0,1; got "
                         f"{gpus!r}.")
    ids = [int(part) for part in parts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"gpus {gpus!r} names a GPU twice; give each rank its own GPU.")
    if len(ids) != degree:
        raise ValueError(f"gpus {gpus!r} lists {len(ids)} GPUs for sp_degree {degree}; give one GPU per rank.")
    return "cuda:" + ",".join(map(str, ids)), degree


@dataclass(frozen=True)
class EngineConfig:
    family: str  # a registered family name or a reference "module:attribute" (backend/families.py)
    options: Any  # the family's frozen options (its own dataclass; part of the config's identity)
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N" / "cuda:2,3" (a worker per device when world_size > 1)
    world_size: int = 1
    executor: str = "mp"  # "mp": a process per device on this machine; "ray": an actor per rank on a Ray cluster
    ray_address: str = ""  # executor "ray": the cluster's address ("auto", "ray://host:10001", ...); "" or "local":
    # a local Ray, started for this engine (or the one this process already started)
    attention: AttentionSpec = field(default_factory=AttentionSpec)  # text ("vsa:topk=8") is read once, here
    compute_dtype: str = "bfloat16"  # the arithmetic of the family's main model (not read off a weight)
    weights: WeightPolicy = field(default_factory=WeightPolicy)
    cpu_threads: int = 0  # 0: torch default
    master_port: int = 29517

    def __post_init__(self):
        object.__setattr__(self, "attention", attention_spec(self.attention))

    def family_impl(self):
        from . import families

        return families.get(self.family)

    def validate(self) -> None:
        """Everything checkable before a process starts or a weight moves; the family checks its own part."""
        from .attention.registry import get_backend

        if self.compute_dtype not in DTYPES:
            raise ValueError(f"compute dtype must be one of {DTYPES}, got {self.compute_dtype!r}.")
        if ":" in self.device and "," in self.device and len(self.device.split(":", 1)[1].split(",")) != self.world_size:
            raise ValueError(f"{self.device} lists {len(self.device.split(','))} GPUs for {self.world_size} ranks; "
                             "give one GPU per rank.")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}.")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}.")
        if self.executor not in EXECUTORS:
            raise ValueError(f"Unknown executor {self.executor!r}; available: {', '.join(map(repr, EXECUTORS))}.")
        if self.executor == "ray" and self.device not in ("cpu", "cuda"):
            raise ValueError(f"With the ray executor device is 'cpu' or 'cuda' (Ray places each rank on a GPU of its "
                             f"own), got {self.device!r}.")
        get_backend(self.attention)  # a registered backend that takes these settings; one clear line otherwise
        self.weights.validate()
        self.family_impl().check(self)

    def device_for(self, rank: int) -> str:
        """'cpu' -> every rank on the CPU; 'cuda' -> cuda:rank; 'cuda:N' -> cuda:N+rank; 'cuda:2,3' -> the listed
        GPUs, one per rank."""
        if self.device == "cpu":
            return "cpu"
        ids = self.device.split(":", 1)[1].split(",") if ":" in self.device else ["0"]
        if len(ids) > 1:
            return f"cuda:{int(ids[rank])}"
        return f"cuda:{int(ids[0]) + rank}"

    def devices(self) -> list[str]:
        return [self.device_for(rank) for rank in range(self.world_size)]

    def runtime(self, rank: int = 0, device: str | None = None, group=None):
        """This rank's Runtime (its process group, when world > 1, is already initialised)."""
        from .parallel.context import ParallelContext
        from .runtime import Runtime

        return Runtime.make(device or self.device_for(rank), ParallelContext(rank, self.world_size, group),
                            self.attention, self.compute_dtype, self.weights, self.cpu_threads)

    def live_fields(self) -> tuple[str, ...]:
        """The family's live options (families.py): what a loaded engine of this config takes in place."""
        return tuple(getattr(self.family_impl(), "live_options", ()))

    def live_state(self) -> dict | None:
        """The live options' values, sent with every job (None: the family has none)."""
        fields = self.live_fields()
        return {name: getattr(self.options, name) for name in fields} if fields else None

    def identity(self) -> "EngineConfig":
        """This config with its live options at their defaults: the engines that can serve it without a restart
        share it."""
        fields = self.live_fields()
        if not fields:
            return self
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self.options) if f.name in fields}
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **defaults))

    def build_pipeline(self, rank: int = 0, device: str | None = None):
        """This rank's pipeline, on `device` (default: device_for(rank); a Ray actor passes the GPU it was given)."""
        return self.family_impl().build(self.runtime(rank, device), self.options)
