"""Decode latents that arrive piece by piece (extension windows) into media, with bounded memory, and with exactly
the result of decoding the whole latent sequence at once.

Video: the released VAE decodes `tokens_chunk_size` latent frames per clip plus `token_overlap` look-ahead latents
(vae_clips.py has the schedule). Clip i reads latents [i*size, i*size + size + look-ahead) only, so it is
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

from .clip_graph import clip_decoder
from .normalization import denormalize_latents
from .vae_clips import ClipAssembler, can_stream_decode, clip_input_latents, clip_schedule, clip_window, pad_tail, \
    vae_pixels


class StreamingVideoDecoder:
    """push(latents [1, 24, t, h, w], normalised) -> uint8 chunks [t', H, W, 3] on `device` that are final;
    finish() -> the rest. All chunks concatenated equal decode.decode_video of all pushed latents, bit for bit.
    `total_latents`, when known up front, lets it hold back only the padded tail it will cut (else the most a tail
    can be: (size - 1) * ratio frames). `decode_clip`: what decodes one clip (default clip_graph.clip_decoder's for
    `device`); bit for bit holds for the tile-by-tile `vae._decode_clip` (the CPU's default)."""

    def __init__(self, vae, device, total_latents: int | None = None, decode_clip=None):
        self.vae, self.device = vae, device
        self.decode_clip = decode_clip or clip_decoder(vae, device)  # [1, 24, t, h, w] -> one clip
        self.streaming = can_stream_decode(vae)
        self.total = 0  # latents pushed so far
        self._z = None  # denormalised latents from global index self._base on
        self._base = 0
        self._next_clip = 0
        if self.streaming:
            self.size, self.look = vae.tokens_chunk_size, vae.token_overlap
            hold = (self.size - 1) * vae.temporal_compression_ratio
            if total_latents is not None:
                hold = clip_schedule(vae, total_latents).pad_frames
            self._assembler = ClipAssembler(vae, device, hold_frames=hold)

    def push(self, latents: torch.Tensor) -> list[torch.Tensor]:
        return list(self.iter_push(latents))

    def iter_push(self, latents: torch.Tensor):
        """push() as a generator: each clip's final frames are yielded as soon as that clip is decoded, so a
        consumer (the encoder) works on them while the next clip decodes. Consume it fully before the next call."""
        x = clip_input_latents(self.vae, latents, self.device)
        self._z = x if self._z is None else torch.cat([self._z, x], dim=2)
        self.total += x.shape[2]
        if not self.streaming:
            return
        while (self._next_clip + 1) * self.size + self.look <= self.total:  # clip inputs complete and final
            chunks = self._clip_frames(self._next_clip)
            self._next_clip += 1
            yield from chunks
        drop = self._next_clip * self.size - self._base
        if drop > 0:
            self._z, self._base = self._z[:, :, drop:].contiguous(), self._base + drop

    def _clip_frames(self, i: int) -> list[torch.Tensor]:
        return self._assembler.add(self.decode_clip(clip_window(self.vae, self._z, i, self._base)))

    def finish(self) -> list[torch.Tensor]:
        return list(self.iter_finish())

    def iter_finish(self):
        """finish() as a generator (a clip's frames as soon as it is decoded, like iter_push)."""
        if self._z is None:
            return
        if not self.streaming:  # a VAE without the clip pieces: one whole decode
            yield vae_pixels(self.vae.decode(self._z, return_dict=False)[0], self.device)
            self._z = None
            return
        schedule = clip_schedule(self.vae, self.total)
        self._z = pad_tail(self._z, schedule.pad_latents)
        for i in range(self._next_clip, schedule.num_clips):
            yield from self._clip_frames(i)
        yield from self._assembler.finish(schedule.pad_frames)
        self._z = None


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
        x = denormalize_latents(self.audio_vae, self._buffer[:, :, lo - self._base:hi - self._base], self.device)
        wave = _decode_audio_raw(self.audio_vae, x).cpu()
        out = wave[:, (self.emitted - lo) * self.hop:(end - lo) * self.hop]
        self.emitted = end
        keep_from = max(0, self.emitted - self.reach)  # context the next span needs
        self._buffer, self._base = self._buffer[:, :, keep_from - self._base:], keep_from
        return out
