"""SeedVR2's user-facing options, each declared once (backend/options.py): SeedVR2 Upscale's inputs (in this order:
the saved widget order; new ones go at the end, optional) and `python -m comfyui_h3 upscale`'s flags are made from
these, and UpscaleRequest.validate checks each request field with its option's rule. A new colour-fix mode is one
entry in colorfix.METHODS; a new option is one Option here (and its UpscaleRequest field, where the worker reads
it)."""

from __future__ import annotations

from ...options import SEED, Option, OptionTable, resident_blocks_option
from .colorfix import METHODS

COLOR_FIXES = METHODS  # the modes by name (read when a list is made: a mode added there shows everywhere)
VAE_TILE_STATS = ("frame", "tile")  # a tiled VAE's GroupNorm statistics: the frame's (2 passes) or each tile's own
EDGE_MODES = ("pad", "crop")  # making the size a multiple of 16: replicate-pad (cropped back after) or centre-crop
TARGETS = ("scale", "short side", "width x height")
MIN_SCALE, MAX_SCALE = 0.25, 8.0
MIN_SIDE, MAX_SIDE = 16, 8192
MIN_VAE_TILE = 128  # px; smaller tiles see too little of the frame (and a tile this small always fits)
MIN_BATCH_FRAMES = 5  # several batches need a latent frame of history besides the first; one frame is auto's anyway
MAX_BATCH_FRAMES = 4097
MAX_OVERLAP = 64


WEIGHT_FORMATS = {"bf16": "compute", "fp8": "fp8"}  # the 'weights' option -> WeightPolicy.storage
RELEASE_BLOCKS = 36  # the 7B DiT's blocks (the 3B has 32): the resident_blocks choices go up to it


def batch_frames_rule(value) -> str | None:
    """0 (auto: as many as fit) or 4n+1 from MIN_BATCH_FRAMES, whatever the video's length (the range is the
    option's); the sentence names the nearest sizes allowed."""
    value = int(value)
    if value == 0 or value % 4 == 1 and value >= MIN_BATCH_FRAMES:
        return None
    if value < MIN_BATCH_FRAMES:
        hint = f"0 for auto or {MIN_BATCH_FRAMES} (a single image is one batch either way)"
    else:
        lower = value - (value - 1) % 4
        hint = f"{lower} or {lower + 4}"
    return (f"Batch frames must be 4n+1 from {MIN_BATCH_FRAMES} to {MAX_BATCH_FRAMES} ({MIN_BATCH_FRAMES}, 9, 13, "
            f"17, 21, ...) or 0 for auto, got {value}: use {hint}.")


def vae_tile_rule(value) -> str | None:
    if value == 0 or (value >= MIN_VAE_TILE and value % 8 == 0):
        return None
    return f"VAE tile {value} must be 0 (auto) or a multiple of 8 from {MIN_VAE_TILE} to {MAX_SIDE} pixels."


def _side(name: str, default: int, tooltip: str, message: str, flag: str | None = "") -> Option:
    return Option(name, "int", default, tooltip, minimum=MIN_SIDE, maximum=MAX_SIDE, step=2, message=message,
                  flag=flag)


UPSCALE = OptionTable(
    Option("target", "choice", "scale", choices=TARGETS, stage="node", flag=None, tooltip=(
        "How the output size is given: scale (x the input), short side (pixels of the shorter side, aspect kept) or "
        "width x height (stretched to it). The other size widgets are ignored.")),
    Option("scale", "float", 2.0, "target scale: output size = input size x this.", minimum=MIN_SCALE,
           maximum=MAX_SCALE, step=0.05, help="Output size = input size x this (default 2).",
           message="Scale {value} is out of range; use a value in {range}."),
    _side("short_side", 1080, "target short side: the output's shorter side in pixels.",
          "Short side {value} is out of range; use {range} pixels."),
    _side("width", 1920, "target width x height: the output width in pixels.",
          "Target width {value} is out of range; use {range} pixels.", flag=None),  # the CLI's --size WxH
    _side("height", 1080, "target width x height: the output height in pixels.",
          "Target height {value} is out of range; use {range} pixels.", flag=None),
    Option("batch_frames", "int", 0, minimum=0, maximum=MAX_BATCH_FRAMES, rule=batch_frames_rule,
           message="Batch frames must be 0 (auto) or 4n+1 from 5 to {maximum}, got {value}: use 0 for auto, or up to "
                   "{maximum}.",
           tooltip="Frames restored together: 0 = auto (as many as fit in memory), or 4n+1 from 5 (5, 9, 13, 17, 21, "
                   "...). Below 17 the frames of a batch no longer attend to each other in time (more flicker)."),
    Option("overlap", "int", 8, minimum=0, maximum=MAX_OVERLAP,
           message="Overlap {value} must be in {range} frames (and smaller than the batch).",
           tooltip="Frames shared by consecutive batches, cross-faded so the seams do not show (a multiple of 4 "
                   "aligns with the latent frames). Must be smaller than batch_frames."),
    Option("color_fix", "choice", "wavelet", choices=COLOR_FIXES, message="Colour fix {value!r} is not {range}.", tooltip=(
               "Colour correction toward the input: wavelet (the official one: the input's low frequencies, the "
               "model's details), adain (per-channel mean/std), lab (colour channels matched in Lab), none.")),
    SEED.with_(tooltip="Noise of the one diffusion step; same seed and settings -> the same result.",
               message="Seed {value} must be in 0..2^64-1."),
    Option("edge", "choice", "pad", choices=EDGE_MODES, message="Edge mode {value!r} is not {range}.", help="Reaching a multiple of 16 px: pad the edges (cropped back after) or "
           "crop them.", tooltip=(
               "The model works on multiples of 16 px. pad: extend the edges, run, crop back (the exact size, nothing "
               "lost). crop: cut the few border pixels instead.")),
    Option("fps", "float", 24.0, "Frame rate of the output for images; a connected video keeps its own.",
           minimum=0.01, maximum=240.0, step=0.001, stage="node", node="optional", flag=None),
    Option("vae_tile", "int", 0, minimum=0, maximum=MAX_SIDE, step=8, rule=vae_tile_rule, node="optional",
           message="VAE tile {value} must be 0 (auto) or a multiple of 8 from 128 to {maximum} pixels.",
           help="VAE encode/decode in tiles of at most N pixels a side (a multiple of 8, >= 128; one GPU): close to, "
                "not equal to, the whole pass. 0 (auto): whole frames when they fit the GPU, else on one GPU the "
                "largest encode and decode tiles that fit, chosen before any work (the manifest names them).",
           tooltip="0 = auto: whole frames when they fit the GPU; when they do not (e.g. 1080p or 4K on a 12-24 GB "
                   "card), on one GPU the VAE encodes and decodes in the largest overlapping tiles that fit, encode "
                   "and decode sized apart, chosen before any work. A number: tiles of at most this many pixels a "
                   "side (a multiple of 8, at least 128; one GPU only). Tiles are close to, not equal to, the "
                   "whole-frame result, and slower."),
    Option("scene_cuts", "bool", True, node="optional",
           help="Keep hard cuts: no batch spans a cut and no cross-fade blends two shots (cuts found from frame "
                "differences before any work). --no-scene-cuts batches the clip as one shot.",
           tooltip="On: hard cuts in the video are found (from frame differences, before any work) and kept: no "
                   "batch spans a cut and no cross-fade blends two shots. Off: the clip is batched as one shot. A "
                   "clip without cuts is the same either way."),
    Option("vae_tile_stats", "choice", "frame", choices=VAE_TILE_STATS, node="optional",
           message="VAE tile statistics {value!r} is not {range}.",
           help="Where the VAE runs in tiles: frame (the frame's GroupNorm statistics from a first pass over the "
                "tiles: closest to whole frames, about twice the VAE time) or tile (each tile's own: one pass, a "
                "larger error).",
           tooltip="Only where the VAE runs in tiles (vae_tile, or auto on a small card). frame: each GroupNorm "
                   "uses the whole frame's statistics, taken in a first pass over the tiles: the closest to the "
                   "whole-frame result, about twice the VAE time. tile: each tile's own statistics: one pass, "
                   "faster, a larger difference from whole frames."),
    label="SeedVR2 Upscale's {name}",
)

# How the engine runs: SeedVR2 Model Loader's appended inputs and `upscale`'s engine flags
# (family.seedvr2_engine_config is the one builder of the weight policy from them).
ENGINE = OptionTable(
    Option("weights", "choice", "bf16", choices=tuple(WEIGHT_FORMATS), stage="engine", node="optional",
           flag=None, tooltip=(  # CLI: --fp8
               "bf16: the DiT's weights in the dtype above (an fp8 file is cast up). fp8: its blocks' matmul weights "
               "as float8 e4m3 with one scale per output channel (an fp8 file's kept as they are) run as FP8 "
               "matmuls with per-row activation scales: the DiT's weights nearly halve, at a small loss of "
               "precision. Needs an NVIDIA GPU with FP8 (RTX 40xx, L4/L40, H100/H200 or newer) and dtype bfloat16.")),
    resident_blocks_option(RELEASE_BLOCKS, tooltip=(
        "DiT blocks kept on the GPU. all (default): every weight stays on the GPU, the fastest when it fits. auto: "
        "as many as fit beside the batch's activations; the others are copied in from pinned host memory while "
        "earlier blocks compute, and the VAE leaves the GPU while the DiT runs when memory is short: for 8-24 GB "
        "cards. A number: keep that many (0 streams every block; 3B has 32, 7B 36). Every choice but all holds the "
        "DiT blocks in host RAM (~7 GB for 3B, ~16 GB for 7B in bf16)."),
        help="DiT blocks kept on the GPU: all (every weight resident); auto (as many as fit beside the batch's "
             "activations, the rest streamed from pinned host memory; the VAE leaves the GPU while the DiT runs when "
             "memory is short); or a number (0 streams every block). For GPUs smaller than the model and its "
             "activations.").with_(node="optional"),
    label="SeedVR2 Model Loader's {name}",
)
