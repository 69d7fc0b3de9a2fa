"""The whole MiniMax-H3 T2VA request end to end at the released size with random weights held in memory (text encoder,
DiT, video and audio VAEs; no weight files): ours (engine pipeline: compiled blocks, AdaLN cache, optional FP8) vs
diffusers' modular pipeline (MiniMaxH3Blocks) with components of the same architecture, same shape and step count.
One side per process (each needs ~120 GiB: run them on two GPUs at once):

    CUDA_VISIBLE_DEVICES=0 python bench/e2e.py --side ours --seconds 5 --steps 50 --json ours.json
    CUDA_VISIBLE_DEVICES=1 python bench/e2e.py --side diffusers --seconds 5 --steps 50 --json diffusers.json
    python bench/e2e.py --tiny --side ours|diffusers       # tiny configs on the CPU: the script end to end
    CUDA_VISIBLE_DEVICES=0 python bench/e2e.py --side ours --seconds 10 --fasth3 --json fasth3.json
        # the FastH3 student's path: learned VSA gates (random), VSA top-k 0.1, 4 steps on its ladder

Ulysses sequence parallelism on N GPUs of one host (`--sp N`: N processes, rank r on cuda:r, one NCCL + gloo
process group; one side per command, the sides one after the other on the same GPUs). On a 2-GPU machine:

    python bench/e2e.py --side ours --seconds 10 --steps 50 --sp 2 --timeout 580 --json ours_sp2.json
    python bench/e2e.py --side diffusers --seconds 10 --steps 50 --sp 2 --timeout 580 --json diffusers_sp2.json
    python bench/e2e.py --side ours --seconds 10 --fasth3 --sp 2 --timeout 580 --json fasth3_sp2.json
    python bench/e2e.py --tiny --side ours|diffusers --sp 2   # N CPU ranks on gloo: the SP path end to end

Ours: each rank joins the group and builds its pipeline through the engine worker's setup_rank (its ParallelContext:
the DiT's rows split by Ulysses, the prompt encoded on rank 0 and broadcast, the VAE decode's clips shared), then
runs the request as the worker does; the manifest carries every rank's peak memory. Diffusers: every rank runs the
whole modular pipeline with the transformer under diffusers' own context parallelism
(`enable_parallelism(ContextParallelConfig(ulysses_degree=N))`, as bench/sp_scaling.py --peer; it needs the packed
length divisible by N: with this prompt's 174 text rows, 37,884 rows at 5 s and 73,560 at 10 s, both multiples of
4), rank 0 reports. Every rank builds the same random
weights (each component's initialisation seeded from its name, the DiTs from their own generator); the run checks
that (a fingerprint of every component gathered from every rank) before timing. A rank that fails ends every rank and
the run with its error; `--timeout S` stops them all after S seconds. Rank 0 prints its progress (build, warm-up, each
step of the timed request) on stderr, so a run cut off by a device call's time limit still shows its step times.
`--outputs PATH` saves a digest of the result (final latents, each frame's mean, the soundtrack) to compare runs.

Both sides: prompt -> decoded video frames + soundtrack in host memory (no MP4: encoding is the save stage, measured
in bench/decode_stream.py). Each side first runs a warm-up request (`--warmup-steps`, default 2: CUDA context, cuDNN
plans, and for ours the block compile), then the timed request. Ours reports its stage manifest (text encode, each
step, decode, peaks); diffusers reports wall time plus the DiT's and the VAE decode's time from CUDA events around
their forward calls.

The model folder is a skeleton: the tiny set's tokenizer / processor / schedulers and model_index.json, with the
released configs of the DiT, the VAEs and a Qwen3-VL text encoder of the released width (5120, 64 layers; H3 reads
hidden_states[50]: ours gets the 50-layer stack its loader keeps, diffusers 51 layers, the fewest it accepts).
The tiny tokenizer makes the prompt's token count, so both sides see the same text rows. Random weights: normal(0,
0.02) for the DiTs (default inits blow up through 50 blocks), the libraries' own initialisation (seeded) for the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPT = ("A red fox trots through fresh snow at dawn, breath steaming in the cold air; the camera tracks low beside "
          "it as pine branches drop powder and a distant river glints; soft crunching footsteps and birdsong.")

#: Qwen3-VL text tower of H3's conditioner width (hidden 5120, 64 heads of 128, 8 KV heads, 64 layers).
TEXT_RELEASED = dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936)
VISION_RELEASED = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=5120,
                       deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304)


def make_skeleton(root: str, tiny: bool) -> str:
    """The tiny model set (configs, tokenizer, processor, schedulers), with the released configs unless `tiny`; the
    weight files are removed so nothing can be loaded from disk by accident."""
    from comfyui_h3.backend.models.tiny import make_tiny_h3

    path = str(make_tiny_h3(os.path.join(root, "skeleton")))
    if not tiny:
        from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

        for name, cls in (("transformer", MiniMaxH3Transformer3DModel), ("transformer_ref", MiniMaxH3Transformer3DModel),
                          ("vae", AutoencoderKLMiniMaxH3), ("audio_vae", AutoencoderKLMiniMaxH3Audio)):
            folder = os.path.join(path, name)
            if os.path.isdir(folder):
                with open(os.path.join(folder, "config.json")) as handle:
                    tiny_config = json.load(handle)
                with torch.device("meta"):
                    cls().save_config(folder)  # the class defaults are the released configurations ...
                with open(os.path.join(folder, "config.json")) as handle:
                    config = json.load(handle)
                for key, value in tiny_config.items():  # ... except what the class leaves unset (e.g. the VAEs'
                    if config.get(key) is None and value is not None:  # latent statistics, same channel counts)
                        config[key] = value
                with open(os.path.join(folder, "config.json"), "w") as handle:
                    json.dump(config, handle, indent=1)
        text = os.path.join(path, "text_encoder", "config.json")
        with open(text) as handle:
            config = json.load(handle)
        config["text_config"].update(TEXT_RELEASED)
        config["vision_config"].update(VISION_RELEASED)
        with open(text, "w") as handle:
            json.dump(config, handle, indent=1)
    for name in ("transformer", "transformer_ref", "vae", "audio_vae", "text_encoder"):
        folder = os.path.join(path, name)
        for entry in os.listdir(folder) if os.path.isdir(folder) else ():
            if entry.endswith((".safetensors", ".safetensors.index.json")):
                os.remove(os.path.join(folder, entry))
    return path


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def seeded(name: str, device):
    """The global RNG (CPU and `device`) seeded from a component's name while the library's own initialisation of that
    component runs, and restored after: every rank (and a 1-rank run) gets the same random weights whichever other
    components it builds and in whatever order (under SP only rank 0 builds our text encoder)."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(zlib.crc32(name.encode()))
        yield


def random_dit_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """normal(0, 0.02) weights, norms at 1 (random default inits overflow bf16 through 50 blocks)."""
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight") and "norm_out.linear" not in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
    return module


def text_encoder(folder: str, device, dtype, layers: int | None = None):
    """Qwen3-VL with the 50 decoder layers H3 reads, final norm and LM head removed (components.load_text_encoder's
    rule), random weights made on `device`. `layers`: keep this many instead, norm and head kept (diffusers refuses a
    50-layer stack, so it gets 51: one layer more than ours runs, ~2% of the text encode)."""
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    config = AutoConfig.from_pretrained(folder)
    config.text_config.num_hidden_layers = layers or TEXT_LAYER
    with seeded("text_encoder", device), torch.device(device), default_dtype(dtype):
        model = Qwen3VLForConditionalGeneration._from_config(config, dtype=dtype)
    if layers is None:
        model.model.language_model.norm = torch.nn.Identity()
        model.lm_head = torch.nn.Identity()
    return model.eval().requires_grad_(False)


def diffusers_module(cls, folder: str, device, dtype):
    with seeded(cls.__name__, device), torch.device(device), default_dtype(dtype):
        model = cls.from_config(cls.load_config(folder))
    return model.to(dtype).eval().requires_grad_(False)


def patch_our_loaders(device) -> None:
    """Our engine builds its components from the skeleton's configs with random weights instead of reading files."""
    from comfyui_h3.backend.models.h3_transformer import (FP32_MODULE_PREFIXES, H3Transformer,
                                                          H3TransformerConfig, finish_loading)
    from comfyui_h3.backend.pipelines.h3 import components

    def load_h3_transformer(folder, dev, dtype, attention="sdpa", fuse=True, storage="compute", adapter=None,
                            loras=()):
        from comfyui_h3.backend.attention.dispatch import get_attention

        cfg = H3TransformerConfig.from_json(os.path.join(folder, "config.json"))
        with torch.device("meta"):
            model = H3Transformer(cfg, get_attention(attention) if isinstance(attention, str) else attention)
        model = model.to(dtype).to_empty(device=dev)
        random_dit_(model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith(FP32_MODULE_PREFIXES):
                    p.data = p.data.float()
        if adapter is not None:  # --fasth3: random learned VSA gates (the adapter file only marks the student)
            gen = torch.Generator(device=dev).manual_seed(1)  # the same gates on every rank
            with torch.no_grad():
                for block in model.transformer_blocks:
                    block.attn.add_gate(torch.empty_like(block.attn.to_q.weight).normal_(0.0, 0.02, generator=gen))
            model.vsa_gates = True
        # LoRAs, rotary table, fused QKV, FP8: as loaded
        return finish_loading(model, cfg, dev, fuse=fuse, storage=storage, loras=loras)

    components.load_h3_transformer = load_h3_transformer
    components.load_text_encoder = lambda folder, dtype: text_encoder(str(folder), device, dtype)
    components._load_diffusers = lambda cls, kind, folder, dtype: diffusers_module(cls, str(folder), device, dtype)
    components.stored_shapes = lambda folder: {}  # the skeleton has configs only


def cuda_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def log(rank: int, text: str) -> None:
    """Progress on stderr (rank 0 only; stdout carries the JSON): if a device call's time runs out mid-request, what
    was measured so far is still in its output."""
    if rank == 0:
        print(f"[e2e] {text}", file=sys.stderr, flush=True)


def our_config(args, folder, device, world: int = 1, port: int = 0):
    """The engine config our side runs: what a loader node / the CLI would build for this machine."""
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy as WeightPolicy

    weights = WeightPolicy(adaln="cache" if args.adaln_cache else "direct", storage="fp8" if args.fp8 else "compute")
    compile_ = "off" if args.no_compile or device.type != "cuda" else "on"
    attention, student = "sdpa", None
    if args.fasth3:  # the student's path: gates in every block, VSA, the 4-step ladder
        from comfyui_h3.backend.attention.vsa import spec
        from comfyui_h3.tiny_model import ensure_tiny_student

        attention, student = spec(args.vsa_topk, 0), str(ensure_tiny_student())
    engine = dict(device=device.type, world_size=world, attention=attention, weights=weights)  # "cuda": rank r on
    if world > 1:  # cuda:r (CUDA_VISIBLE_DEVICES picks the GPUs); CPU ranks share the host's cores
        engine.update(master_port=port, cpu_threads=max(1, (os.cpu_count() or 1) // world) if device.type == "cpu"
                      else 0)
    return h3_config(folder, dtype=args.dtype, vae_dtype=args.dtype, compile=compile_, student=student, **engine)


def run_ours(args, folder, device, rank: int = 0, world: int = 1, port: int = 0) -> dict:
    """One rank of our side. world > 1: this process is rank `rank` of `world` (started by run_sp); it joins the
    process group and builds its pipeline through the engine worker's own setup_rank (ParallelContext, Ulysses)."""
    from comfyui_h3.backend.executor.worker import setup_rank
    from comfyui_h3.backend.manifest import engine_part
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    patch_our_loaders(device)
    config = our_config(args, folder, device, world, port)
    t0 = time.perf_counter()
    pipe, _ = setup_rank(rank, world, config, "127.0.0.1", port)  # threads, process group (world > 1), pipeline
    build_s = time.perf_counter() - t0
    log(rank, f"rank 0 built its pipeline in {build_s:.1f} s (the DiT loads in the warm-up request)")

    def request(steps):
        return H3Request(prompt=PROMPT, num_frames=args.frames, steps=steps, seed=42, width=args.width,
                         height=args.height, schedule="fasth3" if args.fasth3 else "default")

    def run(steps, on_step=None):  # what the worker's run_job does: every rank runs the request; rank 0 reports
        # progress; a Stop flag polled at every step boundary (agreed across ranks, as in the engine)
        return pipe.run(request(steps), on_step=on_step if rank == 0 else None, should_stop=lambda: False)

    t0 = time.perf_counter()
    run(args.warmup_steps)
    cuda_sync()
    warm_s = time.perf_counter() - t0
    log(rank, f"warm-up request ({args.warmup_steps} steps, DiT load and compile included) {warm_s:.1f} s")
    # the DiT loaded in the warm-up; the text encoder is rank 0's alone
    check_same_weights({"transformer": pipe.c.transformer_for("t2va"), "vae": pipe.c.vae,
                        "audio_vae": pipe.c.audio_vae}, rank, world)
    barrier(world)  # the timed request starts together on every rank
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = run(args.steps, lambda done, total, **_: log(rank, f"step {done}/{total} queued at "
                                                              f"{time.perf_counter() - t0:.1f} s (host clock)"))
    cuda_sync()
    total = time.perf_counter() - t0
    if rank != 0:
        return {}
    manifest = engine_part(getattr(result, "manifest", None) or {}, config, build_s)
    video = result.frames
    if args.outputs:  # the final latents too: the denoised result itself
        save_outputs(args.outputs, video, result.audio, video_latents=result.video_latents,
                     audio_latents=result.audio_latents)
    return {"side": "ours", "e2e_s": total, "build_s": build_s, "warmup_s": warm_s,
            "video": list(video.shape), "video_dtype": str(video.dtype),
            "audio": list(result.audio.shape) if getattr(result, "audio", None) is not None else None,
            "weights": {"adaln": config.weights.adaln, "storage": config.weights.storage,
                        "compile": config.options.compile},
            "attention": str(config.attention), "fasth3": bool(args.fasth3),
            "latents_norm": {"video": result.video_latents.double().norm().item(),
                             "audio": result.audio_latents.double().norm().item()},
            "manifest": manifest}


def save_outputs(path: str, frames: torch.Tensor, audio: torch.Tensor | None, **latents) -> None:
    """--outputs: what the request produced, small enough to keep at any size, for comparing runs (the SP test: N
    ranks vs one): each decoded frame's mean ([F, H, W, 3] -> [F]; the decode is split over the ranks), the
    soundtrack, and ours' final latents."""
    torch.save({"frames_shape": list(frames.shape), "frame_means": frames.double().mean(dim=(1, 2, 3)),
                "audio": None if audio is None else audio.float().cpu(), **latents}, path)


def fingerprint(modules: dict) -> dict:
    """Per component, the float64 sum and sum of squares of a strided sample (<= 4096 values) of every parameter and
    buffer: cheap at 33B parameters, wherever the weights live (device, pinned host, FP8)."""
    prints = {}
    for name, module in modules.items():
        sums = {}  # per device holding weights: summed there, one copy to the host at the end
        for tensor in list(module.parameters()) + list(module.buffers()):
            flat = tensor.detach().reshape(-1)
            sample = flat[::max(1, flat.numel() // 4096)].double()
            part = torch.stack([sample.sum(), sample.square().sum()])
            sums[part.device] = sums[part.device] + part if part.device in sums else part
        prints[name] = sum((v.cpu() for v in sums.values()), torch.zeros(2, dtype=torch.float64)).tolist()
    return prints


def check_same_weights(modules: dict, rank: int, world: int) -> None:
    """Every rank holds the same random weights (what makes N ranks one model): the fingerprints are gathered and
    compared on every rank, so all of them raise together, naming the component, instead of running on."""
    if world == 1:
        return
    import torch.distributed as dist

    gathered = [None] * world
    dist.all_gather_object(gathered, fingerprint(modules))
    for other in range(1, world):
        for name, want in gathered[0].items():
            got = gathered[other][name]
            if any(abs(a - b) > 1e-9 * max(1.0, abs(a)) for a, b in zip(want, got)):
                raise RuntimeError(f"rank {other}'s random {name} weights differ from rank 0's (fingerprint {got} vs "
                                   f"{want}): every rank must build the same weights (seeded(), random_dit_)")


def barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def run_diffusers(args, folder, device, rank: int = 0, world: int = 1, port: int = 0) -> dict:
    """One rank of diffusers' side. world > 1: rank `rank` of `world` (started by run_sp) with the transformer under
    diffusers' own Ulysses context parallelism (enable_parallelism(ContextParallelConfig(ulysses_degree=world))); every
    rank runs the whole modular pipeline (its own text encoder and VAE decode, as diffusers does), rank 0 reports."""
    from diffusers import (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Blocks,
                           MiniMaxH3Transformer3DModel)

    if world > 1:
        from comfyui_h3.backend.executor.worker import _init_process_group

        torch.set_grad_enabled(False)
        if device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        _init_process_group(rank, world, str(device), "127.0.0.1", port)  # the engine's group: NCCL + gloo / gloo
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    pipe = MiniMaxH3Blocks().init_pipeline(folder)
    pipe.load_components(names=["tokenizer", "processor", "scheduler", "audio_scheduler"])
    transformer = random_dit_(diffusers_module(MiniMaxH3Transformer3DModel, os.path.join(folder, "transformer"),
                                               device, dtype))
    with torch.no_grad():  # the released mixed precision: these modules are float32 in the checkpoint
        from comfyui_h3.backend.models.tiny import TRANSFORMER_FP32_PREFIXES
        for name, p in transformer.named_parameters():
            if name.startswith(TRANSFORMER_FP32_PREFIXES):
                p.data = p.data.float()
    if world > 1:
        enable_diffusers_ulysses(transformer, world, device)
    parts = dict(transformer=transformer,
                 vae=diffusers_module(AutoencoderKLMiniMaxH3, os.path.join(folder, "vae"), device, dtype),
                 audio_vae=diffusers_module(AutoencoderKLMiniMaxH3Audio, os.path.join(folder, "audio_vae"), device,
                                            dtype),
                 text_encoder=text_encoder(os.path.join(folder, "text_encoder"), device, dtype, layers=51))
    pipe.update_components(**parts)
    build_s = time.perf_counter() - t0
    check_same_weights(parts, rank, world)
    log(rank, f"diffusers' pipeline built in {build_s:.1f} s")
    from cuda_timing import EventTimer

    dit_timer = EventTimer(transformer)
    vae_timer = EventTimer(pipe.vae, "decode")

    def call(steps):  # diffusers' num_inference_steps counts grid points: N give N - 1 DiT evaluations; ours
        # counts evaluations (schedule.py), so both run `steps` DiT forwards
        return pipe(prompt=PROMPT, num_frames=args.frames, height=args.height, width=args.width,
                    num_inference_steps=steps + 1, generator=torch.Generator(device).manual_seed(42),
                    output_type="np", output=["videos", "audio"])  # frames on the host as arrays, like ours
                                                                 # (the default "pil" adds PIL images to the time)

    t0 = time.perf_counter()
    with torch.no_grad():
        call(args.warmup_steps)
    cuda_sync()
    warm_s = time.perf_counter() - t0
    log(rank, f"warm-up request ({args.warmup_steps} steps) {warm_s:.1f} s")
    dit_timer.reset()
    vae_timer.reset()
    barrier(world)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = call(args.steps)
    cuda_sync()
    total = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None
    peaks = [peak]
    if world > 1:
        import torch.distributed as dist

        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
    if rank != 0:
        return {}
    videos = out["videos"] if isinstance(out, dict) else out[0]
    shape = list(videos.shape) if hasattr(videos, "shape") else [len(videos)]
    if args.outputs:  # videos: [prompts, frames, H, W, 3] floats in [0, 1] (output_type "np"): as uint8 like ours
        import numpy as np

        frames = torch.from_numpy((np.asarray(videos[0]) * 255.0).round().clip(0, 255).astype(np.uint8))
        audio = out["audio"] if isinstance(out, dict) else out[1]
        save_outputs(args.outputs, frames, torch.as_tensor(np.asarray(audio[0] if len(audio) == 1 else audio)))
    return {"side": "diffusers", "e2e_s": total, "build_s": build_s, "warmup_s": warm_s, "video": shape,
            "dit_s": dit_timer.seconds(), "dit_calls": dit_timer.calls, "vae_decode_s": vae_timer.seconds(),
            "peak_gib": max(peaks) if peak is not None else None,
            "peak_gib_per_rank": peaks if peak is not None else None}


def enable_diffusers_ulysses(transformer, world: int, device) -> None:
    """diffusers' own Ulysses for its transformer (what bench/sp_scaling.py --peer measures). diffusers 0.42.1 takes
    the rank's device and mesh type from the host's accelerator (rank % torch.accelerator.device_count(): a division
    by zero on a host without one, a CUDA mesh beside CPU ranks on a GPU host); for CPU ranks (--tiny) both queries
    read "cpu, one device" while the mesh is built. On GPUs nothing is changed."""
    from unittest import mock

    from diffusers import ContextParallelConfig

    config = ContextParallelConfig(ulysses_degree=world)
    if device.type != "cpu":
        transformer.enable_parallelism(config=config)
        return
    with mock.patch.object(torch._C, "_get_accelerator", lambda *a, **k: torch.device("cpu")), \
            mock.patch.object(torch.accelerator, "device_count", lambda: 1):
        transformer.enable_parallelism(config=config)


def run_sp(args, folder) -> dict:
    """--sp N: N processes (torch.multiprocessing spawn), one per device (cuda:0..N-1, or N CPU ranks with --tiny), each
    building the same random weights and joining one process group; rank 0's result. A rank that raises or dies ends
    every rank (the spawn context terminates the others) and this run with its error; so does --timeout."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    from comfyui_h3.backend.executor.mp_executor import _free_port

    out = os.path.join(os.path.dirname(folder), "rank0.json")
    context = mp.start_processes(_sp_rank, args=(args, folder, _free_port(), out), nprocs=args.sp, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        while not context.join(timeout=5 if deadline is None else min(5.0, max(0.05, deadline - time.monotonic())),
                               grace_period=10):
            if deadline is not None and time.monotonic() >= deadline:
                raise SystemExit(f"e2e --sp {args.sp}: the ranks did not finish within --timeout {args.timeout:g} s; "
                                 "stopped them all (rank 0's progress lines above show how far they got).")
    except ProcessException as exc:
        print(str(exc), file=sys.stderr)
        raise SystemExit(f"e2e --sp {args.sp}: rank {exc.error_index} failed ({str(exc).strip().splitlines()[-1]}); "
                         "every rank was stopped.") from None
    finally:
        for process in context.processes:  # on the timeout, Ctrl-C or an error here: no rank outlives the run
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
    with open(out) as handle:
        return json.load(handle)


def _sp_rank(rank: int, args, folder: str, port: int, out: str) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    run = run_ours if args.side == "ours" else run_diffusers
    result = run(args, folder, device, rank, args.sp, port)
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(result, handle, default=str)
    from comfyui_h3.backend.executor.worker import close_process_group

    barrier(args.sp)  # gloo aborts a peer whose connection closes while it still reads
    close_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=("ours", "diffusers"), required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--fp8", action="store_true", help="ours: FP8 GEMM weights")
    ap.add_argument("--no-adaln-cache", dest="adaln_cache", action="store_false")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny configs on the CPU")
    ap.add_argument("--fasth3", action="store_true",
                    help="ours: the FastH3 student's path (random learned VSA gates in every block, attention vsa "
                         "with --vsa-topk and no dense steps, the 4-step fasth3 schedule: --steps and "
                         "--warmup-steps become 4)")
    ap.add_argument("--vsa-topk", type=float, default=0.1, help="--fasth3: video tiles each video tile attends")
    ap.add_argument("--sp", type=int, default=1, metavar="N",
                    help="Ulysses sequence parallelism on N GPUs of this host (cuda:0..N-1; N CPU ranks with --tiny): "
                         "N processes, one process group, rank 0 reports")
    ap.add_argument("--timeout", type=float, default=0,
                    help="--sp: stop every rank and fail after this many seconds (0: none beyond the process "
                         "group's own 10-minute collective timeout)")
    ap.add_argument("--outputs", metavar="PATH",
                    help="torch.save a digest of the timed request's result here, to compare runs: each frame's mean, "
                         "the soundtrack, and (ours) the final video / audio latents")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.fasth3 and args.side != "ours":
        ap.error("--fasth3 runs our side only (diffusers has no FastH3 student)")
    if args.sp < 1:
        ap.error(f"--sp must be >= 1, got {args.sp}")
    from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    args.device = device.type
    if args.sp > 1 and device.type == "cuda" and torch.cuda.device_count() < args.sp:
        ap.error(f"--sp {args.sp} needs {args.sp} visible GPUs; this host shows {torch.cuda.device_count()} "
                 "(check CUDA_VISIBLE_DEVICES)")
    if args.tiny:
        args.width, args.height, args.dtype = 64, 64, "float32"
        args.steps, args.warmup_steps = min(args.steps, 3), 2
    else:
        args.width, args.height = 1344, 768
    if args.fasth3:
        args.steps = args.warmup_steps = 4
    args.frames = frames_for_seconds(args.seconds)
    root = tempfile.mkdtemp(prefix="h3-e2e-")
    try:
        folder = make_skeleton(root, args.tiny)
        if args.sp > 1:
            try:  # e.g. a degree that does not divide the heads (the same DiT on both sides): one line, before a
                our_config(args, folder, device, args.sp).validate()  # rank starts
            except ValueError as exc:
                raise SystemExit(f"e2e --sp {args.sp}: {exc}") from None
            result = run_sp(args, folder)
        else:
            run = run_ours if args.side == "ours" else run_diffusers
            result = run(args, folder, device)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.update(machine=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                  seconds=args.seconds, frames=args.frames, size=f"{args.width}x{args.height}", steps=args.steps,
                  dtype=args.dtype, sp_degree=args.sp)
    text = json.dumps(result, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
