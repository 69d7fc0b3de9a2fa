"""What identifies an engine: model files, devices, parallel degree, attention backend, precision. Picklable: it
travels to every worker process, which builds its pipeline from it."""

from __future__ import annotations

import os
from dataclasses import dataclass

DTYPES = ("bfloat16", "float16", "float32")
EXECUTORS = ("mp", "ray")


@dataclass(frozen=True)
class EngineConfig:
    model_dir: str
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N" (a worker per device when world_size > 1)
    dtype: str = "bfloat16"  # DiT + text encoder compute dtype; float32 modules of the checkpoint stay float32
    vae_dtype: str = "float32"
    attention: str = "sdpa"
    compile: str = "auto"  # torch.compile each DiT block: "auto" (on CUDA), "on", "off"
    world_size: int = 1
    executor: str = "mp"  # "mp": a process per device on this machine; "ray": an actor per rank on a Ray cluster
    ray_address: str = ""  # executor "ray": the cluster's address ("auto", "ray://host:10001", ...); "" or "local":
    # a local Ray, started for this engine (or the one this process already started)
    cpu_threads: int = 0  # 0: torch default
    master_port: int = 29517
    reference_image_short_edge: int | None = None  # None: the model folder's setting, else 2048

    def validate(self) -> None:
        if self.dtype not in DTYPES or self.vae_dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r} / {self.vae_dtype!r}.")
        if ":" in self.device and "," in self.device and len(self.device.split(":", 1)[1].split(",")) != self.world_size:
            raise ValueError(f"{self.device} lists {len(self.device.split(',' ))} GPUs for {self.world_size} ranks; "
                             "give one GPU per rank.")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}.")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}.")
        if self.compile not in ("auto", "on", "off"):
            raise ValueError(f"compile must be 'auto', 'on' or 'off', got {self.compile!r}.")
        if self.executor not in EXECUTORS:
            raise ValueError(f"Unknown executor {self.executor!r}; available: {', '.join(map(repr, EXECUTORS))}.")
        if self.executor == "ray" and self.device not in ("cpu", "cuda"):
            raise ValueError(f"With the ray executor device is 'cpu' or 'cuda' (Ray places each rank on a GPU of its "
                             f"own), got {self.device!r}.")
        if not os.path.isdir(self.model_dir):
            raise FileNotFoundError(f"MiniMax-H3 model folder not found: {self.model_dir}")
        self._check_heads_split()

    def _check_heads_split(self) -> None:
        """Ulysses splits attention heads over the ranks: refuse a degree that does not divide them, before any
        weight moves (the release's 56 heads allow 1, 2, 4, 7, 8)."""
        from .models.checkpoint import CheckpointError, read_json

        for part in ("transformer", "transformer_ref"):
            path = os.path.join(self.model_dir, part, "config.json")
            if not os.path.isfile(path):
                continue
            heads = read_json(path).get("num_attention_heads", 56)  # a broken config is an error naming it
            if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
                raise CheckpointError(f"{path}: num_attention_heads must be a positive integer, got {heads!r}.")
            if heads % self.world_size:
                ok = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 16]
                raise ValueError(f"Sequence-parallel degree {self.world_size} does not divide the model's {heads} "
                                 f"attention heads; use one of {ok}.")

    def device_for(self, rank: int) -> str:
        """'cpu' -> every rank on the CPU; 'cuda' -> cuda:rank; 'cuda:N' -> cuda:N+rank; 'cuda:2,3' -> the listed
        GPUs, one per rank."""
        if self.device == "cpu":
            return "cpu"
        ids = self.device.split(":", 1)[1].split(",") if ":" in self.device else ["0"]
        if len(ids) > 1:
            return f"cuda:{int(ids[rank])}"
        return f"cuda:{int(ids[0]) + rank}"

    def build_pipeline(self, rank: int, device: str | None = None):
        """This rank's pipeline, on `device` (default: device_for(rank); a Ray actor passes the GPU it was given)."""
        import torch

        from .pipelines.h3.components import EngineOptions, H3Components, folder_settings
        from .pipelines.h3.pipeline import H3Pipeline

        device = device or self.device_for(rank)
        settings = folder_settings(self.model_dir)
        options = EngineOptions(
            device=device, dtype=getattr(torch, self.dtype), vae_dtype=getattr(torch, self.vae_dtype),
            attention=self.attention,
            compile_blocks=self.compile == "on" or (self.compile == "auto" and device.startswith("cuda")),
            load_text_encoder=rank == 0,
            reference_image_short_edge=self.reference_image_short_edge
            or settings.get("reference_image_short_edge", 2048),
            canvas_short_edge=settings.get("canvas_short_edge", 768),
            canvas_max_pixels=settings.get("canvas_max_pixels", 768 * 1344),
        )
        return H3Pipeline(H3Components(self.model_dir, options), rank=rank, world=self.world_size)
