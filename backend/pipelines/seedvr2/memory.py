"""How much device memory one SeedVR2 batch needs, and the largest batch that fits: checked before any work starts, so
a scale or batch too large for the GPU is a clear request error naming what fits instead of an out-of-memory crash
half-way through a long video.

The model is per stage, in bytes, and deliberately conservative:
- DiT: `tokens x DIT_TOKEN_WIDTHS x activation bytes`, where tokens = latent frames x (H/16) x (W/16) on this rank
  (window SP divides them; LPT balance adds <= 10 %). The widths count what is alive at the peak of a block: the
  residual stream and its normed copy (2 x dim), q, k, v and the attention output (4 x heads x head_dim, plus the
  fp32 RoPE temporaries of q and k), the MLP hidden pair and their product (3 x hidden).
- VAE decode: one temporal slice (the first latent frame, then one latent frame = 4 frames, plus the causal memory
  of 2 frames) at the output size, at the widest full-resolution stage (256 channels), 4 such tensors alive.
- VAE encode: the same at the input (processing) size with 1 + 4 frames per slice.
Weights are counted by the caller (what the engine already holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import RequestError

GIB = 1024**3
HEADROOM = 0.90  # of the free memory: the allocator's fragmentation and the kernels' workspaces
VAE_FULL_RES_CHANNELS = 256
VAE_LIVE_TENSORS = 4


def latent_frames(frames: int) -> int:
    """Latent frames of `frames` video frames (padded to 4n+1 first)."""
    return (frames - 1 + 3) // 4 + 1


def dit_token_bytes(config, act_bytes: int) -> int:
    """Peak bytes one video token costs inside a DiT block (see the module docstring)."""
    inner = config.heads * config.head_dim
    widths = 2 * config.dim + 4 * inner + 3 * config.mlp_hidden
    return act_bytes * widths + 4 * 2 * inner  # + fp32 RoPE copies of q and k


def vae_slice_bytes(height: int, width: int, frames: int, act_bytes: int) -> int:
    return act_bytes * VAE_FULL_RES_CHANNELS * VAE_LIVE_TENSORS * (frames + 2) * height * width


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
    return BatchMemory(
        frames=frames,
        dit=per_rank * dit_token_bytes(config, act_bytes),
        encode=vae_slice_bytes(height, width, 5, vae_act_bytes),  # encode runs at the output size (resized first)
        decode=vae_slice_bytes(height, width, 4, vae_act_bytes),
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
