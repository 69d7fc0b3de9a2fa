"""Conversions between ComfyUI value types and backend requests. No math beyond layout changes."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ..backend.finite import check_finite
from ..backend.pipelines.h3.request import ReferenceInput


def image_batch_to_pils(image: torch.Tensor | None, what: str = "image") -> list[Image.Image]:
    """IMAGE [B, H, W, C] float 0..1 -> PIL RGB images (one per batch item). NaN / inf are refused (RequestError
    naming `what`): the uint8 conversion would hide them."""
    if image is None:
        return []
    check_finite(image, what)
    if image.ndim == 3:
        image = image[None]
    if image.ndim != 4 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(f"Expected an IMAGE [batch, height, width, channels], got shape {tuple(image.shape)}.")
    arrays = (image[..., :3].clamp(0, 1) * 255.0).round().to(torch.uint8).cpu().numpy()
    if arrays.shape[-1] == 1:
        arrays = np.repeat(arrays, 3, axis=-1)
    return [Image.fromarray(a) for a in arrays]


def single_image(image: torch.Tensor | None, what: str) -> Image.Image | None:
    pils = image_batch_to_pils(image, what)
    if len(pils) > 1:
        raise ValueError(f"{what} takes one image; got a batch of {len(pils)}. Pick one frame (e.g. ImageFromBatch).")
    return pils[0] if pils else None


def audio_to_waveform(audio: dict | None) -> tuple[torch.Tensor, int] | None:
    """AUDIO {waveform [B, C, T], sample_rate} -> ([C, T] float32, rate); the first batch item."""
    if audio is None:
        return None
    try:
        wave, rate = audio["waveform"], int(audio["sample_rate"])
    except (TypeError, KeyError):
        raise ValueError("AUDIO input must be a dict with 'waveform' [batch, channels, samples] and 'sample_rate'.")
    wave = torch.as_tensor(wave).float()
    if wave.ndim == 3:
        wave = wave[0]
    if wave.ndim != 2 or wave.shape[0] not in (1, 2):
        raise ValueError(f"AUDIO waveform must be [batch, 1 or 2 channels, samples], got {tuple(wave.shape)}.")
    return wave.cpu(), rate


def waveform_to_audio(wave: torch.Tensor, rate: int) -> dict:
    """[C, T] -> AUDIO {waveform [1, C, T], sample_rate}."""
    return {"waveform": wave[None].float().cpu(), "sample_rate": int(rate)}


def build_references(images: torch.Tensor | None, video, audio: dict | None) -> list[ReferenceInput]:
    """Reference order (it matters to the model): images in batch order, then the video, then the audio."""
    from ..video_types import video_to_frames_audio

    refs = [ReferenceInput("image", image=p) for p in image_batch_to_pils(images, "reference_images")]
    if video is not None:
        frames, rate, wave, sr = video_to_frames_audio(video)
        if hasattr(video, "reference_audio"):  # a file-backed clip: its soundtrack read as the reference reads one
            wave, sr = video.reference_audio()
        refs.append(ReferenceInput("video", frames=frames.cpu().numpy(), fps=float(rate), audio=wave, sample_rate=sr))
    pair = audio_to_waveform(audio)
    if pair is not None:
        refs.append(ReferenceInput("audio", audio=pair[0], sample_rate=pair[1]))
    return refs
