"""The SeedVR2 model family (one-step video restoration / upscaling): its engine options, the checks made before any
weight moves, and how a rank builds its pipeline from a Runtime (backend/families.py states the contract)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...engine_config import DTYPES, EngineConfig
from ...options import parse_resident_blocks
from ...runtime import WeightPolicy
from .options import ENGINE, WEIGHT_FORMATS

DIT_VARIANTS = ("auto", "3b", "7b")


@dataclass(frozen=True)
class SeedVR2Options:
    dit_path: str  # a single-file DiT release (.safetensors): 3B or 7B, fp16/bf16/fp32/fp8
    vae_path: str  # ema_vae_fp16.safetensors or a file with the same keys
    text_path: str  # pos_emb.safetensors, or the release's pos_emb.pt (read as a plain tensor only)
    variant: str = "auto"  # "3b"/"7b": refuse a file of the other model; "auto": what the file holds
    vae_dtype: str = "bfloat16"


def seedvr2_config(dit_path: str, vae_path: str, text_path: str, *, variant: str = "auto", dtype: str = "bfloat16",
                   vae_dtype: str = "bfloat16", **engine) -> EngineConfig:
    """An engine config for SeedVR2 files. `dtype`: the DiT's compute dtype; `engine`: EngineConfig's own fields
    (device, world_size = window-SP degree, executor, attention, cpu_threads, ...)."""
    options = SeedVR2Options(str(dit_path), str(vae_path), str(text_path), variant, vae_dtype)
    return EngineConfig("seedvr2", options, compute_dtype=dtype, **engine)


def seedvr2_engine_config(dit_path: str, vae_path: str, text_path: str, *, weights: str = "bf16",
                          resident_blocks="all", **config) -> EngineConfig:
    """The SeedVR2 engine config for the loader's choices, each checked by its option's rule: the one builder SeedVR2
    Model Loader and `upscale` share. `config`: seedvr2_config's other arguments (variant, dtype, vae_dtype, device,
    world_size, attention, ...)."""
    ENGINE.check({"weights": weights, "resident_blocks": resident_blocks})
    placement, resident = parse_resident_blocks(resident_blocks)
    policy = WeightPolicy(storage=WEIGHT_FORMATS[weights], placement=placement, resident_blocks=resident)
    return seedvr2_config(dit_path, vae_path, text_path, weights=policy, **config)


class SeedVR2Family:
    name = "seedvr2"

    def check(self, config: EngineConfig) -> None:
        from ...models.seedvr2.checkpoints import dit_variant, header_shapes
        from ...models.checkpoint import CheckpointError

        o = config.options
        if not isinstance(o, SeedVR2Options):
            raise TypeError(f"the seedvr2 family takes SeedVR2Options, got {type(o).__name__}")
        if o.variant not in DIT_VARIANTS:
            raise ValueError(f"SeedVR2 model must be one of {DIT_VARIANTS}, got {o.variant!r}.")
        if o.vae_dtype not in DTYPES:
            raise ValueError(f"VAE dtype must be one of {DTYPES}, got {o.vae_dtype!r}.")
        w = config.weights
        if type(w) is not WeightPolicy:  # another family's own policies (a subclass) mean nothing here
            raise ValueError(f"SeedVR2 takes the shared weight policy (storage, placement, resident blocks); "
                             f"{type(w).__name__}'s own settings are not available for it.")
        from ...models.fp8_linear import check_fp8_config

        check_fp8_config(config)
        from ...attention.registry import dense_names, get_backend

        if get_backend(config.attention).make_plan is not None:  # a sparse backend's plan reads H3's packed layout
            raise ValueError(f"SeedVR2 takes a dense attention backend ({', '.join(dense_names())}), got "
                             f"'{config.attention}'.")
        for what, path in (("DiT", o.dit_path), ("VAE", o.vae_path), ("text embedding", o.text_path)):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"SeedVR2 {what} file not found: {path}")
        for what, path in (("DiT", o.dit_path), ("VAE", o.vae_path)):
            if not path.endswith(".safetensors"):
                raise CheckpointError(f"SeedVR2 {what} {path} is not a .safetensors file; only safetensors weights "
                                      "are loaded.")
        # Header only (a few KB): the wrong model for the chosen variant fails here, before a process starts.
        found = dit_variant(header_shapes(o.dit_path), o.dit_path)
        if o.variant != "auto" and found != o.variant:
            raise CheckpointError(f"{o.dit_path} holds a SeedVR2 {found.upper()} DiT, but the {o.variant.upper()} "
                                  f"model was chosen: pick a {o.variant.upper()} file or the {found.upper()} model.")
        vae_keys = header_shapes(o.vae_path)
        if not any(k.startswith("decoder.") for k in vae_keys):
            raise CheckpointError(f"{o.vae_path} is not a SeedVR2 VAE (no decoder. tensors); pick ema_vae_fp16."
                                  "safetensors.")

    def memory_bytes(self, config: EngineConfig) -> int:
        """What a rank holds (on the device, or with the offload placement in host memory): both weight files at the
        compute width (an fp8 file doubles in bf16; FP8 storage keeps the blocks' GEMM weights at one byte)."""
        from ...models.seedvr2.checkpoints import GEMM_WEIGHT, header_shapes

        fp8 = config.weights.storage in ("fp8", "fp8_emulated")
        total = 0
        for path, dtype in ((config.options.dit_path, config.compute_dtype),
                            (config.options.vae_path, config.options.vae_dtype)):
            width = 4 if dtype == "float32" else 2
            for key, shape in header_shapes(path).items():
                total += (1 if fp8 and GEMM_WEIGHT.match(key) else width) * _numel(shape)
        return total

    def build(self, runtime, options: SeedVR2Options):
        from .components import SeedVR2Components
        from .pipeline import SeedVR2Pipeline

        return SeedVR2Pipeline(SeedVR2Components(options, runtime), runtime)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


FAMILY = SeedVR2Family()
