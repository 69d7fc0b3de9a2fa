"""The video VAE's clip decode with its spatial tiles run as one batch.

diffusers' `AutoencoderKLMiniMaxH3._decode_clip` decodes a clip tile by tile: at 1344x768 that is 4 x 7 = 28 tiles of
256x256 pixels (16x16 latents), each a batch-1 pass of the 36-layer ViT over ~1,800 tokens. Each pass is small
enough to be launch-bound on an H200 (docs/BENCHMARKS.md, "H3 video decode"). The tiles of a clip all have one shape
(`_split_tiles` lays equal tiles and spreads the slack over the overlaps) and the ViT treats batch rows
independently (attention is per row, the register tokens and positions are broadcast), so stacking the tiles along
the batch gives the same tiles in a few large passes; they are then stitched exactly as diffusers stitches them.

Numerics: the same operations on the same values, but the GEMMs see more rows and may pick other kernels / split
sums differently, so the result equals the tile-by-tile decode up to float summation order, not bit for bit
(tests/pipelines/h3/test_h3_tile_batch.py: float32 on the CPU; bench/vae_profile.py h3 measures the uint8 difference
on the GPU).
"""

from __future__ import annotations

import torch

from ...device_memory import cuda_free_bytes

# Activation bytes one tile of 1,797 tokens needs at the released width (the SwiGLU FFN's 16,384-wide bf16 input and
# 8,192-wide output, the float32 residual stream, attention's q/k/v), rounded up: what bounds a batch by free memory.
_BYTES_PER_TOKEN = 2 * 16384 + 2 * 8192 + 4 * 2048 * 3 + 2 * 2048 * 4


def tile_slices(vae, latent_height: int, latent_width: int):
    """The clip's tiles as latent (row slice, column slice) pairs in diffusers' row-major order, and the pixel
    overlaps between neighbouring rows / columns (what `_stitch_tiles` blends)."""
    ratio = vae.spatial_compression_ratio
    ys, hs, y_overlaps = vae._split_tiles(latent_height * ratio, vae.tile_sample_min_height,
                                          vae.tile_sample_min_overlap_height)
    xs, ws, x_overlaps = vae._split_tiles(latent_width * ratio, vae.tile_sample_min_width,
                                          vae.tile_sample_min_overlap_width)
    rows = [slice(y // ratio, y // ratio + h // ratio) for y, h in zip(ys, hs)]
    cols = [slice(x // ratio, x // ratio + w // ratio) for x, w in zip(xs, ws)]
    return rows, cols, y_overlaps, x_overlaps


def max_tiles_per_pass(z: torch.Tensor, tile_tokens: int, limit: int | None = None) -> int:
    """How many tiles one pass may hold: `limit` when given, else what half the device's free memory holds (all of
    them on the CPU)."""
    if limit is not None:
        return max(1, int(limit))
    if z.device.type != "cuda":
        return 1 << 30
    free = cuda_free_bytes(z.device)
    return max(1, int(free // 2 // (tile_tokens * _BYTES_PER_TOKEN)))


def decode_clip_tiles_batched(vae, z: torch.Tensor, max_tiles: int | None = None) -> torch.Tensor:
    """One clip's latents [1, C, t, h, w] (the VAE's dtype, denormalised) -> its decoded clip [1, 3, t', H, W], as
    `vae._decode_clip(z)` computes it, with the spatial tiles decoded `max_tiles` at a time (default: as many as
    half the free device memory holds)."""
    if not vae.use_tiling or z.shape[0] != 1:
        return vae._decode_clip(z)
    rows, cols, y_overlaps, x_overlaps = tile_slices(vae, z.shape[-2], z.shape[-1])
    tiles = [z[..., r, c] for r in rows for c in cols]
    if len(tiles) == 1:
        return vae._decode_clip(z)
    shape = tiles[0].shape
    if any(tile.shape != shape for tile in tiles):  # diffusers' layout gives equal tiles; anything else: as it does
        return vae._decode_clip(z)
    stacked = torch.cat(tiles, dim=0)  # [n, C, t, th, tw], row-major like diffusers' loops
    per_pass = max_tiles_per_pass(z, shape[2] * shape[3] * shape[4] + vae.decoder.num_register_tokens + 1, max_tiles)
    decoded = torch.cat([vae.decoder(vae.post_quant_conv(stacked[k:k + per_pass]))
                         for k in range(0, stacked.shape[0], per_pass)])
    grid = [[decoded[i * len(cols) + j:i * len(cols) + j + 1] for j in range(len(cols))] for i in range(len(rows))]
    return vae._stitch_tiles(grid, y_overlaps, x_overlaps)
