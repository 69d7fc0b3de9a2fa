"""ComfyUI's native MiniMax-H3 AV LATENT <-> our H3_LATENTS: the one place the two meet (docs/NATIVE_H3.md).

Native (ComfyUI 0.30+, comfy_extras/nodes_minimax_h3.py): LATENT {"samples": NestedTensor((video, audio))}, video
[B, 24, T, H/16, W/16] and audio [B, 32, 2, Ta] (32 channels x the stereo pair, 40 latents per second), B = 1 (the
native DiT samples one clip). Ours: video [1, 24, T, h, w] and audio [2, 32, Ta] (the stereo pair as the batch of the
mono audio VAE), float32.

Normalisation: the same on both sides, so values pass unchanged and only the audio's layout moves. Both hold each
VAE's per-channel (z - latents_mean) / latents_std: the native VAEs apply it inside encode / decode
(comfy/ldm/minimax/vae.py, audio_vae.py), the MiniMaxH3AV latent format adds nothing (scale_factor 1, no shift: its
process_in / process_out are the identity), and ModelSamplingAV's audio scale exists only inside a sampling run
(model_base.MiniMaxH3.process_latent_in / _out remove it before KSampler returns its LATENT); ours normalises with
the same statistics (backend/pipelines/h3/normalization.py).

A ComfyUI without NestedTensor (before 0.8) cannot carry this LATENT: the nodes then hide the inputs and outputs
that use it (`native_latent_supported`).
"""

from __future__ import annotations

import torch

from . import comfy_services as services
from .backend.finite import check_finite
from .backend.pipelines.h3.geometry import RequestError
from .types import H3Latents

VIDEO_CHANNELS, AUDIO_CHANNELS, STEREO = 24, 32, 2
NATIVE_SOURCES = "a native MiniMax-H3 node (KSampler on Empty MiniMax H3 AV Latent / MiniMax H3 Image to Video)"


def native_latent_supported() -> bool:
    """Whether the ComfyUI at hand has the NestedTensor the native AV LATENT needs."""
    return services.nested_tensor_class() is not None


def to_native(latents: H3Latents) -> dict:
    """Our latents -> the native AV LATENT (copies: the two graphs never share a tensor)."""
    nested = services.nested_tensor_class()
    if nested is None:
        raise RuntimeError("This ComfyUI has no NestedTensor (comfy/nested_tensor.py, ComfyUI 0.8+): it cannot hold "
                           "a MiniMax-H3 AV LATENT.")
    video = latents.video.detach().to("cpu", torch.float32).clone()
    audio = latents.audio.detach().to("cpu", torch.float32).permute(1, 0, 2).unsqueeze(0).contiguous()
    return {"samples": nested((video, audio))}


def from_native(latent, what: str = "native_latent") -> H3Latents:
    """The native AV LATENT -> our latents (float32, CPU). A LATENT that is not one (an image model's, a video-only
    one, a batch of several clips) is a RequestError naming `what` and the shapes."""
    samples = latent.get("samples") if isinstance(latent, dict) else None
    tensors = list(getattr(samples, "tensors", ())) if getattr(samples, "is_nested", False) else None
    if not tensors:
        shape = tuple(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
        raise RequestError(f"{what} is not a MiniMax-H3 AV latent (a video + audio NestedTensor), got {shape}: "
                           f"connect the LATENT of {NATIVE_SOURCES}.")
    shapes = [tuple(t.shape) for t in tensors]
    if len(tensors) != 2:
        raise RequestError(f"{what} holds {len(tensors)} streams {shapes}; a MiniMax-H3 AV latent holds video + audio.")
    video, audio = tensors
    if video.ndim != 5 or video.shape[1] != VIDEO_CHANNELS or audio.ndim != 4 or audio.shape[1:3] != (
            AUDIO_CHANNELS, STEREO):
        raise RequestError(f"{what} has streams {shapes}; a MiniMax-H3 AV latent is video [1, 24, T, H/16, W/16] + "
                           f"audio [1, 32, 2, Ta]: connect the LATENT of {NATIVE_SOURCES}.")
    if video.shape[0] != 1 or audio.shape[0] != 1:
        raise RequestError(f"{what} is a batch of {video.shape[0]} clips {shapes}; MiniMax-H3 takes one.")
    check_finite(video, f"{what} video")
    check_finite(audio, f"{what} audio")
    return H3Latents(video.detach().to("cpu", torch.float32).clone(),
                     audio[0].detach().to("cpu", torch.float32).permute(1, 0, 2).contiguous())
