"""How much device memory one SeedVR2 batch needs, and the largest batch that fits: checked before any work starts, so
a scale or batch too large for the GPU is a clear request error naming what fits instead of an out-of-memory crash
half-way through a long video.

The model is per stage, in bytes, calibrated on one H200 (bench/seedvr2.py pipeline, 3B, bf16, 241 frames of
1344x768 at x2 = 983,808 tokens: DiT 61.0 GiB peak with 6.6 GiB of weights, VAE encode 45.8 GiB, decode 79.0 GiB
peak, docs/BENCHMARKS.md) with ~15 % margin:
- DiT: tokens on this rank (window SP divides them; LPT balance adds <= 10 %) x per-token bytes: the residual rows
  (dim), q, k, v and the attention output (4 x heads x head_dim), the shape group's gathered q/k/v/out copies (4 x
  heads x head_dim) and the group's fp32 RoPE temporaries of q and k; the per-token MLP work is row-chunked
  (`chunk_rows`), so its hidden pair is a constant, not per token. Measured 58 KB/token, modelled 66.5 KB.
- VAE encode / decode: per output pixel of one temporal slice (encode: 1 + 4 frames, decode: 1 latent frame = 4
  frames, the causal conv memory included); measured ~7.9 / ~15.6 KB per pixel in bf16 besides the video tensors
  below, modelled 10 / 17 KB.
- The batch's whole video tensors that stay alive across the stages: the model-size input ([3, F', H, W] in the VAE
  dtype, held until the colour fix), the decoded output (same) and the uint8 result ([F, H, W, 3]).
- With a VAE tile (`vae_tile`, models/seedvr2/vae_tiling.py) the per-pixel VAE bytes count the tile, not the frame,
  plus what tiling keeps whole: the latent-grid features (512 channels at H/8 x W/8 per latent frame, VAE dtype),
  the fp32 band a row of tiles is blended in (decode: 3 x F' x tile x W; encode: 512 x T x tile/8 x W/8) and the
  whole-frame latent-grid work of one time slice (mid block; counted per output pixel).
Weights are counted by the caller (what the engine already holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import RequestError
from .request import MIN_VAE_TILE

GIB = 1024**3
HEADROOM = 0.90  # of the free memory: the allocator's fragmentation and the kernels' workspaces
ENCODE_BYTES_PER_PIXEL = 10_000  # bf16; scaled by the VAE dtype's width
DECODE_BYTES_PER_PIXEL = 17_000
# One set of the causal convs' carried frames (2 per 3x3x3 conv, mostly the full-resolution ones), bf16: ~31 GiB at
# 2688x1536 by the decoder's channel counts (estimated; the 2-GPU whole-upscale run is still to be measured).
CARRY_BYTES_PER_PIXEL = 7_500
LATENT_GRID_BYTES_PER_PIXEL = 600  # bf16: a tiled pass's whole-frame latent-grid work (mid block, carried frames)
VAE_GRID_CHANNELS = 512  # the released VAE's channels at the latent grid (what tiling keeps whole)
VAE_TILE_STEP = 64  # the largest tile that fits is searched in steps of this many pixels
AUTO_TILED_BATCH = 21  # with batch frames on auto, a suggested VAE tile fits a batch of up to this many frames


def padded_frames(frames: int) -> int:
    """`frames` padded to 4n+1 (at least 1)."""
    return ((max(frames, 1) - 1 + 3) // 4) * 4 + 1


def latent_frames(frames: int) -> int:
    """Latent frames of `frames` video frames (padded to 4n+1 first)."""
    return (frames - 1 + 3) // 4 + 1


def dit_token_bytes(config, act_bytes: int) -> int:
    """Peak bytes one video token costs inside a DiT block (see the module docstring)."""
    inner = config.heads * config.head_dim
    return act_bytes * (config.dim + 8 * inner) + 4 * 2 * inner


def dit_chunk_bytes(config, act_bytes: int, chunk_rows: int = 16384) -> int:
    """The row-chunked per-token work's temporaries (MLP hidden pair and its input), independent of the length."""
    return act_bytes * chunk_rows * (3 * config.mlp_hidden + 2 * config.dim)


@dataclass(frozen=True)
class BatchMemory:
    """Bytes of each stage for a batch of `frames` frames restored at `height` x `width` (multiples of 16)."""

    frames: int
    dit: int
    encode: int
    decode: int

    @property
    def peak(self) -> int:
        return max(self.dit, self.encode, self.decode)


def vae_tiled(height: int, width: int, vae_tile: int) -> bool:
    """Whether a VAE tile of `vae_tile` px cuts a `height` x `width` frame (a tile covering it runs the plain pass)."""
    return bool(vae_tile) and vae_tile < max(height, width)


def vae_bytes(frames: int, height: int, width: int, vae_act_bytes: int, vae_tile: int = 0) -> tuple[int, int]:
    """(encode, decode) bytes of the VAE's own work for a batch (the video tensors of batch_memory not included)."""
    scale = vae_act_bytes / 2
    if not vae_tiled(height, width, vae_tile):
        pixels = height * width
        return int(ENCODE_BYTES_PER_PIXEL * scale * pixels), int(DECODE_BYTES_PER_PIXEL * scale * pixels)
    th, tw = min(vae_tile, height), min(vae_tile, width)
    t_lat = latent_frames(frames)
    padded = (t_lat - 1) * 4 + 1
    grid = VAE_GRID_CHANNELS * t_lat * (height // 8) * (width // 8) * vae_act_bytes  # latent-grid features
    whole = int(LATENT_GRID_BYTES_PER_PIXEL * scale * height * width) + grid
    encode = int(ENCODE_BYTES_PER_PIXEL * scale * th * tw) + whole + VAE_GRID_CHANNELS * t_lat * (th // 8) * (
        width // 8) * 4
    decode = int(DECODE_BYTES_PER_PIXEL * scale * th * tw) + whole + 3 * padded * th * width * 4
    return encode, decode


def batch_memory(config, frames: int, height: int, width: int, in_height: int, in_width: int, act_bytes: int,
                 vae_act_bytes: int, world: int = 1, vae_tile: int = 0) -> BatchMemory:
    tokens = latent_frames(frames) * (height // 16) * (width // 16)
    per_rank = -(-tokens // world) * (11 if world > 1 else 10) // 10
    padded = ((frames - 1 + 3) // 4) * 4 + 1
    # The model-size input, alive until the colour fix; with several ranks each holds only its own time slices'
    # frames (and decodes only those), while rank 0 receives the whole uint8 result.
    video = -(-3 * padded * height * width * vae_act_bytes // world)
    encode, decode = vae_bytes(frames, height, width, vae_act_bytes, vae_tile)
    if world > 1:  # a rank also holds the carried frames it sends on and (rank 0) its next round's heads
        carry = int(CARRY_BYTES_PER_PIXEL * vae_act_bytes / 2 * height * width)
        encode, decode = encode + carry, decode + carry
    return BatchMemory(
        frames=frames,
        dit=per_rank * dit_token_bytes(config, act_bytes) + dit_chunk_bytes(config, act_bytes) + video,
        encode=encode + video,
        decode=decode + 2 * video + frames * height * width * 3,
    )


def largest_batch(config, total_frames: int, height: int, width: int, in_height: int, in_width: int,
                  act_bytes: int, vae_act_bytes: int, free_bytes: int, world: int = 1, vae_tile: int = 0) -> int:
    """The largest 4n+1 batch (<= the padded video) that fits `free_bytes`, or 0 when not even one frame fits."""
    budget = free_bytes * HEADROOM
    cap = ((max(total_frames, 1) - 1 + 3) // 4) * 4 + 1
    best = 0
    for frames in range(1, cap + 1, 4):
        if batch_memory(config, frames, height, width, in_height, in_width, act_bytes, vae_act_bytes,
                        world, vae_tile).peak > budget:
            break
        best = frames
    return best


def largest_vae_tile(frames: int, height: int, width: int, vae_act_bytes: int, budget: float) -> int:
    """The largest VAE tile (a multiple of VAE_TILE_STEP px, at least MIN_VAE_TILE, that cuts the frame) whose encode
    and decode of a batch of `frames` fit `budget` bytes with the batch's video tensors, or 0 when none does."""
    padded = ((frames - 1 + 3) // 4) * 4 + 1
    video = 3 * padded * height * width * vae_act_bytes
    tensors = max(video, 2 * video + frames * height * width * 3)
    tile = (max(height, width) - 1) // VAE_TILE_STEP * VAE_TILE_STEP
    while tile >= MIN_VAE_TILE:
        if max(vae_bytes(frames, height, width, vae_act_bytes, tile)) + tensors <= budget:
            return tile
        tile -= VAE_TILE_STEP
    return 0


def check_fits(config, batch_frames: int, total_frames: int, height: int, width: int, in_height: int, in_width: int,
               act_bytes: int, vae_act_bytes: int, free_bytes: int | None, world: int = 1, vae_tile: int = 0) -> int:
    """The batch to use: `batch_frames` (0 = the largest that fits). Raises a RequestError before any work when the
    asked batch, or even one frame, does not fit; the message names the stage that does not fit, the largest batch
    that does and, where the VAE is what does not fit, the largest VAE tile that would."""
    if free_bytes is None:  # CPU: no reliable budget to check against; auto = the whole video in one batch
        return batch_frames or ((max(total_frames, 1) - 1 + 3) // 4) * 4 + 1
    args = (height, width, in_height, in_width, act_bytes, vae_act_bytes)
    best = largest_batch(config, total_frames, *args, free_bytes, world, vae_tile)
    if best and not (batch_frames and batch_frames > best):
        return batch_frames or best
    budget = free_bytes * HEADROOM
    frames = batch_frames if best else 1
    need = batch_memory(config, frames, *args, world, vae_tile)
    stage = max((need.dit, "the DiT"), (need.encode, "the VAE encode"), (need.decode, "the VAE decode"))[1]
    free = f"the {budget / GIB:.1f} GiB usable ({HEADROOM:.0%} of {free_bytes / GIB:.1f} GiB free)"
    if best == 0:
        head = (f"An output of {width}x{height} needs ~{need.peak / GIB:.1f} GiB for a single frame ({stage}), more "
                f"than {free}")
    else:
        head = (f"A batch of {batch_frames} frames at {width}x{height} needs ~{need.peak / GIB:.1f} GiB ({stage}), "
                f"more than {free}; the largest batch that fits is {best} frames (or set batch frames to 0 for auto)")
    tail = []
    if max(need.encode, need.decode) > budget:  # the VAE works on whole frames unless tiled (and on one GPU)
        # the batch a tile is sized for: the one asked (auto: up to AUTO_TILED_BATCH frames), or less if the DiT
        # on one GPU does not fit it
        ask = batch_frames or min(AUTO_TILED_BATCH, padded_frames(total_frames))
        want = next((f for f in range(ask, 0, -4) if batch_memory(config, f, *args, 1).dit <= budget), 0)
        tile = largest_vae_tile(want, height, width, vae_act_bytes, budget) if want else 0
        found = (f"the largest VAE tile that fits a batch of {want} frame{'s' if want > 1 else ''} is vae_tile "
                 f"{tile} (a tiled VAE is close to, not equal to, the whole pass)")
        if world > 1:
            tail.append("more GPUs do not help the VAE stage (each GPU still encodes and decodes whole frames)")
            if tile:
                tail.append("on one GPU (sp_degree 1) " + found)
        elif tile:
            tail.append(found)
    if need.dit > budget:
        tail.append("for the DiT choose a smaller scale or more GPUs (sp_degree)")
    elif not tail and best == 0:
        tail.append("choose a smaller scale")
    raise RequestError(head + ("; " + "; ".join(tail) if tail else "") + ".")
