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


def _pixels(vae, clip: torch.Tensor, device) -> torch.Tensor:
    """One decoded clip [1, 3, t, H, W] (VAE space) -> uint8 frames [t, H, W, 3] on `device`."""
    pm = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    return float_video_to_uint8((clip.float() * ps + pm).clamp(0, 1))


def can_stream_decode(vae) -> bool:
    """True when the VAE exposes diffusers' clip-by-clip decode pieces (AutoencoderKLMiniMaxH3, diffusers 0.42)."""
    return all(hasattr(vae, name) for name in ("_decode_clip", "_blend", "tokens_chunk_size", "token_overlap",
                                                "frame_pre_padding", "frame_overlap", "temporal_compression_ratio"))


def _clip_schedule(vae, latents: torch.Tensor, device):
    """Denormalised, tail-padded latents and the clip plan of diffusers' `AutoencoderKLMiniMaxH3._decode`:
    (z, inputs of each clip [1, C, size + look-ahead, h, w], frames per clip, whether clips carry an overlap
    chunk, frames of padded tail to cut)."""
    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1, 1, 1)
    x = (latents.to(device, torch.float32) * std + mean).to(vae.dtype)
    z = x.to(next(vae.post_quant_conv.parameters()).dtype)  # what decode() does before _decode()
    size, drop, ratio = vae.tokens_chunk_size, int(cfg.token_drop), vae.temporal_compression_ratio
    num_tokens = z.shape[2] + drop
    pad_tokens = (-num_tokens) % size
    num_clips = (num_tokens + pad_tokens) // size - int(drop > 0)
    real_tokens = z.shape[2]
    if pad_tokens:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad_tokens, 1, 1)], dim=2)
    # Frames the padded tail produces and the output drops (the same count as diffusers' tail cut).
    tail = cfg.clip_length % ratio
    pad_frames = sum(tail if tail and (real_tokens + k) % size == 0 else ratio for k in range(pad_tokens))
    inputs = [z[:, :, i * size:i * size + size + vae.token_overlap] for i in range(num_clips)]
    return x, inputs, size * ratio, drop > 0, pad_frames


def _assemble(vae, clips, frames_per_clip: int, has_overlap: bool, pad_frames: int, device):
    """Decoded clips (VAE space, in order) -> final uint8 chunks: blend each clip's head into the previous
    clip's overlap tail, cut the padded tail; a chunk is yielded as soon as it is final."""
    pending: list[torch.Tensor] = []  # final chunks not yet yielded (held back only to cut the padded tail)
    pending_frames = 0

    def emit(chunk):
        nonlocal pending_frames
        pending.append(chunk)
        pending_frames += chunk.shape[2]
        while pending and pending_frames - pending[0].shape[2] >= pad_frames:
            head = pending.pop(0)
            pending_frames -= head.shape[2]
            yield _pixels(vae, head, device)

    overlap = None
    for clip in clips:
        for j in range(int(has_overlap) + 1):
            chunk = clip[:, :, j * frames_per_clip:(j + 1) * frames_per_clip][:, :, vae.frame_pre_padding:]
            if j == 0:
                if overlap is not None:
                    chunk = vae._blend(overlap, chunk, vae.frame_overlap, dim=-3)
                yield from emit(chunk)
            else:
                overlap = chunk
    if overlap is not None:
        yield from emit(overlap)
    rest = torch.cat(pending, dim=2) if pending else None
    if rest is not None:
        keep = rest.shape[2] - pad_frames
        if keep > 0:
            yield _pixels(vae, rest[:, :, :keep], device)


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
        cfg = vae.config
        mean = torch.tensor(cfg.latents_mean, device=device).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, device=device).view(1, -1, 1, 1, 1)
        x = (latents.to(device, torch.float32) * std + mean).to(vae.dtype)
        yield _pixels(vae, vae.decode(x, return_dict=False)[0], device)
        return
    _, inputs, frames_per_clip, has_overlap, pad_frames = _clip_schedule(vae, latents, device)
    if shard is None or shard.world == 1:
        clips = (vae._decode_clip(clip) for clip in inputs)
    else:
        clips = _decode_clips_shared(vae, inputs, shard)
        if shard.rank != 0:  # the other ranks only decode their clips; rank 0 assembles the video
            return
    yield from _assemble(vae, clips, frames_per_clip, has_overlap, pad_frames, device)


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
