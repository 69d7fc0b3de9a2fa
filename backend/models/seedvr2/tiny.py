"""Tiny SeedVR2 release files built by the package: a 3B-like (or 7B-like) DiT, the video VAE at tiny widths and a
short text embedding, in the release layouts (same keys, single safetensors files), with deterministic random
weights. They restore nothing (the output is noise-like); they exist so the demo, the workflows and the tests run the
real loading and restoration code anywhere, without the multi-GB release."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

DIT_FILE = "seedvr2_tiny_{variant}.safetensors"
VAE_FILE = "seedvr2_tiny_vae.safetensors"
TEXT_FILE = "pos_emb.safetensors"
TEXT_TOKENS = 8


def _random_state(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every floating tensor redrawn from `generator` (deterministic whatever the modules' own init does): weights
    ~ N(0, 1/fan_in) so activations stay O(1) through the depth, vectors (biases, norms, modulation) near their
    neutral values. Buffers keep the values the module computed."""
    params = {name for name, _ in module.named_parameters()}
    state = {}
    for key, value in module.state_dict().items():
        if key not in params or not value.is_floating_point():  # buffers (e.g. RoPE frequencies) as built
            state[key] = value.clone()
        elif value.dim() >= 2:
            fan_in = value[0].numel()
            state[key] = torch.randn(value.shape, generator=generator) / fan_in**0.5
        elif key.endswith(("norm.weight", "norm1.weight", "norm2.weight", "_scale", ".weight")):
            state[key] = 1.0 + 0.05 * torch.randn(value.shape, generator=generator)
        else:
            state[key] = 0.05 * torch.randn(value.shape, generator=generator)
    return state


def make_tiny_seedvr2(folder: str | os.PathLike, variant: str = "3b", seed: int = 0) -> Path:
    """Write the tiny set into `folder` (created); returns it. Existing files are replaced only inside the folder
    the caller chose (the cache builder stages in a fresh folder and renames it into place)."""
    from .dit import SeedVR2DiT
    from .dit_config import DiTConfig
    from .vae import SeedVR2VAE, VAEConfig

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    config = DiTConfig.tiny(variant)
    dit = SeedVR2DiT(config)
    save_file(_random_state(dit, generator), str(folder / DIT_FILE.format(variant=variant)))
    vae = SeedVR2VAE(VAEConfig.tiny())
    save_file(_random_state(vae, generator), str(folder / VAE_FILE))
    text = torch.randn((TEXT_TOKENS, config.txt_dim), generator=generator)
    save_file({"pos_emb": text}, str(folder / TEXT_FILE))
    return folder
