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
Weights are counted by the caller (what the engine already holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import RequestError

GIB = 1024**3
HEADROOM = 0.90  # of the free memory: the allocator's fragmentation and the kernels' workspaces
ENCODE_BYTES_PER_PIXEL = 10_000  # bf16; scaled by the VAE dtype's width
DECODE_BYTES_PER_PIXEL = 17_000


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


def batch_memory(config, frames: int, height: int, width: int, in_height: int, in_width: int, act_bytes: int,
                 vae_act_bytes: int, world: int = 1) -> BatchMemory:
    tokens = latent_frames(frames) * (height // 16) * (width // 16)
    per_rank = -(-tokens // world) * (11 if world > 1 else 10) // 10
    padded = ((frames - 1 + 3) // 4) * 4 + 1
    video = 3 * padded * height * width * vae_act_bytes  # the model-size input, alive until the colour fix
    pixels = height * width
    vae_scale = vae_act_bytes / 2
    return BatchMemory(
        frames=frames,
        dit=per_rank * dit_token_bytes(config, act_bytes) + dit_chunk_bytes(config, act_bytes) + video,
        encode=int(ENCODE_BYTES_PER_PIXEL * vae_scale * pixels) + video,
        decode=int(DECODE_BYTES_PER_PIXEL * vae_scale * pixels) + 2 * video + frames * pixels * 3,
    )


def largest_batch(config, total_frames: int, height: int, width: int, in_height: int, in_width: int,
                  act_bytes: int, vae_act_bytes: int, free_bytes: int, world: int = 1) -> int:
    """The largest 4n+1 batch (<= the padded video) that fits `free_bytes`, or 0 when not even one frame fits."""
    budget = free_bytes * HEADROOM
    cap = ((max(total_frames, 1) - 1 + 3) // 4) * 4 + 1
    best = 0
    for frames in range(1, cap + 1, 4):
        if batch_memory(config, frames, height, width, in_height, in_width, act_bytes, vae_act_bytes,
                        world).peak > budget:
            break
        best = frames
    return best


def check_fits(config, batch_frames: int, total_frames: int, height: int, width: int, in_height: int, in_width: int,
               act_bytes: int, vae_act_bytes: int, free_bytes: int | None, world: int = 1) -> int:
    """The batch to use: `batch_frames` (0 = the largest that fits). Raises a RequestError before any work when the
    asked batch, or even one frame, does not fit; the message names the largest batch that does."""
    if free_bytes is None:  # CPU: no reliable budget to check against; auto = the whole video in one batch
        return batch_frames or ((max(total_frames, 1) - 1 + 3) // 4) * 4 + 1
    best = largest_batch(config, total_frames, height, width, in_height, in_width, act_bytes, vae_act_bytes,
                         free_bytes, world)
    if best == 0:
        need = batch_memory(config, 1, height, width, in_height, in_width, act_bytes, vae_act_bytes, world).peak
        raise RequestError(
            f"An output of {width}x{height} needs ~{need / GIB:.1f} GiB for a single frame, more than the "
            f"{free_bytes / GIB:.1f} GiB free on this GPU; choose a smaller scale or more GPUs (sp_degree).")
    if batch_frames and batch_frames > best:
        raise RequestError(
            f"A batch of {batch_frames} frames at {width}x{height} needs ~"
            f"{batch_memory(config, batch_frames, height, width, in_height, in_width, act_bytes, vae_act_bytes, world).peak / GIB:.1f}"
            f" GiB, more than the {free_bytes / GIB:.1f} GiB free; the largest batch that fits is {best} frames "
            "(or set batch frames to 0 for auto).")
    return batch_frames or best
