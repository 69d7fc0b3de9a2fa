"""How much memory one SeedVR2 batch needs, and the largest batch that fits: checked before any work starts, where the
work runs (the GPU's memory for a GPU engine, the host's for a CPU engine; the host's for the frame sink in both), so
a scale or batch too large is a clear request error naming what fits (the largest batch, or the largest output size)
instead of an out-of-memory crash (or a swapping host) half-way through a long video.

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
- The VAE's per-pixel bytes are the released VAE's (128 channels at full resolution); a narrower VAE (the package's
  tiny one) scales them by its width (`vae_scale`).
- Host (`sink_bytes_per_pixel`): a streamed file holds the StreamingVideoSaver's two slots of 16 uint8 frames and the
  x264 encoder's frames in flight (90 B per pixel measured at 1080p and 2160p with 3 threads, veryfast; more cores
  run more frame threads: modelled 256); a result returned in memory holds every frame twice at its end (the chunks
  and their concatenation). On a CPU engine the batch itself lives there too, the ranks sharing the host.
Weights are counted by the caller (what the engine already holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import RequestError
from .batches import latent_frames, padded_frames  # the one frame rule
from .options import MIN_BATCH_FRAMES, MIN_VAE_TILE

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
RELEASED_VAE_CHANNELS = 128  # the released VAE's full-resolution channels, what the per-pixel bytes were measured on
SINK_SLOT_FRAMES = 2 * 16  # StreamingVideoSaver: 2 slots of DEFAULT_CHUNK_FRAMES uint8 frames
ENCODER_BYTES_PER_PIXEL = 256  # x264's frames in flight (see the module docstring)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / 2**20:.0f} MiB"


def vae_scale(vae_config) -> float:
    """A VAE's activation width against the released one's (the per-pixel VAE bytes above are the released VAE's)."""
    return vae_config.block_channels[0] / RELEASED_VAE_CHANNELS


def sink_bytes_per_pixel(total_frames: int, streamed: bool) -> int:
    """Host bytes per output pixel the driver's frame sink holds (see the module docstring)."""
    return 3 * SINK_SLOT_FRAMES + ENCODER_BYTES_PER_PIXEL if streamed else 2 * 3 * int(total_frames)


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


def split_tiles(vae_tile) -> tuple[int, int]:
    """A VAE tile setting -> (encode tile, decode tile): one number is both; 0 is whole frames."""
    if isinstance(vae_tile, (tuple, list)):
        encode, decode = vae_tile
        return int(encode or 0), int(decode or 0)
    return int(vae_tile or 0), int(vae_tile or 0)


def vae_bytes(frames: int, height: int, width: int, vae_act_bytes: int, vae_tile=0,
              width_scale: float = 1.0) -> tuple[int, int]:
    """(encode, decode) bytes of the VAE's own work for a batch (the video tensors of batch_memory not included);
    `vae_tile`: a tile for both, or (encode tile, decode tile) (split_tiles); `width_scale`: vae_scale of the
    VAE."""
    encode_tile, decode_tile = split_tiles(vae_tile)
    if encode_tile != decode_tile:
        return (vae_bytes(frames, height, width, vae_act_bytes, encode_tile, width_scale)[0],
                vae_bytes(frames, height, width, vae_act_bytes, decode_tile, width_scale)[1])
    vae_tile = encode_tile
    scale = vae_act_bytes / 2 * width_scale
    if not vae_tiled(height, width, vae_tile):
        pixels = height * width
        return int(ENCODE_BYTES_PER_PIXEL * scale * pixels), int(DECODE_BYTES_PER_PIXEL * scale * pixels)
    th, tw = min(vae_tile, height), min(vae_tile, width)
    t_lat = latent_frames(frames)
    padded = (t_lat - 1) * 4 + 1
    channels = max(1, int(VAE_GRID_CHANNELS * width_scale))
    grid = channels * t_lat * (height // 8) * (width // 8) * vae_act_bytes  # latent-grid features
    whole = int(LATENT_GRID_BYTES_PER_PIXEL * scale * height * width) + grid
    encode = int(ENCODE_BYTES_PER_PIXEL * scale * th * tw) + whole + channels * t_lat * (th // 8) * (width // 8) * 4
    decode = int(DECODE_BYTES_PER_PIXEL * scale * th * tw) + whole + 3 * padded * th * width * 4
    return encode, decode


def video_tensor_bytes(frames: int, height: int, width: int, vae_act_bytes: int, world: int = 1) -> tuple[int, int]:
    """(encode, decode) bytes of the batch's whole video tensors that stay alive across the stages (the module
    docstring): the model-size input, and at decode also the decoded output and the uint8 result. With several ranks
    each holds only its own time slices' frames (and decodes only those), while rank 0 receives the whole result."""
    video = -(-3 * padded_frames(frames) * height * width * vae_act_bytes // world)
    return video, 2 * video + frames * height * width * 3


def batch_memory(config, frames: int, height: int, width: int, in_height: int, in_width: int, act_bytes: int,
                 vae_act_bytes: int, world: int = 1, vae_tile=0, *, vae_scale: float = 1.0, dit_weights: int = 0,
                 vae_weights: int = 0) -> BatchMemory:
    """`dit_weights` / `vae_weights`: weight bytes a stage brings to the device beside its activations (the offload
    placement's streaming slots or resident blocks, the VAE it moves in); 0 where the weights stay resident (the
    caller counts those)."""
    tokens = latent_frames(frames) * (height // 16) * (width // 16)
    per_rank = -(-tokens // world) * (11 if world > 1 else 10) // 10
    video, decoded = video_tensor_bytes(frames, height, width, vae_act_bytes, world)
    encode, decode = vae_bytes(frames, height, width, vae_act_bytes, vae_tile, vae_scale)
    if world > 1:  # a rank also holds the carried frames it sends on and (rank 0) its next round's heads
        carry = int(CARRY_BYTES_PER_PIXEL * vae_act_bytes / 2 * vae_scale * height * width)
        encode, decode = encode + carry, decode + carry
    return BatchMemory(
        frames=frames,
        dit=per_rank * dit_token_bytes(config, act_bytes) + dit_chunk_bytes(config, act_bytes) + video + dit_weights,
        encode=encode + video + vae_weights,
        decode=decode + decoded + vae_weights,
    )


def largest_batch(config, total_frames: int, height: int, width: int, in_height: int, in_width: int,
                  act_bytes: int, vae_act_bytes: int, free_bytes: int, world: int = 1, vae_tile=0, *,
                  vae_scale: float = 1.0, reserved: int = 0, dit_weights: int = 0, vae_weights: int = 0) -> int:
    """The largest 4n+1 batch (<= the padded video) that fits `free_bytes` besides `reserved` bytes, or 0 when none
    does (a video of several frames needs batches of at least MIN_BATCH_FRAMES)."""
    budget = free_bytes * HEADROOM - reserved
    cap = padded_frames(total_frames)
    best = 0
    for frames in range(1, cap + 1, 4):
        if batch_memory(config, frames, height, width, in_height, in_width, act_bytes, vae_act_bytes,
                        world, vae_tile, vae_scale=vae_scale, dit_weights=dit_weights,
                        vae_weights=vae_weights).peak > budget:
            break
        best = frames
    return 0 if best < MIN_BATCH_FRAMES and total_frames > best else best


def largest_output(height: int, width: int, fits) -> tuple[int, int]:
    """The largest (width, height) of the aspect of `width` x `height`, multiples of 16 and at most it, for which
    `fits(height, width)` holds, or (0, 0) when not even 16 px does (the memory grows with the size: bisection)."""
    def size(s: float) -> tuple[int, int]:
        return max(16, int(height * s) // 16 * 16), max(16, int(width * s) // 16 * 16)

    if not fits(*size(16 / min(height, width))):
        return 0, 0
    lo, hi = 16 / min(height, width), 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(*size(mid)) else (lo, mid)
    h, w = size(lo)
    return w, h


def largest_vae_tile(frames: int, height: int, width: int, vae_act_bytes: int, budget: float,
                     vae_scale: float = 1.0, stage: str = "both", vae_weights: int = 0) -> int:
    """The largest VAE tile (a multiple of VAE_TILE_STEP px, at least MIN_VAE_TILE, that cuts the frame) whose
    `stage` ("encode", "decode" or "both") of a batch of `frames` fits `budget` bytes with the batch's video tensors
    (and `vae_weights`), or 0 when none does."""
    tensors = video_tensor_bytes(frames, height, width, vae_act_bytes)
    tile = (max(height, width) - 1) // VAE_TILE_STEP * VAE_TILE_STEP
    while tile >= MIN_VAE_TILE:
        need = [a + b for a, b in zip(vae_bytes(frames, height, width, vae_act_bytes, tile, vae_scale), tensors)]
        if {"encode": need[0], "decode": need[1]}.get(stage, max(need)) + vae_weights <= budget:
            return tile
        tile -= VAE_TILE_STEP
    return 0


def check_fits(config, batch_frames: int, total_frames: int, height: int, width: int, in_height: int, in_width: int,
               act_bytes: int, vae_act_bytes: int, free_bytes: int | None, world: int = 1, vae_tile=0, *,
               vae_scale: float = 1.0, reserved_per_pixel: float = 0, where: str = "on the GPU",
               dit_weights: int = 0, vae_weights: int = 0) -> int:
    """The batch to use: `batch_frames` (0 = the largest that fits). Raises a RequestError before any work when the
    asked batch, or even the smallest, does not fit `free_bytes` (`where`: the memory it is, for the message) besides
    `reserved_per_pixel` bytes per output pixel held there anyway (a CPU engine's frame sink); the message names the
    stage that does not fit, the largest batch that does, where the VAE is what does not fit the largest VAE tile
    that would, and where no batch fits the largest output size that does. `free_bytes` None: nothing is known to
    check against (a platform that reports no free memory): the asked batch, auto = the whole video.
    `dit_weights` / `vae_weights`: batch_memory's."""
    if free_bytes is None:
        return batch_frames or padded_frames(total_frames)
    args = (height, width, in_height, in_width, act_bytes, vae_act_bytes)
    weights = dict(dit_weights=dit_weights, vae_weights=vae_weights)
    reserved = int(reserved_per_pixel * height * width)
    best = largest_batch(config, total_frames, *args, free_bytes, world, vae_tile, vae_scale=vae_scale,
                         reserved=reserved, **weights)
    if best and not (batch_frames and batch_frames > best):
        return batch_frames or best
    budget = free_bytes * HEADROOM - reserved
    smallest = 1 if total_frames <= 1 else MIN_BATCH_FRAMES
    frames = batch_frames if best else min(batch_frames or smallest, smallest)
    need = batch_memory(config, frames, *args, world, vae_tile, vae_scale=vae_scale, **weights)
    stage = max((need.dit, "the DiT"), (need.encode, "the VAE encode"), (need.decode, "the VAE decode"))[1]
    held = f", less ~{_size(reserved)} for the output's frame sink" if reserved else ""
    free = f"the {_size(max(budget, 0))} usable {where} ({HEADROOM:.0%} of {_size(free_bytes)} free{held})"
    if best == 0:
        what = "a single frame" if frames == 1 else f"{frames} frames, the smallest batch"
        head = f"An output of {width}x{height} needs ~{_size(need.peak)} for {what} ({stage}), more than {free}"
    else:
        head = (f"A batch of {batch_frames} frames at {width}x{height} needs ~{_size(need.peak)} ({stage}), more "
                f"than {free}; the largest batch that fits is {best} frames (or set batch frames to 0 for auto)")
    tail = []
    if max(need.encode, need.decode) > budget:  # the VAE works on whole frames unless tiled (and on one GPU)
        # the batch a tile is sized for: the one asked (auto: up to AUTO_TILED_BATCH frames), or less if the DiT
        # on one GPU does not fit it
        ask = batch_frames or min(AUTO_TILED_BATCH, padded_frames(total_frames))
        want = next((f for f in range(ask, 0, -4) if batch_memory(config, f, *args, 1, **weights).dit <= budget), 0)
        tile = largest_vae_tile(want, height, width, vae_act_bytes, budget, vae_scale,
                                vae_weights=vae_weights) if want else 0
        found = (f"the largest VAE tile that fits a batch of {want} frame{'s' if want > 1 else ''} is vae_tile "
                 f"{tile} (a tiled VAE is close to, not equal to, the whole pass)")
        if world > 1:
            unit = "GPU" if where == "on the GPU" else "rank"
            tail.append(f"more {unit}s do not help the VAE stage (each {unit} still encodes and decodes whole "
                        "frames)")
            if tile:
                tail.append(f"on one {unit} (sp_degree 1) " + found)
        elif tile:
            tail.append(found)
    if best == 0:
        def fits(h: int, w: int) -> bool:
            peak = batch_memory(config, frames, h, w, in_height, in_width, act_bytes, vae_act_bytes, world,
                                vae_tile, vae_scale=vae_scale, **weights).peak
            return peak + reserved_per_pixel * h * w <= free_bytes * HEADROOM

        w, h = largest_output(height, width, fits)
        tail.append(f"the largest output of this aspect that fits is {w}x{h}" if w else
                    "not even a 16-pixel output fits: free memory or use a smaller model")
    if need.dit > budget and where == "on the GPU":
        tail.append("for the DiT choose a smaller scale or more GPUs (sp_degree)")
    raise RequestError(head + ("; " + "; ".join(tail) if tail else "") + ".")


@dataclass(frozen=True)
class MemoryPlan:
    """What the memory check chose for a request: the batch, the VAE tiles ((0, 0): whole frames) and whether they
    were chosen here (`auto_tiles`) rather than asked for."""

    batch: int
    vae_tiles: tuple[int, int]
    auto_tiles: bool = False


def plan_memory(config, batch_frames: int, total_frames: int, height: int, width: int, in_height: int,
                in_width: int, act_bytes: int, vae_act_bytes: int, free_bytes: int | None, world: int = 1,
                vae_tile: int = 0, *, auto_tiles: bool = True, **model) -> MemoryPlan:
    """The batch and VAE tiles of a request (`model`: check_fits's keyword arguments). An asked tile is checked as
    it is (check_fits). With `vae_tile` 0, whole frames when the asked batch (auto: the largest batch of at least
    MIN_BATCH_FRAMES) fits them; otherwise, on one rank and with `auto_tiles`, the largest batch the DiT fits (the
    asked one, or auto's) with the largest encode tile and the largest decode tile that fit it, each sized for its
    own stage. When neither fits, check_fits's RequestError, naming what would."""
    args = (config, batch_frames, total_frames, height, width, in_height, in_width, act_bytes, vae_act_bytes,
            free_bytes, world)
    if vae_tile:
        return MemoryPlan(check_fits(*args, vae_tile, **model), (vae_tile, vae_tile))
    try:
        return MemoryPlan(check_fits(*args, 0, **model), (0, 0))
    except RequestError as refusal:
        if not auto_tiles or world > 1 or free_bytes is None:
            raise
        tiled = _tiled_plan(*args[:10], **model)
        if tiled is None:
            raise refusal from None
        return tiled


def _tiled_plan(config, batch_frames, total_frames, height, width, in_height, in_width, act_bytes, vae_act_bytes,
                free_bytes, *, vae_scale: float = 1.0, reserved_per_pixel: float = 0, where: str = "",
                dit_weights: int = 0, vae_weights: int = 0) -> MemoryPlan | None:
    """plan_memory's tiled choice, or None when no batch the DiT fits has tiles that fit."""
    budget = free_bytes * HEADROOM - int(reserved_per_pixel * height * width)
    cap = padded_frames(total_frames)
    smallest = 1 if total_frames <= 1 else MIN_BATCH_FRAMES
    candidates = [batch_frames] if batch_frames else range(cap - (cap - 1) % 4, smallest - 1, -4)
    args = (height, width, in_height, in_width, act_bytes, vae_act_bytes)
    for frames in candidates:
        if batch_memory(config, frames, *args, dit_weights=dit_weights).dit > budget:
            continue
        tiles = tuple(largest_vae_tile(frames, height, width, vae_act_bytes, budget, vae_scale, stage, vae_weights)
                      for stage in ("encode", "decode"))
        if all(tiles) and batch_memory(config, frames, *args, 1, tiles, vae_scale=vae_scale, dit_weights=dit_weights,
                                       vae_weights=vae_weights).peak <= budget:
            return MemoryPlan(frames, tiles, auto_tiles=True)
    return None


def check_host(height: int, width: int, per_pixel: float, free_bytes: int | None, what: str) -> None:
    """RequestError before any work when `per_pixel` bytes per output pixel (what the frame sink holds on the host,
    `what` in words) do not fit the host's `free_bytes` (None: unknown, no check); names the largest output that
    does."""
    need = per_pixel * height * width
    if free_bytes is None or need <= free_bytes * HEADROOM:
        return
    w, h = largest_output(height, width, lambda hh, ww: per_pixel * hh * ww <= free_bytes * HEADROOM)
    largest = f"the largest output of this aspect that fits is {w}x{h}" if w else "free host memory"
    raise RequestError(f"An output of {width}x{height} needs ~{_size(need)} of host memory for {what}, more than the "
                       f"{_size(free_bytes * HEADROOM)} usable ({HEADROOM:.0%} of {_size(free_bytes)} free on the "
                       f"host); {largest}.")
