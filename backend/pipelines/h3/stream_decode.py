"""Decode latents that arrive piece by piece (extension windows) into media, with bounded memory, and with exactly
the result of decoding the whole latent sequence at once.

Video: the released VAE decodes `tokens_chunk_size` latent frames per clip plus `token_overlap` look-ahead latents
(decode.iter_decode_video has the schedule). Clip i reads latents [i*size, i*size + size + look-ahead) only, so it is
decoded as soon as those exist and are final; the frames it makes are final once the next clip's head has been
blended into its tail (`ClipAssembler`). At `finish()` the tail is padded exactly as a whole-sequence decode pads it.
Only the latents of clips not yet decoded are kept.

Audio: the BigVGAN-style decoder is convolutional with a finite reach (in latents, measured once per model by
`audio_decoder_reach`: a probe that changes one latent and sees which samples move). A latent's samples are final
once `reach` latents exist on both sides of it; each push decodes the unfinished span with `reach` latents of
context on each side and keeps the middle, so the soundtrack equals a whole decode up to float summation order.
"""

from __future__ import annotations

import math

import torch

from .conditioning import PIXEL_MEAN, PIXEL_STD


def float_video_to_uint8(video: torch.Tensor) -> torch.Tensor:
    """[1, 3, F, H, W] float in 0..1 -> [F, H, W, 3] uint8, rounded half-to-even like the reference's PIL path."""
    return video[0].permute(1, 2, 3, 0).mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


def vae_pixels(clip: torch.Tensor, device) -> torch.Tensor:
    """One decoded clip [1, 3, t, H, W] (VAE space) -> uint8 frames [t, H, W, 3] on `device`."""
    pm = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    return float_video_to_uint8((clip.float() * ps + pm).clamp(0, 1))


def denormalize_video(vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised latents [1, 24, T, h, w] -> what the VAE's clip decoder reads (its dtype), on `device`."""
    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1, 1, 1)
    x = (latents.to(device, torch.float32) * std + mean).to(vae.dtype)
    return x.to(next(vae.post_quant_conv.parameters()).dtype)


def padded_tail_frames(vae, real_tokens: int, pad_tokens: int) -> int:
    """Pixel frames the `pad_tokens` repeated latents after `real_tokens` produce (cut from the output)."""
    ratio, size = vae.temporal_compression_ratio, vae.tokens_chunk_size
    tail = vae.config.clip_length % ratio
    return sum(tail if tail and (real_tokens + k) % size == 0 else ratio for k in range(pad_tokens))


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


class StreamingVideoDecoder:
    """push(latents [1, 24, t, h, w], normalised) -> uint8 chunks [t', H, W, 3] on `device` that are final;
    finish() -> the rest. All chunks concatenated equal decode.decode_video of all pushed latents, bit for bit.
    `total_latents`, when known up front, lets it hold back only the padded tail it will cut (else the most a tail
    can be: (size - 1) * ratio frames)."""

    def __init__(self, vae, device, total_latents: int | None = None):
        from .decode import can_stream_decode

        self.vae, self.device = vae, device
        self.streaming = can_stream_decode(vae)
        self.total = 0  # latents pushed so far
        self._z = None  # denormalised latents from global index self._base on
        self._base = 0
        self._next_clip = 0
        if self.streaming:
            self.size, self.look = vae.tokens_chunk_size, vae.token_overlap
            self.drop = int(vae.config.token_drop)
            hold = (self.size - 1) * vae.temporal_compression_ratio
            if total_latents is not None:
                hold = padded_tail_frames(vae, total_latents, (-(total_latents + self.drop)) % self.size)
            self._assembler = ClipAssembler(vae, device, hold_frames=hold)

    def push(self, latents: torch.Tensor) -> list[torch.Tensor]:
        x = denormalize_video(self.vae, latents, self.device)
        self._z = x if self._z is None else torch.cat([self._z, x], dim=2)
        self.total += x.shape[2]
        if not self.streaming:
            return []
        out = []
        while (self._next_clip + 1) * self.size + self.look <= self.total:  # clip inputs complete and final
            out += self._decode_clip(self._next_clip)
            self._next_clip += 1
        drop = self._next_clip * self.size - self._base
        if drop > 0:
            self._z, self._base = self._z[:, :, drop:].contiguous(), self._base + drop
        return out

    def _decode_clip(self, i: int) -> list[torch.Tensor]:
        start = i * self.size - self._base
        return self._assembler.add(self.vae._decode_clip(self._z[:, :, start:start + self.size + self.look]))

    def finish(self) -> list[torch.Tensor]:
        if self._z is None:
            return []
        if not self.streaming:  # a VAE without the clip pieces: one whole decode
            return [vae_pixels(self.vae.decode(self._z, return_dict=False)[0], self.device)]
        num_tokens = self.total + self.drop
        pad = (-num_tokens) % self.size
        num_clips = (num_tokens + pad) // self.size - int(self.drop > 0)
        if pad:
            self._z = torch.cat([self._z, self._z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
        out = []
        for i in range(self._next_clip, num_clips):
            out += self._decode_clip(i)
        out += self._assembler.finish(padded_tail_frames(self.vae, self.total, pad))
        self._z = None
        return out


def _denormalize_audio(audio_vae, latents: torch.Tensor, device) -> torch.Tensor:
    cfg = audio_vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1)
    return (latents.to(device, torch.float32) * std + mean).to(audio_vae.dtype)


def _decode_audio_raw(audio_vae, x: torch.Tensor) -> torch.Tensor:
    return audio_vae.decode(x, return_dict=False)[0].float()[:, 0]  # [2, N]


@torch.no_grad()
def audio_decoder_reach(audio_vae, device, start: int = 32, limit: int = 2048) -> tuple[int, int]:
    """(reach in latents, samples per latent) of the audio decoder: how far one latent's change spreads."""
    channels = audio_vae.config.latent_channels
    n = start
    while n <= limit:
        base = torch.zeros(1, channels, 2 * n, device=device, dtype=audio_vae.dtype)
        probe = base.clone()
        probe[:, :, n] = 1.0
        a, b = _decode_audio_raw(audio_vae, base), _decode_audio_raw(audio_vae, probe)
        hop = a.shape[-1] // (2 * n)
        changed = torch.nonzero((a - b).abs()[0] > 0).flatten()
        if changed.numel() == 0:
            return 1, hop
        first, last = int(changed[0]), int(changed[-1])
        if first > 0 and last < a.shape[-1] - 1:  # the spread fits inside the probe
            reach = max(n - first // hop, math.ceil((last + 1) / hop) - (n + 1))
            return reach + 1, hop  # one latent of margin
        n *= 2
    raise RuntimeError(f"The audio decoder's reach exceeds {limit} latents; it cannot be decoded in pieces.")


def cached_decoder_reach(audio_vae, device) -> tuple[int, int]:
    """audio_decoder_reach, probed once per loaded audio VAE (a property of its weights' shapes, not of a request)."""
    reach = getattr(audio_vae, "_h3_decoder_reach", None)
    if reach is None:
        reach = audio_decoder_reach(audio_vae, device)
        audio_vae._h3_decoder_reach = reach
    return reach


class StreamingAudioDecoder:
    """push(latents [2, 32, t], normalised) -> float32 waveform [2, n] (CPU) that is final; finish() -> the rest."""

    def __init__(self, audio_vae, device, reach: tuple[int, int] | None = None):
        self.audio_vae, self.device = audio_vae, device
        self.reach, self.hop = reach or cached_decoder_reach(audio_vae, device)
        self._buffer = None  # normalised latents from global index self._base on
        self._base = 0
        self.total = 0
        self.emitted = 0  # latents whose samples were returned

    def push(self, latents: torch.Tensor) -> torch.Tensor:
        latents = latents.float().cpu()
        self._buffer = latents if self._buffer is None else torch.cat([self._buffer, latents], dim=2)
        self.total += latents.shape[2]
        return self._emit_until(self.total - self.reach)

    def finish(self) -> torch.Tensor:
        return self._emit_until(self.total)

    def _emit_until(self, end: int) -> torch.Tensor:
        if end <= self.emitted:
            return torch.zeros(2, 0)
        lo = max(0, self.emitted - self.reach)
        hi = min(self.total, end + self.reach)
        x = _denormalize_audio(self.audio_vae, self._buffer[:, :, lo - self._base:hi - self._base], self.device)
        wave = _decode_audio_raw(self.audio_vae, x).cpu()
        out = wave[:, (self.emitted - lo) * self.hop:(end - lo) * self.hop]
        self.emitted = end
        keep_from = max(0, self.emitted - self.reach)  # context the next span needs
        self._buffer, self._base = self._buffer[:, :, keep_from - self._base:], keep_from
        return out
