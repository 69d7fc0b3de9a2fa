"""Latents -> media. Video comes out as uint8 [F, H, W, 3] on the device that decoded it (the float frames never
leave the GPU: 4x less to copy, see docs/BENCHMARKS.md), audio as float32 [2, N] at the audio VAE's rate.

With several ranks the video decode is shared (`iter_decode_video`, `decode_frames_to_host`): every rank calls it,
clip i is decoded by rank i % world, and rank 0 (the driver) assembles the frames; the other ranks get nothing.
This is the one rank-aware decode every task uses.
"""

from __future__ import annotations

import torch

from ...errors import Cancelled
from ...media.stream_writer import HostFrameCollector
from ...parallel.context import SINGLE, ParallelContext
from .clip_graph import GraphedClipDecode, clip_decoder
from .normalization import denormalize_latents
from .stream_decode import StreamingVideoDecoder
from .vae_clips import ClipAssembler, can_stream_decode, clip_input_latents, clip_schedule, clip_window, pad_tail, \
    vae_pixels


@torch.no_grad()
def decode_video(vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised latents [1, 24, T, h, w] -> uint8 frames [F, H, W, 3] on `device` (one whole `vae.decode`)."""
    return vae_pixels(vae.decode(denormalize_latents(vae, latents, device), return_dict=False)[0], device)


def _stopped(should_stop) -> bool:
    return should_stop is not None and bool(should_stop())


@torch.no_grad()
def iter_decode_video(vae, latents: torch.Tensor, device, parallel: ParallelContext = SINGLE, should_stop=None,
                      cuda_graphs: bool = False, batch_tiles: bool | None = None):
    """Normalised latents [1, 24, T, h, w] -> uint8 frame chunks [t, H, W, 3] on `device`, one per temporal clip,
    yielded as soon as each clip is final. Concatenated they equal `decode_video` bit for bit when each clip's tiles
    are decoded one by one (the CPU's default), and up to float summation order when they are batched
    (`batch_tiles`, by default on CUDA: clip_graph.clip_decoder, tile_batch.py).

    The released VAE decodes clip by clip and cross-fades neighbours (vae_clips.py); a clip's frames are final once
    the next clip's head has been blended into its tail, so each chunk can go to the encoder while the next clip
    decodes. A VAE without those pieces is decoded whole and yielded in one chunk.

    Several ranks (`parallel.world` > 1): clips are independent until the blend, so rank r decodes clips r, r + N, ...
    and the decoded clips are broadcast from their owners; every rank then has the same tensors, and rank 0 blends
    and yields them, so the result equals the one-rank decode bit for bit. The other ranks yield nothing.

    `should_stop` is asked between clips (it is also a rank's progress mark for the liveness watchdog): Stop ends a
    long decode with Cancelled, on every rank at the same point.

    `cuda_graphs` (CUDA devices): each rank's clips after its first are replayed from a CUDA graph (clip_graph.py:
    same kernels, same bits; worth it when a CPU encoder runs beside the decode), freed when the decode ends.
    """
    if not can_stream_decode(vae) or latents.shape[0] != 1:
        yield decode_video(vae, latents, device)
        return
    decode_clip = clip_decoder(vae, device, cuda_graphs, batch_tiles)
    try:
        if not parallel.is_parallel:
            decoder = StreamingVideoDecoder(vae, device, total_latents=latents.shape[2], decode_clip=decode_clip)
            # lazily, clip by clip: the consumer encodes a clip's frames while the next clip decodes
            for chunk in decoder.iter_push(latents):
                yield chunk
                if _stopped(should_stop):
                    raise Cancelled("Stopped during the video decode.")
            yield from decoder.iter_finish()
            return
        schedule = clip_schedule(vae, latents.shape[2])
        z = pad_tail(clip_input_latents(vae, latents, device), schedule.pad_latents)
        inputs = [clip_window(vae, z, i) for i in range(schedule.num_clips)]
        assembler = ClipAssembler(vae, device, hold_frames=schedule.pad_frames) if parallel.is_driver else None
        for clip in _iter_clips_shared(decode_clip, inputs, parallel, should_stop):
            if assembler is not None:  # the other ranks only decode their clips; rank 0 assembles the video
                yield from assembler.add(clip)
        if assembler is not None:
            yield from assembler.finish(schedule.pad_frames)
    finally:
        if isinstance(decode_clip, GraphedClipDecode):
            decode_clip.release()


def _iter_clips_shared(decode_clip, inputs: list[torch.Tensor], parallel: ParallelContext, should_stop=None):
    """Every rank decodes its own clips (clip i on rank i % world), a round of `world` clips at a time; after each
    round the round's clips are broadcast from their owners and yielded in order, so rank 0 hands a round's frames
    on while the next round decodes. Stop is agreed at the start of every round (all ranks stop there, or none)."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    world = parallel.world
    for first in range(0, len(inputs), world):
        round_ = range(first, min(len(inputs), first + world))
        if parallel.any(_stopped(should_stop)):
            raise Cancelled("Stopped during the video decode.")
        mine = {i: decode_clip(inputs[i]) for i in round_ if parallel.owns(i)}
        for i in round_:
            owner, device = parallel.owner(i), inputs[i].device
            # shape (5 dims) + dtype code: a rank may own no clip of its own to read them from
            meta = (list(mine[i].shape) + [dtypes.index(mine[i].dtype)]) if i in mine else [0] * 6
            meta = parallel.broadcast_from(owner, torch.tensor(meta, dtype=torch.long, device=device))
            shape, dtype = tuple(meta[:5].tolist()), dtypes[int(meta[5])]
            clip = mine[i].contiguous() if i in mine else torch.empty(shape, dtype=dtype, device=device)
            yield parallel.broadcast_from(owner, clip)


def decode_frames_to_host(vae, latents: torch.Tensor, device, geo, parallel: ParallelContext = SINGLE,
                          should_stop=None):
    """The rank-aware video decode: every rank calls it; rank 0 gets uint8 [F, H, W, 3] on the CPU (`geo`: the
    request's Geometry), the other ranks decode their clips for it and get None. Each clip becomes uint8 on the device
    and is copied to the host through pinned, double-buffered chunks on a side stream while the next clip decodes."""
    chunks = iter_decode_video(vae, latents, device, parallel, should_stop)
    if not parallel.is_driver:
        for _ in chunks:
            pass
        return None
    collector = HostFrameCollector(geo.width, geo.height, geo.num_frames, device=device)
    try:
        for chunk in chunks:
            collector.write(chunk)
    except BaseException:
        collector.abort()
        raise
    return collector.close()


@torch.no_grad()
def decode_audio(audio_vae, latents: torch.Tensor, device) -> torch.Tensor:
    """Normalised audio latents [2, 32, Ta] -> waveform [2, N] float32 on CPU."""
    wave = audio_vae.decode(denormalize_latents(audio_vae, latents, device), return_dict=False)[0].float()  # [2, 1, N]
    return wave[:, 0].cpu()
