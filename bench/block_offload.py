"""Block offload (weight placement "offload", issue 14 item 2) at full size on one GPU: the H3 DiT with every block
resident vs every block streamed from pinned host memory (models/block_offload.py), same random bf16 weights, same
inputs, regional torch.compile as the engine does on CUDA. Default shape: 10 s at 1344x768 (243 frames -> 72,576
video + 810 audio + 502 text = 73,888 packed rows), all 50 blocks.

    python bench/block_offload.py [--seconds 10] [--blocks 50] [--resident 0] [--iters 1] [--trace OUT.json]
    python bench/block_offload.py --tiny          # CPU smoke test of the whole script (tiny model, no GPU)

Prints one JSON object per line (phase = setup / resident / attach / offload / profile / memory / summary):
- forward time (CUDA events; one forward = one denoise step's model call) resident vs streamed, and the ratio;
- output equality, bit for bit (the bit patterns of the float32 velocity heads);
- peak device memory of the streamed forward, the measured activation bytes per packed row next to the estimate
  that "auto" uses (pipelines/h3/offload.py), and the smallest GPU this shape then needs (peak reserved + what the
  CUDA context and libraries hold outside torch's allocator);
- from a torch.profiler trace of one streamed forward: host->device copies (count, bytes, GB/s, stream), the
  fraction of copy time that overlaps compute kernels, the copy time left exposed, and how busy the compute stream
  was over the forward.
Order: resident first (compiles the block; the streamed run reuses the same graph), then the blocks are moved to
pinned host homes (timed: what an engine load pays once), then the streamed forwards and the profiled one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfyui_h3.backend.models.block_offload import module_tensors  # noqa: E402
from comfyui_h3.backend.models.h3_ops import rope_inv_freq  # noqa: E402
from comfyui_h3.backend.models.h3_transformer import (FP32_MODULE_PREFIXES, H3Transformer,  # noqa: E402
                                                       H3TransformerConfig)
from comfyui_h3.backend.pipelines.h3 import offload  # noqa: E402
from comfyui_h3.backend.pipelines.h3.components import compile_blocks  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan  # noqa: E402
from comfyui_h3.backend.pipelines.h3.step_plan import request_rope, step_segments  # noqa: E402

GIB = 2 ** 30
TINY = dict(num_attention_heads=2, attention_head_dim=32, hidden_size=48, num_layers=5, num_refiner_layers=1,
            ffn_dim=96, text_dim=40, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=24, rope_freq_dim=4)
T0 = time.perf_counter()


def emit(phase: str, **values) -> None:
    print(json.dumps({"phase": phase, "elapsed_s": round(time.perf_counter() - T0, 1), **values}), flush=True)


def build_dit(cfg: H3TransformerConfig, device: torch.device, dtype: torch.dtype, seed: int) -> H3Transformer:
    """Random weights straight on the device (normal 0.02, norm weights 1), the release's mixed precision: the
    float32 modules float32, everything else `dtype`; Q/K/V fused as the loader does."""
    with torch.device("meta"):
        model = H3Transformer(cfg)
    for name, child in model.named_children():
        child.to(torch.float32 if f"{name}." in FP32_MODULE_PREFIXES else dtype)
    model = model.to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name.rsplit(".", 2)[-2] and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
    model.rope_inv_freq = rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta).to(device)
    model.fuse_projections()
    return model.eval().requires_grad_(False)


class Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time(self, fn) -> tuple[float, object]:
        """(milliseconds, result) of one call, measured on the device."""
        if not self.cuda:
            t = time.perf_counter()
            out = fn()
            return (time.perf_counter() - t) * 1e3, out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), out


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                      b.contiguous().view(torch.uint8))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ---- the profile ----------------------------------------------------------------------------------------------

def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _covered(interval: tuple[float, float], union: list[tuple[float, float]]) -> float:
    s, e = interval
    return sum(max(0.0, min(e, ue) - max(s, us)) for us, ue in union if us < e and ue > s)


def overlap_summary(events: list[dict], min_copy_bytes: int = 1 << 20) -> dict:
    """Chrome-trace events of one profiled forward -> how the host->device weight copies sat against the compute
    kernels: copy time overlapping any kernel / all copy time, exposed copy time, compute busy fraction."""
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
               if e.get("cat") == "kernel" and e.get("ph") == "X"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and e.get("ph") == "X" and "HtoD" in e.get("name", "")
              and int(e.get("args", {}).get("bytes", min_copy_bytes)) >= min_copy_bytes]
    union = _union(kernels)
    copy_us = sum(float(e["dur"]) for e in copies)
    overlapped = sum(_covered((float(e["ts"]), float(e["ts"]) + float(e["dur"])), union) for e in copies)
    copy_bytes = sum(int(e.get("args", {}).get("bytes", 0)) for e in copies)
    span = (max(e for _, e in union) - min(s for s, _ in union)) if union else 0.0
    busy = sum(e - s for s, e in union)
    gaps = [union[i + 1][0] - union[i][1] for i in range(len(union) - 1)]
    bubbles = [g for g in gaps if g > 500.0]  # the device idle > 0.5 ms: what an exposed copy would leave
    return {
        "copies": len(copies), "copy_bytes": copy_bytes, "copy_ms": round(copy_us / 1e3, 3),
        "copy_GBps": round(copy_bytes / (copy_us * 1e3), 2) if copy_us else None,
        "copy_streams": sorted({e.get("args", {}).get("stream") for e in copies}, key=str),
        "kernel_streams": sorted({e.get("args", {}).get("stream") for e in events if e.get("cat") == "kernel"},
                                 key=str),
        "copy_overlap_fraction": round(overlapped / copy_us, 4) if copy_us else None,
        "exposed_copy_ms": round((copy_us - overlapped) / 1e3, 3),
        "kernels": len(kernels), "kernel_busy_ms": round(busy / 1e3, 3), "forward_span_ms": round(span / 1e3, 3),
        "compute_busy_fraction": round(busy / span, 4) if span else None,
        "idle_gaps_over_0.5ms": len(bubbles), "idle_gaps_over_0.5ms_total_ms": round(sum(bubbles) / 1e3, 3),
    }


def _self_test_overlap() -> dict:
    """The overlap arithmetic on a hand-made trace: two kernels 0-10 and 12-20 us, copies 2-8 (inside), 9-13 (2 of
    4 us under kernels) and 30-32 (none): overlap 8 of 12 us."""
    k = lambda ts, dur: {"cat": "kernel", "ph": "X", "ts": ts, "dur": dur, "args": {"stream": 7}}  # noqa: E731
    c = lambda ts, dur: {"cat": "gpu_memcpy", "ph": "X", "name": "Memcpy HtoD (Pinned -> Device)", "ts": ts,  # noqa
                         "dur": dur, "args": {"stream": 9, "bytes": 1 << 21}}
    got = overlap_summary([k(0, 10), k(12, 8), c(2, 6), c(9, 4), c(30, 2)])
    assert got["copies"] == 3 and abs(got["copy_overlap_fraction"] - 8 / 12) < 1e-4, got
    assert abs(got["exposed_copy_ms"] - 0.004) < 1e-9 and abs(got["compute_busy_fraction"] - 18 / 20) < 1e-4, got
    return got


def profile_forward(forward, cuda: bool, trace_path: str | None) -> dict:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        forward()
        if cuda:
            torch.cuda.synchronize()
    path = trace_path or os.path.join(tempfile.mkdtemp(prefix="block_offload_"), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    summary = overlap_summary(events)
    if trace_path is None:
        os.remove(path)
    else:
        summary["trace"] = trace_path
    return summary


# ---- main -----------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="Video length at --width x --height, 24 fps.")
    ap.add_argument("--width", type=int, default=1344)
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--text", type=int, default=502, help="Prompt rows.")
    ap.add_argument("--blocks", type=int, default=None, help="DiT blocks (default: the release's 50).")
    ap.add_argument("--resident", type=int, default=0, help="Blocks kept resident in the streamed run (0 = all "
                                                            "streamed).")
    ap.add_argument("--prefetch", type=int, default=1, help="Blocks copied ahead (slots = prefetch + 1).")
    ap.add_argument("--iters", type=int, default=1, help="Timed forwards per variant (after the warm-up).")
    ap.add_argument("--no-compile", action="store_true", help="Eager blocks (the engine compiles on CUDA).")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--trace", default=None, help="Keep the profiler's chrome trace here.")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model and shape, no GPU needed.")
    args = ap.parse_args()

    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        cfg = H3TransformerConfig(**TINY)
        seconds, width, height, n_text = 5.0, 64, 64, 8
        emit("self_test", overlap=_self_test_overlap())
    else:
        if not torch.cuda.is_available():
            sys.exit("bench/block_offload.py needs a CUDA GPU (or --tiny for the CPU smoke test).")
        device, dtype = torch.device("cuda"), torch.bfloat16
        cfg = H3TransformerConfig()
        seconds, width, height, n_text = args.seconds, args.width, args.height, args.text
    if args.blocks is not None:
        cfg.num_layers = args.blocks
    cuda = device.type == "cuda"
    clock = Clock(device)

    geo = resolve_geometry(int(round(seconds * 24)), height, width)
    layout = build_layout(torch.ones(n_text, dtype=torch.long), geo, cfg.patch_size)
    ts, row_index = row_timestep_plan(layout, 0.4, 0.6)
    segments = step_segments(layout.token_tags, row_index, None)  # host tensors: no sync inside the forward
    rows = layout.seq_len
    dit = build_dit(cfg, device, dtype, seed=0)
    gen = torch.Generator(device).manual_seed(1)
    dl = layout.to(device)
    rope = request_rope(dit, dl.position_ids)
    video = torch.randn(1, layout.video_indices.numel(), cfg.video_patch_dim, device=device, generator=gen)
    audio = torch.randn(1, layout.audio_indices.numel(), cfg.audio_in_channels, device=device, generator=gen)
    text = torch.randn(1, n_text, cfg.text_dim, device=device, generator=gen).to(dtype)
    ts_dev, idx_dev = ts.to(device), row_index.to(device)

    @torch.no_grad()
    def forward():
        return dit(video, audio, text, ts_dev, idx_dev, dl.token_tags, dl.position_ids, dl.video_indices,
                   dl.audio_indices, dl.text_indices, rope=rope, segments=segments)

    block_bytes = sum(t.numel() * t.element_size() for t in module_tensors(dit.transformer_blocks[0]))
    emit("setup", device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__,
         shape=f"{seconds:g} s {width}x{height}", frames=geo.num_frames, rows=rows,
         video_rows=int(layout.video_indices.numel()), audio_rows=int(layout.audio_indices.numel()), text_rows=n_text,
         blocks=cfg.num_layers, block_bytes=block_bytes, dtype=str(dtype), compiled=not args.no_compile)

    if not args.no_compile:
        compile_blocks(dit)
    import torch._dynamo.utils as dynamo_utils

    # 1. every block resident
    warm_ms, _ = clock.time(forward)  # compiles the block (one graph for all 50)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    resident_ms, outs = [], None
    for _ in range(args.iters):
        ms, outs = clock.time(forward)
        resident_ms.append(ms)
    want = tuple(t.detach().clone() for t in outs)
    del outs
    resident_peak = torch.cuda.max_memory_allocated() if cuda else 0
    emit("resident", warmup_ms=round(warm_ms, 1), forward_ms=[round(m, 1) for m in resident_ms],
         weights_on_device_gib=round(before / GIB, 3), peak_allocated_gib=round(resident_peak / GIB, 3),
         activation_gib=round((resident_peak - before) / GIB, 3),
         graphs=dynamo_utils.counters["stats"].get("unique_graphs", 0))

    # 2. the blocks into pinned host homes (an engine load pays this once), then the streamed plan
    t = time.perf_counter()
    streamer = offload.attach_block_offload(dit, device)
    home_s = time.perf_counter() - t
    streamer.prefetch = args.prefetch
    streamer.set_resident(args.resident)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    homes = streamer.homes
    emit("attach", home_build_s=round(home_s, 2), host_bytes=sum(h.nbytes for h in homes),
         pinned=all(h.pinned for h in homes) if cuda else None, resident_blocks=streamer.resident_count,
         streamed_blocks=len(streamer.streamed), slots=len(streamer._slots),
         device_allocated_gib=round(torch.cuda.memory_allocated() / GIB, 3) if cuda else None)

    # 3. streamed forwards: time, peak, equality
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    offload_ms, equal, errors = [], True, []
    for _ in range(args.iters):
        ms, outs = clock.time(forward)
        offload_ms.append(ms)
        equal = equal and all(bits_equal(g, w) for g, w in zip(outs, want))
        errors = [rel_err(g, w) for g, w in zip(outs, want)]
        del outs
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    peak_reserved = torch.cuda.max_memory_reserved() if cuda else 0
    emit("offload", forward_ms=[round(m, 1) for m in offload_ms], bitwise_equal=equal,
         rel_err_video_audio=errors, weights_on_device_gib=round(before / GIB, 3),
         peak_allocated_gib=round(peak / GIB, 3), peak_reserved_gib=round(peak_reserved / GIB, 3),
         activation_gib=round((peak - before) / GIB, 3),
         graphs=dynamo_utils.counters["stats"].get("unique_graphs", 0))

    # 4. one profiled streamed forward: do the copies overlap the compute?
    if not args.no_profile:
        emit("profile", **profile_forward(forward, cuda, args.trace), block_bytes=streamer.block_bytes)

    # 5. memory: measured vs the estimate "auto" uses, and what this shape needs with every block streamed
    measured_activation = peak - before
    estimate = offload.dit_activation_bytes(rows, rows)
    memory = {"activation_bytes_per_row_measured": round(measured_activation / rows) if cuda else None,
              "activation_estimate_bytes": estimate, "activation_measured_bytes": measured_activation,
              "estimate_over_measured": round(estimate / measured_activation, 3) if measured_activation else None}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        outside = (total - free) - torch.cuda.memory_reserved()  # CUDA context, cuBLAS/cuDNN handles
        memory.update(outside_allocator_gib=round(outside / GIB, 3),
                      min_gpu_gib_all_streamed=round((peak_reserved + outside) / GIB, 2))
        others = before - streamer.device_bytes()  # the DiT's other weights (+ this bench's inputs)
        for gpu_gib in (16, 24, 32, 48, 80):  # what auto would keep resident there (blocks + slots + estimate)
            available = gpu_gib * GIB - outside - others
            memory[f"auto_resident_blocks_{gpu_gib}GiB"] = (offload.resident_blocks_for(streamer, available, estimate)
                                                          if available >= streamer.device_bytes_for(0) + estimate
                                                          else "does not fit")
    emit("memory", **memory)

    ratio = statistics.median(offload_ms) / statistics.median(resident_ms)
    emit("summary", shape=f"{seconds:g} s {width}x{height}", rows=rows, blocks=cfg.num_layers,
         streamed_blocks=len(streamer.streamed), resident_forward_ms=round(statistics.median(resident_ms), 1),
         offload_forward_ms=round(statistics.median(offload_ms), 1), step_time_ratio=round(ratio, 4),
         target_ratio=1.05, meets_target=ratio <= 1.05 if cuda else None, bitwise_equal=equal,
         peak_allocated_gib=round(peak / GIB, 3), min_gpu_gib=memory.get("min_gpu_gib_all_streamed"))


if __name__ == "__main__":
    main()
