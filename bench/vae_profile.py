"""Where the VAEs' time goes: the SeedVR2 VAE's encode and decode, and H3's video decode, at released sizes with
random bf16 weights; kernels grouped by what they do (conv, GEMM, attention, our norm kernels, the torch norm path's
reductions and elementwise passes, copies / fills), the convs' FLOPs and effective TFLOP/s, and variants of the knobs
that change the speed (the norm kernels on / off, the activations' layout, cuDNN autotuning, the band size), each
checked against the first.

    python bench/vae_profile.py seedvr2                 # 21 frames 2688x1536 (a 1344x768 clip at x2), 6 latents
    python bench/vae_profile.py seedvr2 --variants torch,kernels --frames 9
    python bench/vae_profile.py seedvr2 --variants kernels,kernels_cl --profile kernels_cl
    python bench/vae_profile.py h3 --seconds 10         # 243 frames at 1344x768: tile by tile (eager, graphs)
                                                        # vs a clip's tiles in one batch (batched, batched_graphs)
                                                        # and its blocks compiled (batched_compiled; last)
    python bench/vae_profile.py seedvr2 --height 1088 --width 1920 --variants kernels_cl,tiled,tiled_own \
        --tiles 1344,832                                # the tiled VAE (vae_tiling.py; encode, decode tile px)
                                                        # against whole frames: frame statistics / the tiles' own
    python bench/vae_profile.py seedvr2 --tiny --device cpu   # seconds-long smoke run of the script itself
    python bench/vae_profile.py seedvr2 --frames 9 --height 768 --width 1344 --variants torch,kernels --check-fp32
                                                        # each variant's error against float32 math (TF32 off), and
                                                        # the kernels' own float32 error: is a bf16 gap rounding?

Prints one JSON line per variant (and --json appends them)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops, vae_tiling  # noqa: E402
from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE  # noqa: E402
from comfyui_h3.backend.models.seedvr2.vae_config import VAEConfig  # noqa: E402

# Kernel names -> what they do. Order matters: the first pattern that matches names the kind.
KINDS = [
    ("norm_kernels", re.compile(r"_stats_partial|_norm_apply")),
    ("attention", re.compile(r"fmha|flash|attention|efficient_attn|sdpa|softmax_rows", re.I)),  # GEMMs: "gemm"
    ("conv", re.compile(r"conv|fprop|dgrad|implicit|xmma|cudnn|winograd|nhwc|ndhwc|nchw", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|matmul", re.I)),
    ("copy_fill", re.compile(r"copy|memcpy|memset|fill|cat|pad", re.I)),
    ("reduction", re.compile(r"reduce|welford|norm|var_mean|sum", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def kind_of(name: str) -> str:
    return next((k for k, pattern in KINDS if pattern.search(name)), "other")


@contextmanager
def counting_conv_flops(counter: list):
    """Convs counted, F.conv3d's and the VAE's in-place band writes (vae_ops.conv_into): 2 * output elements *
    (input channels per group x kernel volume) per call."""
    real, real_into = F.conv3d, vae_ops.conv_into
    inside = []  # conv_into's CPU form calls F.conv3d: counted once

    def conv3d(x, weight, *args, **kwargs):
        out = real(x, weight, *args, **kwargs)
        if not inside:
            counter[0] += 2 * out.numel() * weight[0].numel()
            counter[1] += 1
        return out

    def conv_into(x, weight, stride, out):
        inside.append(1)
        try:
            real_into(x, weight, stride, out)
        finally:
            inside.pop()
        counter[0] += 2 * out.numel() * weight[0].numel()
        counter[1] += 1

    F.conv3d, vae_ops.conv_into = conv3d, conv_into
    try:
        yield
    finally:
        F.conv3d, vae_ops.conv_into = real, real_into


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_min(fn, device, iters: int):
    """(the fastest of `iters` synchronised calls of fn in s, the last call's result)."""
    best, out = float("inf"), None
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


def profile_kinds(fn, device) -> tuple[dict, list]:
    """Device time per kind (s) over one call of fn, and the 12 largest kernels."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return {}, []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    kinds: dict = {}
    names: dict = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(event, "device_time", None)
        us = event.cuda_time if us is None else us
        kind = kind_of(event.name)
        kinds[kind] = kinds.get(kind, 0.0) + us / 1e6
        entry = names.setdefault(event.name[:90], [0.0, 0])
        entry[0] += us / 1e6
        entry[1] += 1
    top = sorted(names.items(), key=lambda kv: -kv[1][0])[:12]
    return ({k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            [{"name": n, "s": round(s, 3), "calls": c} for n, (s, c) in top])


def emit(args, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if args.json:
        with open(args.json, "a") as handle:
            handle.write(line + "\n")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


# ---- SeedVR2 --------------------------------------------------------------------------------------------------------

# The module switches a variant may change, each with its CUDA default.
SWITCHES = {
    "norm_kernels": (vae_ops, "NORM_KERNELS", True),
    "channels_last": (vae_layout, "CHANNELS_LAST", "auto"),  # channels_last_3d activations
    "band_writes": (vae_ops, "DIRECT_BAND_WRITES", True),  # banded convs write their frames in place
    "gemm_attention": (vae_ops, "GEMM_ATTENTION", True),  # the mid block's attention as GEMMs + softmax kernel
    "row_copies": (vae_ops, "ROW_COPIES", True),  # the row-copy kernel
}
_TORCH_PATH = {key: False for key in SWITCHES}
SEEDVR2_VARIANTS = {  # name -> what it changes from the CUDA default: switches, "autotune" (cuDNN), "chunk" (bytes)
    "torch": _TORCH_PATH,  # the path before the kernels
    "kernels": {**_TORCH_PATH, "norm_kernels": True},
    "kernels_cl_copied": {"band_writes": False, "gemm_attention": False, "row_copies": False},  # bands copied
    "kernels_cl_sdpa": {"gemm_attention": False, "row_copies": False},  # SDPA's attention kernel
    "kernels_cl_torch_copies": {"row_copies": False},
    "kernels_cl": {},  # the CUDA default now
    "kernels_cl_chunk2g": {"chunk": 2 * 2**30},
    "kernels_cl_autotune": {"autotune": True},
    "kernels_autotune": {**_TORCH_PATH, "norm_kernels": True, "autotune": True},
    "kernels_chunk2g": {**_TORCH_PATH, "norm_kernels": True, "chunk": 2 * 2**30},
    "kernels_chunk8g": {**_TORCH_PATH, "norm_kernels": True, "chunk": 8 * 2**30},
    # the CUDA default in --tiles tiles (vae_tiling.py): with frame statistics (two passes over the tiles; what
    # the pipeline runs) and with the tiles' own (one pass)
    "tiled": {"tiles": "frame"},
    "tiled_own": {"tiles": "own"},
    "tiled_torch": {**_TORCH_PATH, "tiles": "frame"},  # the tiled path on the torch ops (NCDHW, fp64 moments)
    "tiled_kernels_ncdhw": {**_TORCH_PATH, "norm_kernels": True, "tiles": "frame"},
}


def apply_variant(changes: dict) -> int:
    """Set every switch (its default unless `changes` names it) and cuDNN autotuning; the band bytes to use."""
    for key, (module, attr, default) in SWITCHES.items():
        setattr(module, attr, changes.get(key, default))
    torch.backends.cudnn.benchmark = changes.get("autotune", False)
    return changes.get("chunk", vae_ops.DEFAULT_CHUNK_BYTES)


def seedvr2(args, device) -> None:
    dtype = torch.float32 if args.tiny else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        vae = SeedVR2VAE(VAEConfig.tiny() if args.tiny else VAEConfig.released())
    vae = vae.to(dtype).eval().requires_grad_(False)
    g = torch.Generator(device=device).manual_seed(1)
    video = (torch.rand((1, 3, args.frames, args.height, args.width), generator=g, device=device) * 2 - 1).to(dtype)
    t = (args.frames - 1) // 4 + 1
    z = torch.randn((1, 16, t, args.height // 8, args.width // 8), generator=g, device=device).to(dtype)
    first = None
    kept = {}
    for name in args.variants.split(","):
        chunk = apply_variant(SEEDVR2_VARIANTS[name])

        stats = SEEDVR2_VARIANTS[name].get("tiles")
        if stats and not args.tiles:
            raise SystemExit(f"variant {name} needs --tiles ENCODE,DECODE")
        enc_tile, dec_tile = (int(v) for v in args.tiles.split(",")) if stats else (0, 0)

        def encode():
            if stats:
                return vae_tiling.tiled_encode(vae, video, enc_tile, chunk_bytes=chunk, frame_stats=stats == "frame",
                                               force=True)[0]
            return vae.encode(video, chunk_bytes=chunk)[0]

        def decode():
            if stats:
                return vae_tiling.tiled_decode(vae, z, dec_tile, chunk_bytes=chunk, frame_stats=stats == "frame",
                                               force=True)
            return vae.decode(z, chunk_bytes=chunk)

        record = {"model": "seedvr2_vae", "variant": name, "frames": args.frames, "size": [args.height, args.width],
                  "latents": list(z.shape), "dtype": str(dtype), "device": str(device),
                  "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                  "torch": torch.__version__}
        if stats:
            record["tiles"] = [enc_tile, dec_tile]  # conv FLOPs then count the overlaps and the statistics pass
        outs = {}
        for stage, fn in (("encode", encode), ("decode", decode)):
            flops = [0, 0]
            with counting_conv_flops(flops):
                fn()  # warm-up (and cuDNN's autotuning), counting the convs
            sync(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            wall, out = timed_min(fn, device, args.iters)
            outs[stage] = out
            entry = {"s": round(wall, 3), "conv_calls": flops[1], "conv_tflop": round(flops[0] / 1e12, 2),
                     "tflops_whole": round(flops[0] / wall / 1e12, 1)}
            if device.type == "cuda":
                entry["peak_extra_gib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**30, 2)
            if args.profile and name in args.profile.split(","):
                kinds, top = profile_kinds(fn, device)
                entry["kinds_s"], entry["top"] = kinds, top
                if kinds.get("conv"):
                    entry["tflops_conv_kernels"] = round(flops[0] / kinds["conv"] / 1e12, 1)
            record[stage] = entry
        record["encode_plus_decode_s"] = round(record["encode"]["s"] + record["decode"]["s"], 3)
        if first is None:
            first = (name, {k: v.cpu() for k, v in outs.items()})
        else:
            record["vs"] = first[0]
            record["rel_err"] = {k: rel_err(v.cpu(), first[1][k]) for k, v in outs.items()}
        if args.check_fp32:
            kept[name] = {k: v.cpu() for k, v in outs.items()}
        del outs
        emit(args, record)
    apply_variant({})
    if args.check_fp32:
        check_against_fp32(args, vae, video, z, kept)


def check_against_fp32(args, vae, video, z, kept: dict) -> None:
    """The same weights and inputs in float32 with TF32 off, by the torch path (the one the official goldens hold)
    and by the kernels; each earlier variant's error against the torch float32 outputs."""
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    vae32, video32, z32 = vae.float(), video.float(), z.float()
    reference = {}
    try:
        for kernels in (False, True):  # the torch path (NCDHW), then the CUDA default
            apply_variant({} if kernels else _TORCH_PATH)
            outs = {"encode": vae32.encode(video32)[0].cpu(), "decode": vae32.decode(z32).cpu()}
            if not kernels:
                reference = outs
        record = {"model": "seedvr2_vae", "variant": "fp32_check", "frames": args.frames,
                  "size": [args.height, args.width], "kernels_fp32_rel_err": {k: rel_err(v, reference[k])
                                                                              for k, v in outs.items()},
                  "rel_err_vs_fp32": {name: {k: rel_err(v, reference[k]) for k, v in outs_.items()}
                                      for name, outs_ in kept.items()}}
        emit(args, record)
    finally:
        apply_variant({})
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


# ---- H3 -------------------------------------------------------------------------------------------------------------

def h3(args, device) -> None:
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.decode import iter_decode_video
    from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds, latent_frames

    dtype = torch.float32 if args.tiny else torch.bfloat16
    config = {}
    if args.tiny:
        from comfyui_h3.backend.models.tiny import TINY_VAE_CONFIG
        config = dict(TINY_VAE_CONFIG)
    torch.manual_seed(0)
    with torch.device(device):
        vae = AutoencoderKLMiniMaxH3(**config)
    # diffusers initialises the blocks' layer scales to zero: every block would add nothing, and a comparison of
    # decoders would only see proj_in / proj_out. Drawn like trained ones are sized, so every block counts.
    g = torch.Generator(device=device).manual_seed(2)
    for block in vae.decoder.transformer_blocks:
        for scale in (block.scale1, block.scale2):
            scale.data.copy_(torch.randn(scale.shape, generator=g, device=device) * 0.1)
    vae = vae.to(dtype).eval().requires_grad_(False)
    frames = frames_for_seconds(args.seconds)
    g = torch.Generator(device=device).manual_seed(0)
    latents = torch.randn((1, 24, latent_frames(frames), args.height // 16, args.width // 16), generator=g,
                          device=device)
    first = None
    for name in args.variants.split(","):
        graphs = name.endswith("graphs")
        batched = name.startswith("batched")
        autotune = "autotune" in name
        if "compiled" in name:  # from here on: compiling is one-way, so compiled variants go last
            from comfyui_h3.backend.pipelines.h3.components import compile_vae_decoder
            compile_vae_decoder(vae)
        torch.backends.cudnn.benchmark = autotune

        def decode():
            with torch.no_grad():
                return torch.cat(list(iter_decode_video(vae, latents, device, cuda_graphs=graphs,
                                                          batch_tiles=batched)))

        decode()  # warm-up (graph capture, autotuning)
        wall, out = timed_min(decode, device, args.iters)
        record = {"model": "h3_vae_decode", "variant": name, "frames": int(out.shape[0]),
                  "size": [args.height, args.width], "dtype": str(dtype), "s": round(wall, 3),
                  "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
        if args.profile and name in args.profile.split(","):
            record["kinds_s"], record["top"] = profile_kinds(decode, device)
        if first is None:
            first = (name, out.cpu())
        else:
            record["vs"] = first[0]
            record["uint8_equal"] = bool(torch.equal(out.cpu(), first[1]))
            diff = (out.cpu().int() - first[1].int()).abs()
            record["max_level_diff"] = int(diff.max())
            record["mean_level_diff"] = round(float(diff.float().mean()), 5)
            record["share_of_values_differing"] = round(float((diff > 0).float().mean()), 5)
        emit(args, record)
    torch.backends.cudnn.benchmark = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=["seedvr2", "h3"])
    ap.add_argument("--frames", type=int, default=21, help="seedvr2: video frames (4n+1)")
    ap.add_argument("--seconds", type=float, default=10.0, help="h3: clip length")
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--variants", default=None)
    ap.add_argument("--profile", default="", help="comma list of variants to profile kernel by kernel")
    ap.add_argument("--tiles", default="", help="seedvr2, the tiled variants: ENCODE,DECODE tile in px")
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--check-fp32", action="store_true", help="seedvr2: errors against float32 math (small shapes)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.model == "seedvr2":
        args.height = args.height or (32 if args.tiny else 1536)
        args.width = args.width or (48 if args.tiny else 2688)
        args.variants = args.variants or ",".join(SEEDVR2_VARIANTS)
        seedvr2(args, device)
    else:
        args.height = args.height or (64 if args.tiny else 768)
        args.width = args.width or (96 if args.tiny else 1344)
        args.variants = args.variants or "eager,graphs,batched,batched_graphs,batched_compiled"
        h3(args, device)


if __name__ == "__main__":
    main()
