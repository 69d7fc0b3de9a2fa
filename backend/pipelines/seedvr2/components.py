"""What one SeedVR2 rank holds: the DiT (compute dtype), the video VAE (its own dtype) and the fixed text embedding,
loaded once by the family's one loader (strict keys, safetensors only, fp8 files cast per tensor at load)."""

from __future__ import annotations

from pathlib import Path

import torch

from ...models.seedvr2.checkpoints import load_dit, load_text_embedding, load_vae


class SeedVR2Components:
    def __init__(self, options, runtime):
        self.device = runtime.device
        self.dtype = runtime.compute_dtype
        self.vae_dtype = getattr(torch, options.vae_dtype)
        self.dit = load_dit(options.dit_path, self.device, self.dtype, expect=options.variant)
        self.vae = load_vae(options.vae_path, self.device, self.vae_dtype)
        # [L, 5120] -> the DiT's compute dtype once; every batch reuses it. A pickle beside the DiT gets its
        # safetensors copy there; one found elsewhere (another pack's install) is only read.
        text = Path(options.text_path)
        beside_dit = text.parent == Path(options.dit_path).parent
        self.text = load_text_embedding(text, copy_to=text.parent if beside_dit else None).to(self.device,
                                                                                              self.dtype)

    @property
    def config(self):
        return self.dit.config
