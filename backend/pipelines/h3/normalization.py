"""What H3's VAEs read and write, in one place: pixels <-> the video VAE's input space (ImageNet mean / std), and
latents <-> the normalised latents the DiT works on (each VAE config's per-channel `latents_mean` / `latents_std`).

Channels are dim 1 everywhere: video latents [1, 24, T, h, w], audio latents [2, 32, Ta] (the mono audio VAE takes
the two channels as its batch), pixels [1, 3, T, H, W]. Encoding normalises on the host in float32; decoding
denormalises in float32 on the decoding device and hands the VAE its own dtype.
"""

from __future__ import annotations

import torch

PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)


def _per_channel(values, ndim: int, device=None) -> torch.Tensor:
    return torch.tensor(values, device=device).view((1, -1) + (1,) * (ndim - 2))


def pixels_to_vae(pixels: torch.Tensor, device, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [1, 3, T, H, W] -> the video VAE's input [1, 3, T, H, W] in `dtype` on `device`."""
    x = pixels.to(device, torch.float32) / 255.0
    return ((x - _per_channel(PIXEL_MEAN, x.ndim, device)) / _per_channel(PIXEL_STD, x.ndim, device)).to(dtype)


def vae_to_unit(video: torch.Tensor) -> torch.Tensor:
    """The video VAE's output [1, 3, t, H, W] -> float32 pixels in 0..1 on its device."""
    x = video.float()
    return (x * _per_channel(PIXEL_STD, x.ndim, x.device) + _per_channel(PIXEL_MEAN, x.ndim, x.device)).clamp(0, 1)


def normalize_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """A VAE's raw latents (float32, channels on dim 1) -> normalised latents, on their own device."""
    cfg = vae.config
    return (latents - _per_channel(cfg.latents_mean, latents.ndim, latents.device)) / _per_channel(
        cfg.latents_std, latents.ndim, latents.device)


def denormalize_latents(vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised latents (channels on dim 1) -> what `vae` decodes: its raw latents in its dtype, on `device`."""
    cfg = vae.config
    x = latents.to(device, torch.float32)
    return (x * _per_channel(cfg.latents_std, x.ndim, device) + _per_channel(cfg.latents_mean, x.ndim, device)).to(
        vae.dtype)
