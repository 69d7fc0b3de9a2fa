"""The SeedVR2 video VAE, ours against numz's ComfyUI pack ("the peer"): encode and decode of the same random video /
latents with the same random weights, each side in its own process, stage times and peak GPU memory side by side.

The peer is imported from its checkout at run time, like a library (none of its code lives here):

    git clone https://github.com/numz/ComfyUI-SeedVR2_VideoUpscaler /tmp/numz
    git -C /tmp/numz checkout 4490bd1f482e026674543386bb2a4d176da245b9   # the commit this script was written against

    python bench/peer_seedvr2.py --peer-dir /tmp/numz                # 21 frames 2688x1536 (a 1344x768 clip at x2),
                                                                     # 6 latents; released size, bf16, cuda
    python bench/peer_seedvr2.py --peer-dir /tmp/numz --frames 9 --iters 3 --json OUT
    python bench/peer_seedvr2.py --peer-dir /tmp/numz --tiny         # tiny config, CPU float32: a seconds-long smoke
                                                                     # run that also checks the two sides agree
    python bench/peer_seedvr2.py --sides ours                        # ours alone, no checkout needed

What runs: the driver makes one random state dict (our SeedVR2VAE's, seeded; its config in the file's metadata) and
saves it as safetensors; each side (`--side ours|peer`, a subprocess) builds its VAE for that config, loads the file
(the peer's names are the official checkpoint's, as ours: no mapping; it must load every key with its shape or the
run stops naming the keys that differ), draws the same video in [-1, 1] and latents from the seed, and times encode
(video -> mean, logvar) and decode (latents -> video): one warm-up, then the min of --iters calls. Peak GiB is
torch.cuda.max_memory_allocated over those calls (peak_gib) and the same above what was allocated before them, the
weights and the inputs (extra_gib). The driver prints one JSON line (appended to --json too) with both sides, the
ratio ours / peer of each number, and the relative error ||ours - peer|| / ||peer|| of mean, logvar and video; in
float32 they must agree to 1e-4 (exit 1 otherwise), in half precision the error is only reported.

Each side runs its pack's defaults. Ours: time slices of 4 frames (encode) / 1 latent (decode) after the first,
chunk_bytes 512 MiB. The peer, as its VAE loader and model setup build it: the VAE kwargs are configs_3b/main.yaml's
vae.model merged with src/models/video_vae_v3/s8_c16_t4_inflation_sd3.yaml (src/core/model_configuration.py,
_setup_vae_model); then set_causal_slicing(split_size=4, memory_device="same") and set_memory_limit(conv_max_mem=0.5,
norm_max_mem=0.5) from main.yaml's vae.slicing / vae.memory_limit (same file, apply_model_specific_config). So:
slices of 1 + 4 then 4 frames and of 1 + 1 then 1 latent, as ours; a causal conv whose padded input exceeds 0.5 GiB
runs in row (then column) pieces with halos, a GroupNorm over 0.5 GiB in 4 (bf16) or 2 channel chunks -- both exact
(forced with tiny limits on the tiny model, the CPU gives bitwise the same outputs). Tiling is off (encode_tiled /
decode_tiled default False in src/interfaces/vae_model_loader.py and inference_cli.py), so encode / decode are called
with tiled=False, in the weights' dtype (the pack casts weights and video to its compute dtype, bf16, so its autocast
branch is not taken). On torch >= 2.9 with cuDNN >= 9.10.2 the peer routes half-precision Conv3d to
torch.cudnn_convolution (its NVIDIA_CONV3D_MEMORY_BUG_WORKAROUND, reported in its settings). Neither side sets
cudnn.benchmark; in float32 each side's process turns TF32 off, so a float32 run on a GPU compares float32 math
(the 1e-4 check is verified on the CPU only).

Needs, for the peer side only: diffusers (its requirements.txt: >= 0.33.1; checked with 0.42.1), einops and psutil
(its memory manager), and PyYAML (to read the pack's yaml; diffusers' huggingface_hub brings it). Not omegaconf:
this script reads the two yaml files itself, with no interpolation in the keys it uses. Where these are missing (the
H200 image has no diffusers and no index), `pip install --target DIR diffusers einops` where an index is, and put DIR
on PYTHONPATH. Importing the
peer prints its optimization banner; the children's stdout goes to stderr so stdout stays JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FP32_TOL = 1e-4
GIB = 2**30

# Our VAEConfig field -> the peer's VideoAutoencoderKL kwarg, so the peer is built for the config the weights came from.
PEER_ARCH = {
    "in_channels": "in_channels",
    "out_channels": "out_channels",
    "latent_channels": "latent_channels",
    "block_channels": "block_out_channels",
    "layers_per_block": "layers_per_block",
    "norm_groups": "norm_num_groups",
    "temporal_down_blocks": "temporal_scale_num",
}


# ---- shapes, inputs, weights ----------------------------------------------------------------------------------------

def shapes(args) -> tuple[list, list]:
    """The video [1, 3, F, H, W] and its latents [1, 16, (F - 1) / 4 + 1, H / 8, W / 8]."""
    return ([1, 3, args.frames, args.height, args.width],
            [1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8])


def make_inputs(args, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # Drawn on the CPU in float32 so both sides (and any device) get the same numbers, then cast.
    g = torch.Generator().manual_seed(args.seed + 1)
    video_shape, latent_shape = shapes(args)
    video = torch.rand(video_shape, generator=g) * 2 - 1
    z = torch.randn(latent_shape, generator=g)
    return video.to(dtype), z.to(dtype)


def make_weights(args, path: str) -> None:
    """Our VAE's seeded random init, float32, with its config in the metadata (both sides build from it)."""
    sys.path.insert(0, REPO)
    from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE
    from comfyui_h3.backend.models.seedvr2.vae_config import VAEConfig

    cfg = VAEConfig.tiny() if args.tiny else VAEConfig.released()
    torch.manual_seed(args.seed)
    state = {k: v.contiguous() for k, v in SeedVR2VAE(cfg).state_dict().items()}
    save_file(state, path, metadata={"vae_config": json.dumps(dataclasses.asdict(cfg))})


def weights_config(path: str) -> dict:
    with safe_open(path, "pt") as f:
        return json.loads(f.metadata()["vae_config"])


# ---- the two sides --------------------------------------------------------------------------------------------------

def build_ours(args, state: dict, device: torch.device, dtype: torch.dtype):
    sys.path.insert(0, REPO)
    from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops
    from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE
    from comfyui_h3.backend.models.seedvr2.vae_config import VAEConfig

    fields = weights_config(args.weights)
    cfg = VAEConfig(**{**fields, "block_channels": tuple(fields["block_channels"])})
    vae = SeedVR2VAE(cfg)
    vae.load_state_dict(state, strict=True)
    vae = vae.to(device, dtype).eval().requires_grad_(False)
    # Called with their defaults: report those, read from the signatures so they cannot drift from what ran.
    used = ((vae.encode, "slice_frames"), (vae.decode, "slice_latents"), (vae.encode, "chunk_bytes"))
    settings = {name: inspect.signature(fn).parameters[name].default for fn, name in used}
    settings["norm_kernels"] = vae_ops.NORM_KERNELS and device.type == "cuda"  # the CPU takes the torch path
    settings["channels_last"] = vae_layout.channels_last_for(torch.empty(0, device=device))
    settings["gemm_attention"] = vae_ops._gemm_attention_for(torch.empty((1, 1, 1, 512), device=device, dtype=dtype))
    settings["band_writes_in_place"] = vae_ops._writes_frames_in_place(
        torch.empty((1, 2, 1, 1, 1), device=device, dtype=dtype, memory_format=torch.channels_last_3d))
    return vae.encode, vae.decode, settings


def peer_config(peer_dir: str, fields: dict) -> tuple[dict, dict, dict]:
    """The pack's VAE kwargs, causal slicing and memory limits, merged as its _setup_vae_model does, with the
    architecture fields replaced by the weights' config (the same values at released size)."""
    import yaml

    with open(os.path.join(peer_dir, "configs_3b", "main.yaml")) as f:
        vae = yaml.safe_load(f)["vae"]
    with open(os.path.join(peer_dir, "src", "models", "video_vae_v3", "s8_c16_t4_inflation_sd3.yaml")) as f:
        arch = yaml.safe_load(f)
    kwargs = {k: v for k, v in vae["model"].items() if k != "__object__"}
    kwargs.update(arch)
    kwargs.update({peer: list(fields[ours]) if ours == "block_channels" else fields[ours]
                   for ours, peer in PEER_ARCH.items()})
    return kwargs, vae["slicing"], vae["memory_limit"]


def load_peer_strict(model: torch.nn.Module, state: dict) -> None:
    # The peer's causal convs load non-strictly (inflation_mode "pad" != "none"), so strict=True alone would not catch
    # a missing conv key: compare names and shapes first.
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state.items()}
    diff = {"missing": sorted(want.keys() - have.keys()), "unexpected": sorted(have.keys() - want.keys()),
            "shape": sorted(k for k in want.keys() & have.keys() if want[k] != have[k])}
    if any(diff.values()):
        raise SystemExit(f"peer VAE keys differ from the weights: {json.dumps(diff)}")
    model.load_state_dict(state, strict=True)


def build_peer(args, state: dict, device: torch.device, dtype: torch.dtype):
    sys.path.insert(0, os.path.abspath(args.peer_dir))
    import diffusers
    from src.models.video_vae_v3.modules.attn_video_vae import VideoAutoencoderKLWrapper
    from src.optimization.compatibility import NVIDIA_CONV3D_MEMORY_BUG_WORKAROUND

    kwargs, slicing, memory_limit = peer_config(args.peer_dir, weights_config(args.weights))
    model = VideoAutoencoderKLWrapper(**kwargs)
    load_peer_strict(model, state)
    # eval() matters beyond dropout: the peer's convs keep the frames carried between time slices only when not
    # training, and skip gradient checkpointing (main.yaml turns it on).
    model = model.to(device, dtype).requires_grad_(False).eval()
    model.set_causal_slicing(**slicing)
    model.set_memory_limit(**memory_limit)

    def encode(video):
        posterior = model.encode(video, tiled=False).posterior
        return posterior.mean, posterior.logvar

    def decode(z):
        return model.decode(z, tiled=False).sample

    settings = {**slicing, **{f"{k}_gib": v for k, v in memory_limit.items()}, "tiled": False,
                "conv3d_cudnn_workaround": NVIDIA_CONV3D_MEMORY_BUG_WORKAROUND, "diffusers": diffusers.__version__}
    return encode, decode, settings


# ---- timing ---------------------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_stage(fn, x: torch.Tensor, iters: int, device: torch.device) -> tuple[dict, object]:
    """One warm-up (cuDNN algorithm choice, Triton compiles, allocator growth), then the min of ``iters`` calls;
    peaks over those calls, the last result freed before each so a peak is one call's."""
    fn(x)
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    times, out = [], None
    for _ in range(iters):
        out = None
        sync(device)
        t0 = time.perf_counter()
        out = fn(x)
        sync(device)
        times.append(time.perf_counter() - t0)
    stats = {"s": round(min(times), 4)}
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        stats.update(peak_gib=round(peak / GIB, 2), extra_gib=round((peak - base) / GIB, 2))
    return stats, out


def run_side(args) -> None:
    """A child: build one side, time encode then decode, leave its record and outputs in --work."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if dtype == torch.float32:  # torch's default TF32 convs would put both sides ~1e-3 apart on a GPU
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    state = load_file(args.weights)
    encode, decode, settings = (build_ours if args.side == "ours" else build_peer)(args, state, device, dtype)
    del state
    video, z = make_inputs(args, dtype)
    record = {"settings": settings}
    with torch.no_grad():
        stats, (mean, logvar) = time_stage(encode, video.to(device), args.iters, device)
        record.update({f"encode_{k}": v for k, v in stats.items()})
        stats, decoded = time_stage(decode, z.to(device), args.iters, device)
        record.update({f"decode_{k}": v for k, v in stats.items()})
    outs = {"mean": mean, "logvar": logvar, "video": decoded}
    record["shapes"] = {k: list(v.shape) for k, v in outs.items()}
    save_file({k: v.cpu().contiguous() for k, v in outs.items()}, os.path.join(args.work, f"{args.side}.safetensors"))
    with open(os.path.join(args.work, f"{args.side}.json"), "w") as f:
        json.dump(record, f)


# ---- the driver -----------------------------------------------------------------------------------------------------

def spawn(args, side: str, weights: str, work: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--weights", weights, "--work", work,
           "--frames", str(args.frames), "--height", str(args.height), "--width", str(args.width),
           "--dtype", args.dtype, "--device", args.device, "--iters", str(args.iters), "--seed", str(args.seed)]
    if side == "peer":
        cmd += ["--peer-dir", args.peer_dir]
    subprocess.run(cmd, check=True, stdout=sys.stderr)  # the peer prints a banner: keep our stdout JSON
    with open(os.path.join(work, f"{side}.json")) as f:
        return json.load(f)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def compare(record: dict, work: str, dtype: str) -> bool:
    """Ratios ours / peer and the outputs' relative error into ``record``; False when float32 outputs disagree."""
    ours, peer = record["ours"], record["peer"]
    record["ours_over_peer"] = {k: round(v / peer[k], 3) for k, v in ours.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool) and peer.get(k)}
    a = load_file(os.path.join(work, "ours.safetensors"))
    b = load_file(os.path.join(work, "peer.safetensors"))
    record["rel_err"] = {k: rel_err(a[k], b[k]) if a[k].shape == b[k].shape else f"shapes {list(a[k].shape)} vs "
                         f"{list(b[k].shape)}" for k in b}
    if dtype != "float32":
        return True
    record["fp32_tol"] = FP32_TOL
    record["agree"] = all(isinstance(e, float) and e <= FP32_TOL for e in record["rel_err"].values())
    return record["agree"]


def peer_commit(peer_dir: str):
    """The checkout's commit; None for a tree with no .git of its own (git would answer for an enclosing repo)."""
    if not os.path.exists(os.path.join(peer_dir, ".git")):
        return None
    found = subprocess.run(["git", "-C", peer_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def drive(args) -> bool:
    sides = args.sides.split(",")
    video_shape, latent_shape = shapes(args)
    record = {"model": "seedvr2_vae", "config": "tiny" if args.tiny else "released", "video": video_shape,
              "latents": latent_shape, "dtype": args.dtype, "device": args.device, "iters": args.iters,
              "torch": torch.__version__}
    if "peer" in sides:
        record["peer_commit"] = peer_commit(args.peer_dir)
    with tempfile.TemporaryDirectory(prefix="peer_seedvr2_") as work:
        weights = os.path.join(work, "weights.safetensors")
        make_weights(args, weights)
        for side in sides:
            record[side] = spawn(args, side, weights, work)
        ok = compare(record, work, args.dtype) if len(sides) == 2 else True
    # Asked only now: a CUDA context in the driver would hold device memory while the sides run.
    record["gpu"] = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None
    line = json.dumps(record)
    print(line, flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")
    return ok


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=21, help="video frames, 4n + 1")
    ap.add_argument("--height", type=int, default=None, help="default 1536 (--tiny: 64)")
    ap.add_argument("--width", type=int, default=None, help="default 2688 (--tiny: 96)")
    ap.add_argument("--dtype", choices=list(DTYPES), default=None, help="default bfloat16 (--tiny: float32)")
    ap.add_argument("--device", default=None, help="default cuda (--tiny: cpu)")
    ap.add_argument("--iters", type=int, default=2, help="timed calls after one warm-up; the min is reported")
    ap.add_argument("--tiny", action="store_true", help="the tiny config (a smoke run of the script and the check)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="append the JSON line to this file")
    ap.add_argument("--peer-dir", help="checkout of numz/ComfyUI-SeedVR2_VideoUpscaler (needed for the peer side)")
    ap.add_argument("--sides", default="ours,peer")
    # Internal: what the driver passes to each side's process.
    ap.add_argument("--side", choices=["ours", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.height = args.height or (64 if args.tiny else 1536)
    args.width = args.width or (96 if args.tiny else 2688)
    args.dtype = args.dtype or ("float32" if args.tiny else "bfloat16")
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    if (args.frames - 1) % 4 or args.height % 8 or args.width % 8:
        ap.error("--frames must be 4n + 1 and --height / --width multiples of 8")
    sides = (args.side or args.sides).split(",")
    if not set(sides) <= {"ours", "peer"} or len(set(sides)) != len(sides):
        ap.error("--sides takes ours, peer or ours,peer")
    if "peer" in sides and not args.peer_dir:
        ap.error("the peer side needs --peer-dir")
    return args


def main() -> None:
    args = parse_args()
    if args.side:
        run_side(args)
    elif not drive(args):
        sys.exit(1)


if __name__ == "__main__":
    main()
