"""What one SeedVR2 rank holds: the DiT (compute dtype), the video VAE (its own dtype) and the fixed text embedding,
loaded once by the family's one loader (strict keys, safetensors only), placed by the weight policy: storage
"compute" casts an fp8 file per tensor at load, "fp8" holds the blocks' GEMM weights in float8 e4m3 (an fp8 file's
as they are); placement "resident" keeps everything on the device, "offload" streams the DiT's blocks and moves the
VAE for its stages (placement.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from ...models.seedvr2.checkpoints import load_dit, load_text_embedding, load_vae


def cpu_has_native_bf16() -> bool:
    """oneDNN's own check: the CPU has bf16 instructions (AVX512-BF16 / AMX). Without them (AVX2-only CPUs) torch
    runs bf16 convolutions through a reference path: a 3x3x3 conv3d over 32 channels took 0.29 s in bf16 vs 0.04 s in
    float32 on one AVX2 core."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without oneDNN: no fast bf16 either
        return False


def vae_dtype_for(device: torch.device, requested: torch.dtype) -> torch.dtype:
    """The VAE's dtype on this device: a bf16 VAE on a CPU without native bf16 runs in float32 instead (several
    times faster there, and closer to the exact result); everything else as requested."""
    if device.type == "cpu" and requested == torch.bfloat16 and not cpu_has_native_bf16():
        return torch.float32
    return requested


class SeedVR2Components:
    def __init__(self, options, runtime):
        self.device = runtime.device
        self.dtype = runtime.compute_dtype
        self.vae_dtype = vae_dtype_for(self.device, getattr(torch, options.vae_dtype))
        policy = runtime.weights
        self.weights = policy
        fp8 = policy.storage in ("fp8", "fp8_emulated")
        if policy.storage == "fp8":
            from ...models.fp8_linear import check_scaled_mm

            check_scaled_mm(self.device)  # this rank's own GPU, before any weight loads
        offload = policy.placement == "offload"
        home = torch.device("cpu") if offload else self.device  # offload: the placement moves what goes where
        self.dit = load_dit(options.dit_path, home, self.dtype, expect=options.variant, keep_fp8=fp8)
        self.vae = load_vae(options.vae_path, home, self.vae_dtype)
        self.placement = None
        if offload:
            from .placement import SeedVR2Placement

            self.placement = SeedVR2Placement(self.dit, self.vae, self.device, policy.resident_blocks, policy.storage)
        elif fp8:
            for block in self.dit.blocks:
                block.use_fp8_gemms(emulate=policy.storage == "fp8_emulated")
        # [L, 5120] -> the DiT's compute dtype once; every batch reuses it. A pickle beside the DiT gets its
        # safetensors copy there; one found elsewhere (another pack's install) is only read.
        text = Path(options.text_path)
        beside_dit = text.parent == Path(options.dit_path).parent
        self.text = load_text_embedding(text, copy_to=text.parent if beside_dit else None,
                                        width=self.dit.config.txt_dim).to(self.device, self.dtype)

    @property
    def config(self):
        return self.dit.config
