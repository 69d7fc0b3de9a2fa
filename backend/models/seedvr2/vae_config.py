"""Configuration of the SeedVR2 video VAE (the official ``video_vae_v3`` "s8_c16_t4" KL autoencoder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class VAEConfig:
    """Architecture of the causal 3D VAE; ``released()`` is the official ``s8_c16_t4_inflation_sd3.yaml``.

    Encoder: conv_in, one down block per entry of ``block_channels`` (``layers_per_block`` resnets each, a stride-2
    down conv after every block but the last; the ``temporal_down_blocks`` blocks before the last also halve time),
    mid block (resnet, single-head per-frame attention, resnet), GroupNorm + SiLU + conv_out to 2 x latent channels.
    Decoder mirrors it with ``layers_per_block + 1`` resnets per up block; the first ``temporal_down_blocks`` up
    blocks also double time.
    """

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 16
    block_channels: Tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    norm_groups: int = 32
    temporal_down_blocks: int = 2
    eps: float = 1e-6

    def __post_init__(self) -> None:
        n = len(self.block_channels)
        if n < 1 or not 0 <= self.temporal_down_blocks <= n - 1:
            raise ValueError(f"VAEConfig: temporal_down_blocks={self.temporal_down_blocks} must be 0..{n - 1}")
        if any(c % self.norm_groups for c in self.block_channels):
            raise ValueError(f"VAEConfig: {self.block_channels} channels do not split into {self.norm_groups} groups")

    @classmethod
    def released(cls) -> "VAEConfig":
        """``ema_vae_fp16.safetensors`` (250 tensors, 250.6 M parameters)."""
        return cls()

    @classmethod
    def tiny(cls) -> "VAEConfig":
        """Same structure as the released VAE (shortcut convs in the same blocks, 250 tensors), 0.63 M parameters."""
        return cls(block_channels=(8, 16, 24, 24), norm_groups=4)

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.block_channels) - 1)

    @property
    def temporal_factor(self) -> int:
        return 2**self.temporal_down_blocks

    def encoder_temporal_down(self, block: int) -> bool:
        """Whether encoder block ``block``'s down conv also halves time (the official: the last ones before the end)."""
        n = len(self.block_channels)
        return n - 1 - self.temporal_down_blocks <= block < n - 1

    def decoder_temporal_up(self, block: int) -> bool:
        """Whether decoder up block ``block``'s upsampler also doubles time (the official: the first ones)."""
        return block < min(self.temporal_down_blocks, len(self.block_channels) - 1)
