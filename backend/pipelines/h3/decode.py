"""Latents -> media. Video comes out as uint8 [F, H, W, 3] on the device that decoded it (the float frames never
leave the GPU: 4x less to copy, see docs/BENCHMARKS.md), audio as float32 [2, N] at the audio VAE's rate."""

from __future__ import annotations

import torch

from .conditioning import PIXEL_MEAN, PIXEL_STD


def float_video_to_uint8(video: torch.Tensor) -> torch.Tensor:
    """[1, 3, F, H, W] float in 0..1 -> [F, H, W, 3] uint8, rounded half-to-even like the reference's PIL path."""
    return video[0].permute(1, 2, 3, 0).mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


@torch.no_grad()
def decode_video(vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised latents [1, 24, T, h, w] -> uint8 frames [F, H, W, 3] on `device`."""
    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1, 1, 1)
    x = latents.to(device, torch.float32) * std + mean
    video = vae.decode(x.to(vae.dtype), return_dict=False)[0].float()
    pm = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    return float_video_to_uint8((video * ps + pm).clamp(0, 1))


@torch.no_grad()
def decode_audio(audio_vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised audio latents [2, 32, Ta] -> waveform [2, N] float32 on CPU."""
    cfg = audio_vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1)
    x = latents.to(device, torch.float32) * std + mean
    wave = audio_vae.decode(x.to(audio_vae.dtype), return_dict=False)[0].float()  # [2, 1, N]
    return wave[:, 0].cpu()
