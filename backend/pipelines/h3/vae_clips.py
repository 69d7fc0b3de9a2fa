"""The released video VAE's clip-by-clip decode (diffusers' `AutoencoderKLMiniMaxH3._decode`) as pieces that a whole
decode (decode.py), a decode shared by several ranks (decode.py) and a streamed decode (stream_decode.py) all use.

Schedule: with `size` = tokens_chunk_size latents per clip, `drop` = token_drop, the latents are tail-padded by
repeating the last one to a whole number of clips (`clip_schedule`); clip i reads latents [i*size, i*size + size +
token_overlap) and decodes them with a non-causal ViT; neighbouring clips cross-fade `frame_overlap` frames
(`ClipAssembler`); the frames the padded latents made are cut from the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .normalization import denormalize_latents, vae_to_unit


def can_stream_decode(vae) -> bool:
    """True when the VAE exposes diffusers' clip-by-clip decode pieces (AutoencoderKLMiniMaxH3, diffusers 0.42)."""
    return all(hasattr(vae, name) for name in ("_decode_clip", "_blend", "tokens_chunk_size", "token_overlap",
                                                "frame_pre_padding", "frame_overlap", "temporal_compression_ratio"))


def float_video_to_uint8(video: torch.Tensor) -> torch.Tensor:
    """[1, 3, F, H, W] float in 0..1 -> [F, H, W, 3] uint8, rounded half-to-even like the reference's PIL path."""
    return video[0].permute(1, 2, 3, 0).mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


def vae_pixels(clip: torch.Tensor, device) -> torch.Tensor:
    """One decoded clip [1, 3, t, H, W] (VAE space) -> uint8 frames [t, H, W, 3] on `device`."""
    return float_video_to_uint8(vae_to_unit(clip.to(device)))


def clip_input_latents(vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised latents [1, 24, T, h, w] -> what the VAE's clip decoder reads (its own dtype), on `device`."""
    return denormalize_latents(vae, latents, device).to(next(vae.post_quant_conv.parameters()).dtype)


def padded_tail_frames(vae, real_tokens: int, pad_tokens: int) -> int:
    """Pixel frames the `pad_tokens` repeated latents after `real_tokens` produce (cut from the output)."""
    ratio, size = vae.temporal_compression_ratio, vae.tokens_chunk_size
    tail = vae.config.clip_length % ratio
    return sum(tail if tail and (real_tokens + k) % size == 0 else ratio for k in range(pad_tokens))


@dataclass(frozen=True)
class ClipSchedule:
    """How `num_latents` latents decode: `pad_latents` copies of the last one appended, `num_clips` clips, and
    `pad_frames` frames at the end (made by the padding) cut."""

    num_latents: int
    pad_latents: int
    num_clips: int
    pad_frames: int


def clip_schedule(vae, num_latents: int) -> ClipSchedule:
    size, drop = vae.tokens_chunk_size, int(vae.config.token_drop)
    num_tokens = num_latents + drop
    pad = (-num_tokens) % size
    return ClipSchedule(num_latents, pad, (num_tokens + pad) // size - int(drop > 0),
                        padded_tail_frames(vae, num_latents, pad))


def pad_tail(z: torch.Tensor, pad_latents: int) -> torch.Tensor:
    """[1, C, T, h, w] -> the last latent repeated `pad_latents` more times along T."""
    return torch.cat([z, z[:, :, -1:].repeat(1, 1, pad_latents, 1, 1)], dim=2) if pad_latents else z


def clip_window(vae, z: torch.Tensor, i: int, base: int = 0) -> torch.Tensor:
    """Clip i's input: latents [i*size, i*size + size + look-ahead) of `z`, whose first latent has index `base`."""
    start = i * vae.tokens_chunk_size - base
    return z[:, :, start:start + vae.tokens_chunk_size + vae.token_overlap]


class ClipAssembler:
    """Decoded clips (VAE space, in order) -> final uint8 chunks: each clip's head is blended into the previous
    clip's overlap tail; `hold_frames` final frames are held back until `finish(pad_frames)` cuts the padded tail."""

    def __init__(self, vae, device, hold_frames: int):
        self.vae, self.device, self.hold = vae, device, int(hold_frames)
        self.frames_per_clip = vae.tokens_chunk_size * vae.temporal_compression_ratio
        self.has_overlap = int(vae.config.token_drop) > 0
        self._pending: list[torch.Tensor] = []
        self._pending_frames = 0
        self._overlap = None

    def _emit(self, chunk: torch.Tensor) -> list[torch.Tensor]:
        self._pending.append(chunk)
        self._pending_frames += chunk.shape[2]
        out = []
        while self._pending and self._pending_frames - self._pending[0].shape[2] >= self.hold:
            head = self._pending.pop(0)
            self._pending_frames -= head.shape[2]
            out.append(vae_pixels(head, self.device))
        return out

    def add(self, clip: torch.Tensor) -> list[torch.Tensor]:
        vae, n, out = self.vae, self.frames_per_clip, []
        for j in range(int(self.has_overlap) + 1):
            chunk = clip[:, :, j * n:(j + 1) * n][:, :, vae.frame_pre_padding:]
            if j == 0:
                if self._overlap is not None:
                    chunk = vae._blend(self._overlap, chunk, vae.frame_overlap, dim=-3)
                out += self._emit(chunk)
            else:
                self._overlap = chunk
        return out

    def finish(self, pad_frames: int) -> list[torch.Tensor]:
        if pad_frames > self.hold:
            raise ValueError(f"{pad_frames} padded frames to cut but only {self.hold} were held back")
        out = []
        if self._overlap is not None:
            out += self._emit(self._overlap)
            self._overlap = None
        if self._pending:
            rest = torch.cat(self._pending, dim=2)
            self._pending, self._pending_frames = [], 0
            keep = rest.shape[2] - pad_frames
            if keep > 0:
                out.append(vae_pixels(rest[:, :, :keep], self.device))
        return out
