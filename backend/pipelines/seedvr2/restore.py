"""One SeedVR2 batch: frames -> model frames -> VAE encode -> one DiT step at t = 1000 -> decode -> colour fix -> uint8.

The official recipe (projects/video_diffusion_sr/infer.py) for one sample, with the noise drawn from the batch's own
generator in the official order (posterior eps, then x_T):
- cond = (mean + exp(logvar / 2) * eps) * LATENT_SCALE: the VAE posterior is sampled, as upstream does;
- DiT input [T, h, w, 33] = cat[x_T 16 | cond 16 | ones 1]; v = DiT(input, text, t = 1000);
- x0 = x_T - v (v-prediction on the lerp schedule at t = T), decoded after dividing by LATENT_SCALE;
- colour fix against the model-size input frames, then the fit undone and the frame count restored.
With several ranks (`_restore_on_ranks`) the VAE is spread too (backend/parallel/seedvr2_vae_shard.py: the one-rank time
slices dealt round-robin, the causal convs' carried frames passed between neighbours): each rank prepares and encodes
only its own slices' frames, the condition latent is gathered to every rank, every rank runs the DiT on its windows
(ShardedWindowRouting), rank 0's velocity is broadcast, each rank decodes its own slices and colour-fixes and quantises
them against its own input frames, and only uint8 frames travel to rank 0, which returns them (the others None).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import torch

from ...models.seedvr2.vae import LATENT_SCALE
from ...models.seedvr2.vae_tiling import tiled_decode, tiled_encode
from ...parallel import seedvr2_vae_shard as vae_shard
from .batches import latent_frames
from .colorfix import color_fix
from .memory import split_tiles
from .preprocess import Geometry, padded_frame_count, prepare_frames, prepare_video, uint8_frames

TIMESTEP = 1000.0
CHUNK_BYTES = 512 * 1024**2  # float32 temporaries of the colour fix per chunk of frames


def batch_generator(seed: int, batch: int) -> torch.Generator:
    """The noise source of batch `batch`: its own stream, so a batch's result does not depend on the batches before
    it (the same seed and settings give the same video, also when a run is resumed or re-batched)."""
    return torch.Generator().manual_seed((int(seed) + batch * 0x9E3779B97F4A7C15) % 2**64)


def _given(noise: torch.Tensor, shape, what: str) -> torch.Tensor:
    if tuple(noise.shape) != tuple(shape):
        raise ValueError(f"given {what} noise has shape {tuple(noise.shape)}, expected {tuple(shape)}")
    return noise.to(torch.float32)


def _draw(generator: torch.Generator, shape, pin: bool) -> torch.Tensor:
    """torch.randn(shape, generator=generator) (randn is empty + normal_: the same numbers), in pinned host memory
    when `pin` (its copy to the GPU then runs at the bus's speed)."""
    return torch.empty(shape, dtype=torch.float32, pin_memory=pin).normal_(generator=generator)


def draw_noise_aside(generator: torch.Generator, t_lat: int, h: int, w: int, pin: bool) -> Future:
    """A future of (posterior eps [1, 16, T, h, w], x_T [T, h, w, 16]) drawn in the official order on a thread, so
    the ~0.5 s per 10-s batch of CPU draws runs while the GPU encodes (the draws are seeded on the host, so a
    result does not depend on the device)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seedvr2-noise")
    future = pool.submit(lambda: (_draw(generator, (1, 16, t_lat, h, w), pin), _draw(generator, (t_lat, h, w, 16),
                                                                                     pin)))
    pool.shutdown(wait=False)
    return future


def sample_condition(vae, video: torch.Tensor, generator: torch.Generator,
                     eps: torch.Tensor | Future | None = None, vae_tile: int = 0, check=None,
                     frame_stats: bool = True) -> torch.Tensor:
    """Model frames [3, F', H', W'] -> the condition latent [T, h, w, 16] (float32): the posterior sample
    (mean + exp(logvar / 2) * eps) x LATENT_SCALE. `eps`: the standard normal draw [1, 16, T, h, w] to use instead
    of drawing it from `generator` (a future of draw_noise_aside: its first, taken once the encode is done);
    `vae_tile`: encode in tiles of at most this many pixels (0: whole frames); `check`: the Stop check between the
    VAE's time slices (and tiles)."""
    if vae_tile:
        mean, logvar = tiled_encode(vae, video[None], vae_tile, check=check, frame_stats=frame_stats)
    else:
        mean, logvar = vae.encode(video[None], check=check)
    if isinstance(eps, Future):
        eps = eps.result()[0]
    if eps is None:
        eps = torch.randn(mean.shape, generator=generator, dtype=torch.float32)
    eps = _given(eps, mean.shape, "posterior").to(mean.device)
    latent = (mean.float() + torch.exp(0.5 * logvar.float()) * eps) * LATENT_SCALE
    return latent[0].permute(1, 2, 3, 0).contiguous()


@contextmanager
def _stage(timings: dict | None, name: str, device: torch.device):
    """Adds the stage's seconds to timings[name] (device work included: synchronised at both ends); no-op without."""
    if timings is None:
        yield
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0


def _velocity(c, cond: torch.Tensor, x_t: torch.Tensor | None, generator: torch.Generator, routing_for, attention,
              timings: dict | None, check=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one DiT step on condition [T, h, w, 16]: (x_T on the device, drawn after the posterior eps unless given;
    the velocity [T, h, w, 16], None off the driver of a routed run)."""
    t_lat, h, w = cond.shape[:3]
    if x_t is None:
        x_t = torch.randn((t_lat, h, w, 16), generator=generator, dtype=torch.float32)
    x_t = _given(x_t, (t_lat, h, w, 16), "x_T").to(c.device)
    model_in = torch.cat([x_t, cond, torch.ones_like(cond[..., :1])], dim=-1).to(c.dtype)
    routing = routing_for((t_lat, h // 2, w // 2)) if routing_for is not None else None
    if c.placement is not None:
        c.placement.enter_dit()
    with _stage(timings, "dit_s", c.device):
        velocity = c.dit(model_in, c.text, TIMESTEP, routing=routing, attention=attention, check=check)
    return x_t, velocity


def restore_batch(c, frames: torch.Tensor, geometry: Geometry, color_method: str, generator: torch.Generator,
                  parallel, routing_for=None, attention=None, timings: dict | None = None,
                  noise: tuple[torch.Tensor, torch.Tensor] | None = None, vae_tile: int | tuple[int, int] = 0,
                  check=None, frame_stats: bool = True) -> torch.Tensor | None:
    """frames: uint8 [n, h, w, 3] (host) -> uint8 [n, H, W, 3] on the device (rank 0; None on other ranks).
    `routing_for(grid)`: the DiT's window routing for a latent token grid (None: one rank); `attention`: the
    runtime's attention backend (None: the registry's sdpa); `timings`: seconds per stage are added to it;
    `noise`: (posterior eps [1, 16, T, h, w], x_T [T, h, w, 16]) used instead of drawing them from `generator`
    (the same on every rank; the official-parity test injects the official code's draws); `vae_tile`: the VAE in
    tiles of at most this many pixels, or (encode tile, decode tile) (one rank; 0: whole frames), their GroupNorms
    on the frame's statistics (`frame_stats`, vae_tiling.py) or each tile's own. `check()`: the
    Stop check (raises Cancelled; with several ranks it agrees over all of them), asked at every stage border and
    between the DiT's blocks, on one rank also between the VAE's time slices and tiles (the ranks' VAE passes
    exchange frames slice by slice: a rank leaving there would strand its neighbours), so a batch of the whole clip
    stops within a slice or a block."""
    if parallel.is_parallel:
        if any(split_tiles(vae_tile)):  # the pipeline refuses it first, as a request error
            raise ValueError(f"a VAE tile runs on one rank; this restore runs on {parallel.world}")
        return _restore_on_ranks(c, frames, geometry, color_method, generator, parallel, routing_for, attention,
                                 timings, noise, check or _no_check)
    dev = c.device
    n = frames.shape[0]
    with _stage(timings, "prepare_s", dev):
        video = prepare_video(frames, geometry, dtype=c.vae_dtype, device=dev)  # [3, F', H', W'] in [-1, 1]
    drawn = None  # the draws overlap the encode (the one-rank order kept)
    if noise is None:
        drawn = draw_noise_aside(generator, latent_frames(video.shape[1]), video.shape[2] // 8,
                                 video.shape[3] // 8, pin=dev.type == "cuda")
    eps, x_t = noise if noise is not None else (None, None)
    check = check or _no_check
    check()
    encode_tile, decode_tile = split_tiles(vae_tile)
    _enter_vae(c)
    with _stage(timings, "encode_s", dev):
        cond = sample_condition(c.vae, video, generator, eps if drawn is None else drawn, encode_tile, check,
                                frame_stats)
    if drawn is not None:
        x_t = drawn.result()[1]
    check()
    x_t, velocity = _velocity(c, cond, x_t, generator, routing_for, attention, timings, check)
    del cond
    check()
    x0 = (x_t - velocity.float()).div_(LATENT_SCALE)
    del velocity, x_t
    _enter_vae(c)
    with _stage(timings, "decode_s", dev):
        z = x0.permute(3, 0, 1, 2)[None].to(c.vae_dtype)  # decoded below: [3, F', H', W']
        decoded = (tiled_decode(c.vae, z, decode_tile, check=check, frame_stats=frame_stats) if decode_tile else
                   c.vae.decode(z, check=check))[0]
        del z
    del x0
    # Colour fix and quantisation per chunk of frames in float32 (a bf16 result would step by ~1 level of 255).
    top, left, out_h, out_w = geometry.box
    out = torch.empty((n, out_h, out_w, 3), dtype=torch.uint8, device=dev)
    step = max(1, CHUNK_BYTES // (8 * 4 * decoded[:, 0].numel()))
    with _stage(timings, "color_fix_s", dev):
        for a in range(0, n, step):
            b = min(n, a + step)
            fixed = color_fix(decoded[:, a:b].float(), video[:, a:b], color_method)
            out[a:b] = uint8_frames(fixed, geometry, b - a)
    return out


def _no_check() -> None:
    pass


def _enter_vae(c) -> None:
    if c.placement is not None:  # the offload placement brings the VAE in for its stage
        c.placement.enter_vae()


def _restore_on_ranks(c, frames, geometry, color_method, generator, parallel, routing_for, attention, timings, noise,
                      check):
    """restore_batch over the ranks of `parallel` (the module docstring): the same numbers as one rank (the VAE's
    slices, the posterior sample, the colour fix and the quantisation are per slice or per element; only the DiT's
    text sums run in another order)."""
    dev = c.device
    n = frames.shape[0]
    padded = padded_frame_count(n)
    t_lat = latent_frames(padded)
    h, w = geometry.model[0] // 8, geometry.model[1] // 8
    eps, x_t = noise if noise is not None else (None, None)
    if eps is None:  # drawn whole on every rank, in the one-rank order (eps, then x_T); each rank reads its slices
        eps = torch.randn((1, 16, t_lat, h, w), generator=generator, dtype=torch.float32)
    eps = _given(eps, (1, 16, t_lat, h, w), "posterior")
    enc = vae_shard.encode_plan(padded, parallel.world)
    dec = vae_shard.decode_plan(t_lat, parallel.world)
    assert dec.out_spans == enc.spans  # a rank decodes the frames it encoded: its input frames serve the colour fix
    mine = enc.slices_of(parallel.rank)
    check()
    with _stage(timings, "prepare_s", dev):  # this rank's model frames only (frames past the end: the last one)
        refs = {j: prepare_frames(frames[torch.arange(*enc.spans[j]).clamp_(max=n - 1)], geometry, dtype=c.vae_dtype,
                                  device=dev) for j in mine}
    with _stage(timings, "encode_s", dev):
        latents = {}
        for j, (a, b), mean, logvar in vae_shard.encode_pieces(c.vae, parallel, enc, lambda j: refs[j][None]):
            part = eps[:, :, a:b].to(mean.device)
            latent = (mean.float() + torch.exp(0.5 * logvar.float()) * part) * LATENT_SCALE
            latents[j] = latent[0].permute(1, 2, 3, 0).contiguous()  # [t, h, w, 16]
        empty = torch.empty((0, h, w, 16), dtype=torch.float32, device=dev)
        cond = vae_shard.gather_pieces(parallel, enc, [b - a for a, b in enc.out_spans], latents, empty, to_all=True)
        del latents
    check()
    x_t, velocity = _velocity(c, cond, x_t, generator, routing_for, attention, timings, check)
    del cond
    with _stage(timings, "dit_s", dev):
        if parallel.is_driver:
            velocity = velocity.to(c.dtype).contiguous()
        else:
            velocity = torch.empty((t_lat, h, w, 16), dtype=c.dtype, device=dev)
        parallel.broadcast_from_driver(velocity)  # every rank decodes its own slices of x0
    check()
    x0 = (x_t - velocity.float()).div_(LATENT_SCALE)
    del velocity, x_t
    z = x0.permute(3, 0, 1, 2)[None].to(c.vae_dtype)
    del x0
    top, left, out_h, out_w = geometry.box
    counts = [max(0, min(b, n) - a) for a, b in dec.out_spans]  # frames past the input's end are dropped
    pieces = {}
    _enter_vae(c)
    decoded = vae_shard.decode_pieces(c.vae, parallel, dec, z)
    while True:
        with _stage(timings, "decode_s", dev):
            item = next(decoded, None)
        if item is None:
            break
        j, _, y = item
        keep = counts[j]
        ref = refs.pop(j)
        piece = torch.empty((keep, out_h, out_w, 3), dtype=torch.uint8, device=dev)
        step = max(1, CHUNK_BYTES // (8 * 4 * y[0, :, 0].numel()))
        with _stage(timings, "color_fix_s", dev):
            for a in range(0, keep, step):
                b = min(keep, a + step)
                fixed = color_fix(y[0, :, a:b].float(), ref[:, a:b], color_method)
                piece[a:b] = uint8_frames(fixed, geometry, b - a)
        pieces[j] = piece
        del y, ref
    with _stage(timings, "gather_s", dev):
        empty = torch.empty((0, out_h, out_w, 3), dtype=torch.uint8, device=dev)
        return vae_shard.gather_pieces(parallel, dec, counts, pieces, empty)
