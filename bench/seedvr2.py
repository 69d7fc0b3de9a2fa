"""SeedVR2 on the H200: random full-size weights, bf16. Default shape: a 10-s 1344x768 H3 clip (241 frames) upscaled
x2 to 2688x1536 -> 61 latent frames x 192 x 336 latent pixels -> 61 x 96 x 168 = 983,808 DiT tokens.

    python bench/seedvr2.py attention [--variant 3b] [--frames 241] [--json OUT]
    python bench/seedvr2.py dit [--naive] [--fp8]  # our DiT step vs a straightforward port of the official forward
    python bench/seedvr2.py pipeline               # the whole upscale, time per stage, peak memory
        [--size WxH] [--vae-tile PX | ENC DEC] [--vae-tile-stats frame|tile] [--memory-gib G] [--resident-blocks all|auto|N] [--fp8]
        [--save F.pt | --compare F.pt]             # a smaller card (capped memory), streamed blocks, equality
    python bench/seedvr2.py sp --world 2           # window SP over N GPUs (NCCL) vs 1 GPU: error, time, peak per rank
    python bench/seedvr2.py sp --pipeline --world 2   # the whole upscale on N GPUs (VAE spread too): stages, peak per rank
    python bench/seedvr2.py vae_tiling --tiles 1024 512   # tiled vs whole VAE: error, time, peak; --tiny on the CPU

Stages print one JSON line each (also appended to --json)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_timing import timed  # noqa: E402

from comfyui_h3.backend.models.seedvr2.dit import SeedVR2DiT  # noqa: E402
from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig  # noqa: E402
from comfyui_h3.backend.models.seedvr2.windows import layer_window_methods, window_layout  # noqa: E402

TXT_LEN = 58


def grid_for(frames: int, height: int, width: int, scale: float) -> tuple[int, int, int]:
    """DiT token grid (t, h, w) of an upscale: latent frames, output pixels / 16."""
    oh, ow = round(height * scale), round(width * scale)
    return (frames - 1) // 4 + 1, -(-oh // 16), -(-ow // 16)


def emit(args, record: dict) -> None:
    record.update(device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", torch=torch.__version__)
    line = json.dumps(record)
    print(line, flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")


def random_dit(variant: str, device, dtype, seed: int = 0) -> SeedVR2DiT:
    torch.manual_seed(seed)
    with torch.device(device):
        dit = SeedVR2DiT(DiTConfig.released(variant))
    return dit.to(dtype).eval().requires_grad_(False)


def dit_inputs(grid, config, device, dtype, seed: int = 1):
    g = torch.Generator(device=device).manual_seed(seed)
    t, h, w = grid
    vid = torch.randn((t, 2 * h, 2 * w, config.vid_in_channels), generator=g, device=device, dtype=dtype)
    txt = torch.randn((TXT_LEN, config.txt_dim), generator=g, device=device, dtype=dtype)
    return vid, txt


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ---- attention: grouped windows vs one call per window -------------------------------------------------------------

def stage_attention(args) -> None:
    from comfyui_h3.backend.models.seedvr2.window_attention import window_attention

    cfg = DiTConfig.released(args.variant)
    grid = grid_for(args.frames, args.height, args.width, args.scale)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    n = grid[0] * grid[1] * grid[2]
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn((n, cfg.heads, cfg.head_dim), generator=g, device=dev, dtype=dtype) for _ in range(3))
    tq, tk, tv = (torch.randn((TXT_LEN, cfg.heads, cfg.head_dim), generator=g, device=dev, dtype=dtype)
                  for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for method in layer_window_methods(2):
        layout = window_layout(method, grid, cfg.window_counts)
        ids = [layout.perm[a:b].to(dev) for a, b in _spans(layout.lengths)]

        def grouped():
            return window_attention(q, k, v, tq, tk, tv, layout)

        def per_window():  # the official loop's shape: every window its own [1, n + L, heads, d] call
            out = torch.empty_like(q)
            txt = torch.zeros_like(tq, dtype=torch.float32)
            for i in ids:
                o = sdpa(torch.cat([q[i], tq]).transpose(0, 1)[None], torch.cat([k[i], tk]).transpose(0, 1)[None],
                         torch.cat([v[i], tv]).transpose(0, 1)[None])[0].transpose(0, 1)
                out[i] = o[:i.numel()]
                txt += o[i.numel():].float()
            return out, (txt / len(ids)).to(tq.dtype)

        ms_g, mem_g = timed(grouped, args.iters)
        ms_w, mem_w = timed(per_window, args.iters)
        a, b = grouped(), per_window()
        emit(args, {"stage": "attention", "variant": args.variant, "method": method, "grid": grid, "tokens": n,
                    "windows": len(layout.windows), "shape_groups": len(layout.groups),
                    "grouped_ms": round(ms_g, 2), "per_window_ms": round(ms_w, 2),
                    "speedup": round(ms_w / ms_g, 3), "grouped_peak_gib": round(mem_g, 2),
                    "per_window_peak_gib": round(mem_w, 2), "video_rel_err": rel_err(a[0], b[0]),
                    "text_rel_err": rel_err(a[1], b[1])})


def _spans(lengths):
    at = 0
    for n in lengths:
        yield at, at + n
        at += n


# ---- DiT step: ours vs a straightforward port of the official forward ---------------------------------------------

def stage_dit(args) -> None:
    from seedvr2_naive import naive_forward

    dev, dtype = torch.device("cuda"), torch.bfloat16
    grid = grid_for(args.frames, args.height, args.width, args.scale)
    dit = random_dit(args.variant, dev, dtype)
    vid, txt = dit_inputs(grid, dit.config, dev, dtype)
    weights_gib = torch.cuda.memory_allocated() / 2**30
    ms, peak = timed(lambda: dit(vid, txt, 1000.0), args.iters, warmup=1)
    ours = dit(vid, txt, 1000.0)
    record = {"stage": "dit", "variant": args.variant, "grid": grid, "tokens": grid[0] * grid[1] * grid[2],
              "ours_s": round(ms / 1000, 3), "ours_peak_gib": round(peak, 2), "weights_gib": round(weights_gib, 2)}
    if args.naive:
        try:
            ms_n, peak_n = timed(lambda: naive_forward(dit, vid, txt), args.iters, warmup=1)
            ref = naive_forward(dit, vid, txt)
            record.update(naive_s=round(ms_n / 1000, 3), naive_peak_gib=round(peak_n, 2),
                          speedup=round(ms_n / ms, 3), rel_err_vs_naive=rel_err(ours, ref))
        except torch.cuda.OutOfMemoryError as exc:
            record.update(naive="out of memory: " + str(exc).splitlines()[0][:120])
    if args.fp8:  # the same weights' GEMMs in float8 e4m3 (_scaled_mm): time, peak and error against the bf16 step
        for block in dit.blocks:
            block.use_fp8_gemms(emulate=False)
        torch.cuda.empty_cache()
        fp8_weights_gib = torch.cuda.memory_allocated() / 2**30
        ms_f, peak_f = timed(lambda: dit(vid, txt, 1000.0), args.iters, warmup=1)
        record.update(fp8_s=round(ms_f / 1000, 3), fp8_peak_gib=round(peak_f, 2),
                      fp8_weights_gib=round(fp8_weights_gib, 2), fp8_speedup=round(ms / ms_f, 3),
                      fp8_rel_err_vs_bf16=rel_err(dit(vid, txt, 1000.0), ours))
    emit(args, record)


# ---- whole upscale -------------------------------------------------------------------------------------------------

class _Components:
    """What SeedVR2Pipeline reads of its components, built from random full-size modules (no files). `resident`:
    "all" (every weight on the device) or the offload placement's resident blocks ("auto" or a number);
    `storage` "fp8": the blocks' GEMM weights as float8 e4m3 (components.py's two paths, without the files)."""

    def __init__(self, variant, dev, dtype, vae_dtype, resident="all", storage="compute"):
        from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig

        self.device, self.dtype, self.vae_dtype = dev, dtype, vae_dtype
        self.dit = random_dit(variant, dev, dtype)
        torch.manual_seed(2)
        with torch.device(dev):
            self.vae = SeedVR2VAE(VAEConfig.released())
        self.vae = self.vae.to(vae_dtype).eval().requires_grad_(False)
        self.text = torch.randn((TXT_LEN, self.dit.config.txt_dim), device=dev, dtype=dtype)
        self.config = self.dit.config
        self.placement = None
        if resident == "all":
            if storage == "fp8":
                for block in self.dit.blocks:
                    block.use_fp8_gemms(emulate=False)
            return
        from comfyui_h3.backend.pipelines.seedvr2.placement import SeedVR2Placement

        self.dit.blocks.cpu()
        self.vae.cpu()
        torch.cuda.empty_cache()
        self.placement = SeedVR2Placement(self.dit, self.vae, dev, None if resident == "auto" else int(resident),
                                          storage)


def smooth_video(frames: int, height: int, width: int) -> torch.Tensor:
    """uint8 [F, H, W, 3]: moving colour gradients (what a decoded H3 clip looks like to the VAE, more or less)."""
    t = torch.arange(frames, dtype=torch.float32)[:, None, None]
    y = torch.linspace(0, 1, height)[None, :, None]
    x = torch.linspace(0, 1, width)[None, None, :]
    chans = [0.5 + 0.5 * torch.sin(6.28 * (x * (1 + c) + y * (2 - c) + t * 0.01 * (c + 1))) for c in range(3)]
    return (torch.stack(chans, -1) * 255).round().to(torch.uint8)


def stage_pipeline(args) -> None:
    from seedvr2_measure import (RUN_PEAK, STAGE_PEAKS, _announce, _cap_memory, _compare_frames, _estimates,
                                 _forced_tiles)
    from comfyui_h3.backend.attention.registry import get_backend
    from comfyui_h3.backend.parallel.context import SINGLE
    from comfyui_h3.backend.pipelines.seedvr2.pipeline import SeedVR2Pipeline
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    dev = torch.device("cuda")
    comps = _Components(args.variant, dev, torch.bfloat16, torch.bfloat16, args.resident_blocks,
                        "fp8" if args.fp8 else "compute")
    cap = _cap_memory(dev, args.memory_gib) if args.memory_gib else {}

    class Runtime:
        parallel = SINGLE
        attention = get_backend("sdpa")

    pipe = SeedVR2Pipeline(comps, Runtime())
    from comfyui_h3.backend.pipelines.seedvr2 import pipeline as pipeline_module, restore

    if args.vae_piece_frames:  # the VAE's full-rate layers in pieces of frames (vae.in_pieces): less memory
        for name in ("encode", "decode"):
            setattr(comps.vae, name, functools.partial(getattr(comps.vae, name), piece_frames=args.vae_piece_frames))
    # A line per stage as it ends: a run cut short still says where the time went. A batch's VAE runs either the
    # whole pass (vae.encode / vae.decode) or the tiled one (restore's tiled_encode / tiled_decode), never both.
    for owner, name, stage in ((comps.vae, "encode", None), (comps.vae, "decode", None), (comps, "dit", None),
                               (restore, "tiled_encode", "encode"), (restore, "tiled_decode", "decode")):
        _announce(owner, name, stage)
    video = smooth_video(args.frames, args.height, args.width)
    size = dict(zip(("width", "height"), map(int, args.size.split("x")))) if args.size else {}
    vae_tile = args.vae_tile[0]
    if len(args.vae_tile) == 2:  # requests take one tile; another run's automatic (encode, decode) pair is forced
        pipeline_module.plan_memory = _forced_tiles(tuple(args.vae_tile))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    req = UpscaleRequest(video, scale=None if size else args.scale, **size, batch_frames=args.batch_frames,
                         overlap=8, timings=True, vae_tile=vae_tile, vae_tile_stats=args.vae_tile_stats)
    geometry, plan, memory = pipe.plan(req)
    print(f"  plan: batch {plan.batch} x {plan.count}, VAE tiles {memory.vae_tiles}", flush=True)
    res = pipe.run(req)
    wall = time.perf_counter() - t0
    frames = res.frames
    record = {"stage": "pipeline", "variant": args.variant, "input": [args.frames, args.height, args.width],
              "output": list(frames.shape), "batches": res.batches, "batch_frames": plan.batch,
              "vae_tiles": list(memory.vae_tiles), "vae_tile_stats": args.vae_tile_stats,
              "vae_piece_frames": args.vae_piece_frames, "resident_blocks": args.resident_blocks, "fp8": args.fp8,
              **cap,
              "wall_s": round(wall, 2), **{k: (round(v, 3) if isinstance(v, float) else v)
                                            for k, v in res.timings.items()},
              "peak_gib": round(max(RUN_PEAK[0], torch.cuda.max_memory_allocated()) / 2**30, 2),
              "stage_peak_and_held_gib": STAGE_PEAKS, "estimate_gib": _estimates(pipe, geometry, plan, memory),
              "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
              "frames_sha256": hashlib.sha256(frames.contiguous().numpy().tobytes()).hexdigest()[:16]}
    if comps.placement is not None:
        record["placement"] = comps.placement.report()
    if args.compare:
        record.update(_compare_frames(args.compare, frames))
    if args.save:
        torch.save(frames, args.save)
    emit(args, record)


# ---- window SP over several GPUs -----------------------------------------------------------------------------------

def _sp_rank(rank: int, world: int, args, port: int) -> None:
    import torch.distributed as dist

    from comfyui_h3.backend.parallel.context import ParallelContext
    from comfyui_h3.backend.parallel.seedvr2_window_shard import ShardedWindowRouting, plan_report

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.tiny:  # CPU ranks: a smoke run of the --pipeline code
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    elif args.pipeline:  # the engine's group: NCCL for CUDA tensors, gloo for the Stop flag's CPU all-reduce
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    if args.pipeline:
        _sp_pipeline(rank, world, args, dev)
        _leave_group()
    dtype = torch.bfloat16
    grid = grid_for(args.frames, args.height, args.width, args.scale)
    dit = random_dit(args.variant, dev, dtype)
    for p in dit.parameters():  # identical weights on every rank whatever each GPU's RNG does
        dist.broadcast(p.data, src=0)
    vid, txt = dit_inputs(grid, dit.config, dev, dtype)
    dist.broadcast(vid, src=0)
    dist.broadcast(txt, src=0)
    ref = None
    if rank == 0 and not args.skip_single:
        torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        ref = dit(vid, txt, 1000.0).cpu()
        torch.cuda.synchronize(dev)
        single = (time.perf_counter() - t0, torch.cuda.max_memory_allocated(dev) / 2**30)
        torch.cuda.empty_cache()
    dist.barrier()
    ctx = ParallelContext(rank, world)
    times = []
    for _ in range(args.iters + 1):
        routing = ShardedWindowRouting(ctx, grid, dit.config.layers, dit.config.window_counts)
        torch.cuda.reset_peak_memory_stats(dev)
        dist.barrier()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = dit(vid, txt, 1000.0, routing=routing)
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    peak = torch.tensor([torch.cuda.max_memory_allocated(dev) / 2**30], device=dev)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0:
        record = {"stage": "sp", "variant": args.variant, "world": world, "grid": grid,
                  "tokens": grid[0] * grid[1] * grid[2], "sp_s": round(sorted(times[1:])[len(times[1:]) // 2], 3),
                  "peak_gib_per_rank": [round(float(p), 2) for p in peaks],
                  "plan": plan_report(grid, world, dit.config.layers, dit.config.window_counts)}
        if ref is not None:
            record.update(single_s=round(single[0], 3), single_peak_gib=round(single[1], 2),
                          speedup=round(single[0] / record["sp_s"], 3), rel_err_vs_single=rel_err(out.cpu(), ref))
        emit(args, record)
    _leave_group()


def _leave_group() -> None:
    """Leave the group and end the rank's process here. The barrier: gloo aborts a peer whose connection closes
    mid-read. os._exit: the process's static destructors can meet a communication thread still joinable and abort
    the rank ("terminate called without an active exception", SIGABRT) after its work is done; nothing is left to
    run that needs them."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _sp_pipeline(rank: int, world: int, args, dev) -> None:
    """sp --pipeline: the whole upscale on `world` ranks (window SP for the DiT, the VAE spread over the ranks by
    backend/parallel/seedvr2_vae_shard.py): seconds per stage and peak memory of every rank; unless --skip-single, rank 0 first
    runs it alone (the one-GPU reference: its stages, and the uint8 difference of the outputs)."""
    import tempfile
    from types import SimpleNamespace

    import torch.distributed as dist

    from comfyui_h3.backend.attention.registry import get_backend
    from comfyui_h3.backend.parallel.context import SINGLE, ParallelContext
    from comfyui_h3.backend.pipelines.seedvr2.pipeline import SeedVR2Pipeline
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    if args.tiny:
        from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
        from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config

        root = make_tiny_seedvr2(tempfile.mkdtemp(prefix="seedvr2_tiny_"), args.variant)
        comps = seedvr2_config(root / DIT_FILE.format(variant=args.variant), root / VAE_FILE, root / TEXT_FILE,
                               dtype="float32", vae_dtype="float32").build_pipeline(0).c
    else:
        comps = _Components(args.variant, dev, torch.bfloat16, torch.bfloat16)
    for t in [*comps.dit.parameters(), *comps.vae.parameters(), comps.text]:  # identical on every rank
        dist.broadcast(t.data, src=0)
    cuda = dev.type == "cuda"
    video = smooth_video(args.frames, args.height, args.width)

    def run(ctx):
        pipe = SeedVR2Pipeline(comps, SimpleNamespace(parallel=ctx, attention=get_backend("sdpa")))
        req = UpscaleRequest(video, scale=args.scale, batch_frames=args.batch_frames, overlap=8, timings=True)
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        res = pipe.run(req)
        wall = time.perf_counter() - t0
        info = {"wall_s": round(wall, 2), **{k: (round(v, 3) if isinstance(v, float) else v)
                                             for k, v in res.timings.items()}}
        info["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if cuda else None
        return res, info

    single = run(SINGLE) if rank == 0 and not args.skip_single else None
    dist.barrier()
    res, mine = run(ParallelContext(rank, world))
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        record = {"stage": "sp_pipeline", "variant": args.variant, "world": world, "tiny": args.tiny,
                  "input": [args.frames, args.height, args.width], "output": list(res.frames.shape),
                  "batches": res.batches, "wall_s": mine["wall_s"],
                  "peak_gib_per_rank": [r["peak_gib"] for r in ranks], "ranks": ranks}
        if single is not None:
            ref, info = single
            diff = max_diff = 0
            for a in range(0, ref.frames.shape[0], 8):  # uint8 levels, a few frames at a time
                d = (res.frames[a:a + 8].int() - ref.frames[a:a + 8].int()).abs()
                diff += int((d > 0).sum())
                max_diff = max(max_diff, int(d.max()))
            record.update(single=info, speedup=round(info["wall_s"] / mine["wall_s"], 3), u8_max_diff=max_diff,
                          u8_diff_frac=diff / ref.frames.numel())
        emit(args, record)


def stage_sp(args) -> None:
    import torch.multiprocessing as mp

    if args.tiny and not args.pipeline:
        raise SystemExit("sp --tiny runs the --pipeline code on CPU ranks: add --pipeline")
    if args.tiny:
        from comfyui_h3.backend.executor.mp_executor import _free_port

    port = _free_port() if args.tiny else 29641
    mp.spawn(_sp_rank, args=(args.world, args, port), nprocs=args.world, join=True)


# ---- VAE spatial tiling: tiled vs whole -----------------------------------------------------------------------------

def _measured(dev, fn):
    """(result, seconds, peak GiB above what was allocated before) of fn(); (None, msg, None) when it runs out of
    memory."""
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev) if cuda else 0
    t0 = time.perf_counter()
    try:
        out = fn()
    except torch.cuda.OutOfMemoryError as exc:
        return None, "out of memory: " + str(exc).splitlines()[0][:100], None
    if cuda:
        torch.cuda.synchronize(dev)
    peak = (torch.cuda.max_memory_allocated(dev) - base) / 2**30 if cuda else None
    return out, round(time.perf_counter() - t0, 3), None if peak is None else round(peak, 2)


def _errors(prefix: str, a: torch.Tensor, b: torch.Tensor, levels: bool = False) -> dict:
    """rel (||a - b|| / ||b||), max abs and, for videos, the difference in uint8 levels of [-1, 1]."""
    a, b = a.float(), b.float()
    out = {f"{prefix}_rel": rel_err(a, b), f"{prefix}_max_abs": round(float((a - b).abs().max()), 4)}
    if levels:
        d = ((a.clamp(-1, 1) + 1) * 127.5).round() - ((b.clamp(-1, 1) + 1) * 127.5).round()
        d = d.abs().flatten()
        out.update({f"{prefix}_u8_mean": round(float(d.mean()), 3), f"{prefix}_u8_max": int(d.max()),
                    f"{prefix}_u8_over2_frac": float((d > 2).float().mean())})
    return out


def stage_vae_tiling(args) -> None:
    """The VAE (random weights drawn as the tiny files' are) at an upscale's output size: whole frames, then tiled with
    each --tiles size, with the frame's GroupNorm statistics (the default) and with each tile's own: errors against
    the whole pass, time and peak memory of each pass, and the memory model's bytes for it. A whole pass that runs
    out of memory is reported and the tiled ones still run (their errors then cannot be taken)."""
    from comfyui_h3.backend.models.seedvr2 import vae_tiling as vt
    from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig
    from comfyui_h3.backend.pipelines.seedvr2 import memory

    from comfyui_h3.backend.models.seedvr2.tiny import _random_state

    dev = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    vae = SeedVR2VAE(VAEConfig.tiny() if args.tiny else VAEConfig.released())
    # the tiny files' draw (weights N(0, 1/fan_in), norms near 1): activations keep their scale through the depth,
    # as in a trained VAE; the modules' default init shrinks them layer by layer
    vae.load_state_dict(_random_state(vae, torch.Generator().manual_seed(2)))
    vae = vae.to(dev, dtype).eval().requires_grad_(False)
    oh, ow = round(args.height * args.scale) // 16 * 16, round(args.width * args.scale) // 16 * 16
    frames = args.vae_frames
    video = smooth_video(frames, oh, ow).to(dev).permute(3, 0, 1, 2)[None].to(dtype).div_(127.5).sub_(1)
    base = {"stage": "vae_tiling", "vae": "tiny" if args.tiny else "released", "dtype": str(dtype)[6:],
            "frames": frames, "size": [oh, ow]}
    vae.decode(vae.encode(video[..., :64, :64])[0])  # warm-up: kernels picked before anything is timed
    enc, enc_s, enc_peak = _measured(dev, lambda: vae.encode(video))
    z = None if enc is None else enc[0]
    dec, dec_s, dec_peak = (None, "no latent", None) if z is None else _measured(dev, lambda: vae.decode(z))
    model = memory.vae_bytes(frames, oh, ow, 2)
    emit(args, {**base, "tile": 0, "encode_s": enc_s, "encode_peak_gib": enc_peak, "decode_s": dec_s,
                "decode_peak_gib": dec_peak, "model_encode_gib": round(model[0] / 2**30, 2),
                "model_decode_gib": round(model[1] / 2**30, 2)})
    for tile in args.tiles:
        rows, cols = vt._plan(oh // 8, ow // 8, tile, args.overlap, 8)
        for frame_stats in (True, False):
            kw = {"overlap": args.overlap, "frame_stats": frame_stats}
            t_enc, te_s, te_peak = _measured(dev, lambda: vt.tiled_encode(vae, video, tile, **kw))
            zt = z if z is not None else (None if t_enc is None else t_enc[0])
            t_dec, td_s, td_peak = (None, "no latent", None) if zt is None else _measured(
                dev, lambda: vt.tiled_decode(vae, zt, tile, **kw))
            model = memory.vae_bytes(frames, oh, ow, 2, tile)
            record = {**base, "tile": tile, "overlap": args.overlap or vt.default_overlap(tile),
                      "tiles": [len(rows), len(cols)], "tile_px": [(rows[0][1] - rows[0][0]) * 8,
                                                               (cols[0][1] - cols[0][0]) * 8],
                      "frame_stats": frame_stats, "encode_s": te_s, "encode_peak_gib": te_peak, "decode_s": td_s,
                      "decode_peak_gib": td_peak, "model_encode_gib": round(model[0] / 2**30, 2),
                      "model_decode_gib": round(model[1] / 2**30, 2)}
            if enc is not None and t_enc is not None:
                record.update(_errors("mean", t_enc[0], enc[0]))
                record.update(_errors("logvar", t_enc[1], enc[1]))
            if dec is not None and t_dec is not None:
                record.update(_errors("video", t_dec, dec, levels=True))
            emit(args, record)
            del t_enc, t_dec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["attention", "dit", "pipeline", "sp", "vae_tiling"])
    ap.add_argument("--variant", default="3b", choices=["3b", "7b"])
    ap.add_argument("--frames", type=int, default=241)
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--width", type=int, default=1344)
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--batch-frames", type=int, default=0)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--naive", action="store_true")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--tiles", type=int, nargs="+", default=[1024, 512], help="vae_tiling: tile sizes (px)")
    ap.add_argument("--overlap", type=int, default=None, help="vae_tiling: overlap (px; default: the module's)")
    ap.add_argument("--vae-frames", type=int, default=9, help="vae_tiling: frames (4n+1)")
    ap.add_argument("--tiny", action="store_true", help="vae_tiling: the tiny VAE on the CPU; sp --pipeline: the "
                    "tiny files on gloo CPU ranks (smoke runs)")
    ap.add_argument("--pipeline", action="store_true", help="sp: the whole upscale (the VAE spread over the ranks too)")
    ap.add_argument("--vae-tile-stats", default="frame", choices=["frame", "tile"],
                    help="pipeline: a tiled VAE's GroupNorm statistics (the request's vae_tile_stats)")
    ap.add_argument("--vae-tile", type=int, nargs="+", default=[0],
                    help="pipeline: the request's VAE tile (px; 0 = auto), or encode and decode tiles")
    ap.add_argument("--vae-piece-frames", type=int, default=0,
                    help="pipeline: run the VAE's full-rate layers in pieces of this many frames (0: whole slices)")
    ap.add_argument("--size", help="pipeline: the output's WIDTHxHEIGHT (instead of --scale), e.g. 1920x1080")
    ap.add_argument("--memory-gib", type=float, default=0.0,
                    help="pipeline: cap the process at this much device memory in all (0: the whole GPU)")
    ap.add_argument("--resident-blocks", default="all", help="pipeline: all, auto or a number (the offload placement)")
    ap.add_argument("--fp8", action="store_true", help="pipeline / dit: the blocks' GEMM weights as FP8")
    ap.add_argument("--save", help="pipeline: torch.save the output frames here")
    ap.add_argument("--compare", help="pipeline: compare the output frames with a --save'd file")
    args = ap.parse_args()
    {"attention": stage_attention, "dit": stage_dit, "pipeline": stage_pipeline, "sp": stage_sp,
     "vae_tiling": stage_vae_tiling}[args.stage](args)


if __name__ == "__main__":
    main()
