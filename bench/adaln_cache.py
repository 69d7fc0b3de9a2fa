"""The AdaLN projection table cache (weight policy adaln="cache") on a full-size H3 DiT with random bf16 weights, one
GPU: one denoise step at the 10-s 1344x768 shape (73,888 rows) through the engine's driver (denoise.py), direct
projection vs cached tables.

    python bench/adaln_cache.py [--seconds 10] [--layers 50] [--iters 2] [--rounds 4] [--compile] [--json OUT.json]
    python bench/adaln_cache.py --tiny        # a tiny config on the CPU (or GPU): checks the script end to end

The step is a mid-schedule step of a 50-step t2va plan (video and audio on their own clocks: 2 distinct timesteps,
3 used AdaLN rows). Reports: outputs bitwise equal (cache vs direct), resident DiT weight bytes on the device with
and without the cache (parameters + buffers; the fused QKV weights are buffers) and torch's allocated bytes, the
tables' bytes, step time of each (median of --iters after one warm-up; the cache's warm-up is its build), their ratio,
peak memory, the time to move the projection weights to host memory and to build a whole 50-step plan's tables;
then --rounds interleaved pairs (direct, cached / cached, direct, alternating) and their medians' ratio, free of the
drift of a GPU warming up between the two sequential runs.
One JSON line on stdout. Full size: ~62 GiB of weights, ~6 DiT forwards (~20 s each eager): under 3 minutes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfyui_h3.backend.models.h3_transformer import (FP32_MODULE_PREFIXES, H3Transformer,  # noqa: E402
                                                      H3TransformerConfig)
from comfyui_h3.backend.pipelines.h3.adaln_cache import AdaLNCache, StepInfo  # noqa: E402
from comfyui_h3.backend.pipelines.h3.denoise import denoise  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds, resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import DualSchedule, row_t  # noqa: E402
from comfyui_h3.backend.pipelines.h3.step_plan import StepPlan  # noqa: E402

TINY = dict(num_attention_heads=4, attention_head_dim=24, hidden_size=96, num_layers=3, num_refiner_layers=1,
            ffn_dim=128, text_dim=64, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=48, rope_freq_dim=4)
STEPS, MID = 50, 25  # the plan the step comes from, and which step


def _model(cfg: H3TransformerConfig, dev, dtype) -> H3Transformer:
    """Random weights in the release's precisions (float32 modules stay float32), norms at 1."""
    with torch.device("meta"):
        model = H3Transformer(cfg)
    model = model.to(dtype).to_empty(device=dev)  # cast on meta: never a float32 copy of 33B params
    gen = torch.Generator(device=dev).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(FP32_MODULE_PREFIXES):
                p.data = p.data.float()
            if "norm" in name and name.endswith("weight") and "norm_out.linear" not in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
    model.rope_inv_freq = model.rope_inv_freq.to(dev, torch.float32)
    model.fuse_projections()
    return model.eval().requires_grad_(False)


def _resident_bytes(model, dev) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers()) if t is not None}
    return sum(t.numel() * t.element_size() for t in tensors.values() if t.device.type == dev.type)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(fn, iters: int, dev) -> tuple[list[float], float]:
    """ms of each call (CUDA events on a GPU, wall clock on the CPU) and the peak GiB allocated during them."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(iters):
        _sync(dev)
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    return times, peak


def mid_step_setup(args, script: str):
    """The full-size (or --tiny) DiT with random weights, compiled if asked, and one mid-schedule t2va step's plan
    and inputs (the benches that time a denoise step share this), as a namespace."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.tiny:
        sys.exit(f"{script} needs a CUDA GPU at full size; use --tiny to check it on the CPU.")
    dtype = torch.bfloat16
    if args.tiny:
        cfg = H3TransformerConfig(**TINY)
        geo, text_rows = resolve_geometry(124, 64, 96), 7
    else:
        cfg = H3TransformerConfig(num_layers=args.layers)
        geo, text_rows = resolve_geometry(frames_for_seconds(args.seconds), 768, 1344), args.text
    t0 = time.perf_counter()
    model = _model(cfg, dev, dtype)
    if args.compile:
        from comfyui_h3.backend.pipelines.h3.components import compile_blocks

        compile_blocks(model)
    layout = build_layout(torch.ones(text_rows, dtype=torch.long), geo, cfg.patch_size)
    schedule = DualSchedule.make(STEPS + 1, 12.0, 3.0)
    vt, at = float(schedule.video_t(MID)), float(schedule.audio_t(MID))
    one_step = DualSchedule(schedule.video_sigmas[MID:MID + 2], schedule.audio_sigmas[MID:MID + 2])
    gen = torch.Generator().manual_seed(1)
    text = torch.randn(1, text_rows, cfg.text_dim, generator=gen).to(dev, dtype)
    plan = StepPlan(layout, text, one_step, lambda i: row_t(layout, vt, at))
    video0 = torch.randn(layout.video_indices.numel(), cfg.video_patch_dim, generator=gen).to(dev)
    audio0 = torch.randn(layout.audio_indices.numel(), cfg.audio_in_channels, generator=gen).to(dev)
    print(f"{layout.seq_len} rows, {cfg.num_layers} blocks, hidden {cfg.hidden_size}, bf16, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}; setup {time.perf_counter() - t0:.1f} s",
          file=sys.stderr, flush=True)
    return types.SimpleNamespace(dev=dev, cfg=cfg, model=model, geo=geo, layout=layout, schedule=schedule, vt=vt,
                                 at=at, gen=gen, text=text, plan=plan, video0=video0, audio0=audio0, t0=t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--text", type=int, default=502, help="text rows")
    ap.add_argument("--layers", type=int, default=50, help="DiT blocks (the release has 50)")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="interleaved direct / cached step pairs (0: none)")
    ap.add_argument("--compile", action="store_true", help="compile each block as the engine does on CUDA")
    ap.add_argument("--tiny", action="store_true", help="a tiny config and shape (CPU when there is no GPU)")
    ap.add_argument("--json")
    args = ap.parse_args()

    setup = mid_step_setup(args, "bench/adaln_cache.py")
    dev, cfg, model, layout, schedule, text = setup.dev, setup.cfg, setup.model, setup.layout, setup.schedule, setup.text
    plan, video0, audio0, t0 = setup.plan, setup.video0, setup.audio0, setup.t0

    def step(adaln=None):
        return denoise(model, plan, video0.clone(), audio0.clone(), adaln=adaln)

    r = {"bench": "adaln_cache", "rows": layout.seq_len, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
         "dtype": "bfloat16", "compiled": args.compile, "tiny": args.tiny, "torch": torch.__version__,
         "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    with torch.no_grad():
        want = step()  # warm-up, and the reference output
        direct_ms, r["peak_gib_direct"] = _timed(step, args.iters, dev)
        gc.collect()
        _sync(dev)
        r["resident_weight_bytes_direct"] = _resident_bytes(model, dev)
        allocated_before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0

        t1 = time.perf_counter()
        cache = AdaLNCache(model)  # the projection weights leave the device here
        _sync(dev)
        r["offload_s"] = time.perf_counter() - t1
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        r["resident_weight_bytes_cache"] = _resident_bytes(model, dev)
        got = step(cache)  # builds the step's tables (a miss), then runs
        r["first_cached_step_build_s"] = cache.stats["build_s"]
        cache_ms, r["peak_gib_cache"] = _timed(lambda: step(cache), args.iters, dev)
        if dev.type == "cuda":
            r["allocated_saved_gib"] = (allocated_before - torch.cuda.memory_allocated(dev)) / 2**30
        # The same comparison interleaved (direct, cached, cached, direct, ...): the runs above come one after the
        # other, so a GPU that slows as it warms up over the minute between them biases their ratio. Direct steps
        # run with the projection weights restored to the device for the step (the copy is outside the timing).
        rounds = {"direct": [], "cache": []}
        for i in range(args.rounds):
            for name in (("direct", "cache") if i % 2 == 0 else ("cache", "direct")):
                if name == "direct":
                    with cache.weights_restored():
                        _sync(dev)
                        rounds["direct"] += _timed(step, 1, dev)[0]
                else:
                    rounds["cache"] += _timed(lambda: step(cache), 1, dev)[0]
        r["interleaved_direct_ms_all"], r["interleaved_cache_ms_all"] = rounds["direct"], rounds["cache"]
        r["bitwise_equal"] = bool(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))
        r["max_abs_diff"] = max((got[0] - want[0]).abs().max().item(), (got[1] - want[1]).abs().max().item())
        r["step_table_bytes"] = cache.table_bytes
        report = cache.report()

        # A whole 50-step t2va plan's tables: what a request with new timesteps costs once.
        full = StepPlan.on_clocks(layout, text, schedule)
        infos = [StepInfo.of(full.row_timesteps(i), layout.token_tags) for i in range(full.steps)]
        cache.evict()
        _sync(dev)
        t2 = time.perf_counter()
        cache.ensure(infos)
        _sync(dev)
        r["plan_build_s"] = time.perf_counter() - t2
        r["plan_table_bytes"] = cache.table_bytes
        r["plan_keys"] = cache.report()["table_keys"]

    r["direct_step_ms"] = statistics.median(direct_ms)
    r["cache_step_ms"] = statistics.median(cache_ms)
    r["direct_step_ms_all"], r["cache_step_ms_all"] = direct_ms, cache_ms
    r["ratio_cache_over_direct"] = r["cache_step_ms"] / r["direct_step_ms"]
    if args.rounds:
        r["interleaved_ratio_cache_over_direct"] = (statistics.median(r["interleaved_cache_ms_all"])
                                                    / statistics.median(r["interleaved_direct_ms_all"]))
    r["weight_bytes_host"] = report["weight_bytes_host"]
    r["pinned"] = report["pinned"]
    r["resident_weight_gib_direct"] = r["resident_weight_bytes_direct"] / 2**30
    r["resident_weight_gib_cache"] = r["resident_weight_bytes_cache"] / 2**30
    r["resident_saved_gib"] = r["resident_weight_gib_direct"] - r["resident_weight_gib_cache"]
    r["plan_table_mib"] = r["plan_table_bytes"] / 2**20
    r["total_s"] = time.perf_counter() - t0
    print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(r, handle, indent=1)
    if not r["bitwise_equal"]:
        sys.exit("cache output differs from the direct projection")


if __name__ == "__main__":
    main()
