"""Latents -> media. Video comes out as uint8 [F, H, W, 3] on the device that decoded it (the float frames never
leave the GPU: 4x less to copy, see docs/BENCHMARKS.md), audio as float32 [2, N] at the audio VAE's rate."""

from __future__ import annotations

import torch

from .stream_decode import (ClipAssembler, StreamingVideoDecoder, denormalize_video, padded_tail_frames,
                            vae_pixels)


def _denormalize_whole(vae, latents: torch.Tensor, device) -> torch.Tensor:
    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1, 1, 1)
    return (latents.to(device, torch.float32) * std + mean).to(vae.dtype)


@torch.no_grad()
def decode_video(vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised latents [1, 24, T, h, w] -> uint8 frames [F, H, W, 3] on `device` (one whole `vae.decode`)."""
    return vae_pixels(vae.decode(_denormalize_whole(vae, latents, device), return_dict=False)[0], device)


def can_stream_decode(vae) -> bool:
    """True when the VAE exposes diffusers' clip-by-clip decode pieces (AutoencoderKLMiniMaxH3, diffusers 0.42)."""
    return all(hasattr(vae, name) for name in ("_decode_clip", "_blend", "tokens_chunk_size", "token_overlap",
                                                "frame_pre_padding", "frame_overlap", "temporal_compression_ratio"))


def _clip_schedule(vae, latents: torch.Tensor, device):
    """The clip plan of diffusers' `AutoencoderKLMiniMaxH3._decode`: (inputs of each clip [1, C, size + look-ahead,
    h, w], from the denormalised tail-padded latents; frames of padded tail to cut)."""
    z = denormalize_video(vae, latents, device)
    size, drop = vae.tokens_chunk_size, int(vae.config.token_drop)
    num_tokens = z.shape[2] + drop
    pad_tokens = (-num_tokens) % size
    num_clips = (num_tokens + pad_tokens) // size - int(drop > 0)
    real_tokens = z.shape[2]
    if pad_tokens:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad_tokens, 1, 1)], dim=2)
    inputs = [z[:, :, i * size:i * size + size + vae.token_overlap] for i in range(num_clips)]
    return inputs, padded_tail_frames(vae, real_tokens, pad_tokens)


@torch.no_grad()
def iter_decode_video(vae, latents: torch.Tensor, device, shard=None):
    """Normalised latents [1, 24, T, h, w] -> uint8 frame chunks [t, H, W, 3] on `device`, one per temporal clip,
    yielded as soon as each clip is final. Concatenated they equal `decode_video` bit for bit.

    The released VAE decodes clip by clip (`tokens_chunk_size` latent frames + `token_overlap` look-ahead, a
    non-causal ViT per clip) and cross-fades `frame_overlap` frames between neighbours; a clip's frames are final once
    the next clip's head has been blended into its tail. This walks the same schedule as diffusers'
    `AutoencoderKLMiniMaxH3._decode` (same clip inputs, same blend, same tail cut), so each chunk can go to the
    encoder while the next clip decodes. A VAE without those pieces is decoded whole and yielded in one chunk.

    `shard` (parallel.ulysses.SequenceShard, world > 1): clips are independent until the blend, so rank r decodes
    clips r, r + N, ... and the decoded clips are broadcast from their owners; every rank then blends the same
    tensors, so the result equals the one-rank decode bit for bit.
    """
    if not can_stream_decode(vae) or latents.shape[0] != 1:
        yield vae_pixels(vae.decode(_denormalize_whole(vae, latents, device), return_dict=False)[0], device)
        return
    if shard is None or shard.world == 1:
        decoder = StreamingVideoDecoder(vae, device, total_latents=latents.shape[2])
        yield from decoder.push(latents)
        yield from decoder.finish()
        return
    inputs, pad_frames = _clip_schedule(vae, latents, device)
    clips = _decode_clips_shared(vae, inputs, shard)
    if shard.rank != 0:  # the other ranks only decode their clips; rank 0 assembles the video
        return
    assembler = ClipAssembler(vae, device, hold_frames=pad_frames)
    for clip in clips:
        yield from assembler.add(clip)
    yield from assembler.finish(pad_frames)


def _decode_clips_shared(vae, inputs: list[torch.Tensor], shard) -> list[torch.Tensor]:
    import torch.distributed as dist

    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    mine = {i: vae._decode_clip(clip) for i, clip in enumerate(inputs) if i % shard.world == shard.rank}
    clips = []
    for i in range(len(inputs)):
        owner, device = i % shard.world, inputs[i].device
        # shape (5 dims) + dtype code: a rank may own no clip of its own to read them from
        meta = (list(mine[i].shape) + [dtypes.index(mine[i].dtype)]) if owner == shard.rank else [0] * 6
        meta = torch.tensor(meta, dtype=torch.long, device=device)
        dist.broadcast(meta, src=owner, group=shard.group)
        shape, dtype = tuple(meta[:5].tolist()), dtypes[int(meta[5])]
        clip = mine[i].contiguous() if owner == shard.rank else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(clip, src=owner, group=shard.group)
        clips.append(clip)
    return clips


@torch.no_grad()
def decode_audio(audio_vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised audio latents [2, 32, Ta] -> waveform [2, N] float32 on CPU."""
    cfg = audio_vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1)
    x = latents.to(device, torch.float32) * std + mean
    wave = audio_vae.decode(x.to(audio_vae.dtype), return_dict=False)[0].float()  # [2, 1, N]
    return wave[:, 0].cpu()
