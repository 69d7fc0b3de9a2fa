"""Decode -> MP4 with the released-size H3 video VAE: the decode alone, decode then save, and the decode streamed
into StreamingVideoSaver clip by clip: RGB (CPU colour conversion) vs YUV 4:2:0 made on the GPU, the writer on a
thread of this process vs in a child process (encoder_process.py), the child niced or with x264 capped at half the
cores, the clips decoded eagerly vs replayed from a CUDA graph (`*_graphs`); in one run, with equal-frame checks.

    python bench/decode_stream.py                          # H200: 10 s at 1344x768 (243 frames), random bf16 VAE
    python bench/decode_stream.py --tiny --device cpu      # seconds-long smoke run on the CPU (tiny VAE)

Per variant: wall seconds, GPU seconds of the VAE clips (CUDA events around each `_decode_clip`, no syncs added), the
saver's stats (encoder-thread busy time, caller wait), and a checksum of the uint8 frames handed to the saver (must
equal the decode-alone checksum). `--profile` adds a torch.profiler table of the old streamed path's CPU-side ops.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfyui_h3.backend.media.stream_writer import StreamingVideoSaver  # noqa: E402
from comfyui_h3.backend.pipelines.h3.decode import iter_decode_video  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds, latent_frames  # noqa: E402


def cpu_facts() -> dict:
    facts = {"cpu_count": os.cpu_count()}
    try:
        facts["affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        try:
            with open(path) as handle:
                facts[os.path.basename(path)] = handle.read().strip()
        except OSError:
            pass
    return facts


def build_vae(tiny: bool, device, dtype):
    from diffusers import AutoencoderKLMiniMaxH3

    if tiny:
        from comfyui_h3.backend.models.tiny import TINY_VAE_CONFIG
        config = dict(TINY_VAE_CONFIG)
    else:
        config = {}  # the class defaults are the released configuration (2.60 B parameters)
    with torch.device(device):
        vae = AutoencoderKLMiniMaxH3(**config)
    return vae.to(dtype).eval().requires_grad_(False)


class ClipTimer:
    """Wraps vae._decode_clip with CUDA events (no host syncs): the GPU time the decoder itself took."""

    def __init__(self, vae, device):
        self.vae, self.cuda = vae, device.type == "cuda"
        self.inner = vae._decode_clip
        self.pairs: list = []
        self.cpu_s = 0.0
        vae._decode_clip = self

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.inner(*args, **kwargs)
            end.record()
            self.pairs.append((start, end))
        else:
            out = self.inner(*args, **kwargs)
        self.cpu_s += time.perf_counter() - t0
        return out

    def reset(self):
        self.pairs, self.cpu_s = [], 0.0

    def gpu_s(self) -> float:
        return sum(s.elapsed_time(e) for s, e in self.pairs) / 1000.0


def checksum(chunks) -> int:
    total = 0
    for i, chunk in enumerate(chunks):
        weights = torch.arange(1, chunk[0].numel() + 1, device=chunk.device, dtype=torch.int64) % 65521
        total += int((chunk.reshape(chunk.shape[0], -1).to(torch.int64) * weights).sum()) * (i + 1)
    return total


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(name, vae, timer, latents, device, out_dir, geo, args, saver_options=None, stream=True,
                cuda_graphs=False):
    """One pass: decode clip by clip; `saver_options` None = decode alone (chunks kept on the device);
    `cuda_graphs`: the clips after the first replayed from a CUDA graph (clip_graph.py). The graph captures the bare
    decoder, so the per-clip event timer is off for those runs (vae_gpu_s null)."""
    timer.reset()
    if cuda_graphs:
        vae._decode_clip = timer.inner
    try:
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        kept, saver = [], None
        if saver_options is not None:
            saver = StreamingVideoSaver(os.path.join(out_dir, f"{name}.mp4"), geo[1], geo[0], 24, crf=args.crf,
                                        preset=args.preset, device=device, **saver_options)
        decode_s = None
        for chunk in iter_decode_video(vae, latents, device, cuda_graphs=cuda_graphs):
            kept.append(chunk)
            if saver is not None and stream:
                saver.write(chunk)
        if saver is not None and not stream:
            sync(device)
            decode_s = time.perf_counter() - t0
            for chunk in kept:
                saver.write(chunk)
        if saver is not None:
            saver.close()
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        vae._decode_clip = timer
    result = {"variant": name, "wall_s": round(wall, 3), "cuda_graphs": cuda_graphs,
              "vae_gpu_s": None if cuda_graphs else round(timer.gpu_s(), 3),
              "vae_launch_cpu_s": None if cuda_graphs else round(timer.cpu_s, 3),
              "frames": sum(int(c.shape[0]) for c in kept), "checksum": checksum(kept)}
    if device.type == "cuda":
        result["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if decode_s is not None:
        result["decode_part_s"] = round(decode_s, 3)
    if saver is not None:
        result["saver"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in saver.stats.items()}
        result["gpu_yuv"] = saver.yuv420p
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--tiny", action="store_true", help="the tiny VAE (CPU smoke run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--crf", type=float, default=18)
    parser.add_argument("--preset", default="veryfast")
    parser.add_argument("--nice", type=int, default=10, help="encoder-process nice increment for the *_nice variant")
    parser.add_argument("--variants", default="all", help="comma list of variant names, or all")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    vae = build_vae(args.tiny, device, dtype)
    timer = ClipTimer(vae, device)
    frames = frames_for_seconds(args.seconds)
    height, width = (args.height, args.width)
    ratio = 16
    latents = torch.randn((1, 24, latent_frames(frames), height // ratio, width // ratio), device=device,
                          generator=torch.Generator(device=device).manual_seed(0))
    cores = os.cpu_count() or 2
    variants = {
        "decode_alone": None,
        "decode_then_save": dict(gpu_yuv=True, encoder="process"),
        "streamed_rgb_thread": dict(gpu_yuv=False, encoder="thread"),  # the path before this work
        "streamed_yuv_thread": dict(gpu_yuv=True, encoder="thread"),
        "streamed_rgb_process": dict(gpu_yuv=False, encoder="process"),
        "streamed_yuv_process": dict(gpu_yuv=True, encoder="process"),  # shipped: FileSink passes the device
        "streamed_yuv_process_nice": dict(gpu_yuv=True, encoder="process", encoder_nice=args.nice),
        "streamed_yuv_process_threads": dict(gpu_yuv=True, encoder="process", threads=max(1, cores // 2)),
        "streamed_yuv_process_frame_threads": dict(gpu_yuv=True, encoder="process", thread_type="frame"),
        # the clips replayed from a CUDA graph (clip_graph.py; opt-in: iter_decode_video(cuda_graphs=True))
        "decode_alone_graphs": None,
        "decode_then_save_graphs": dict(gpu_yuv=True, encoder="process"),
        "streamed_yuv_process_graphs": dict(gpu_yuv=True, encoder="process"),
        "streamed_yuv_process_frame_threads_graphs": dict(gpu_yuv=True, encoder="process", thread_type="frame"),
    }
    chosen = list(variants) if args.variants == "all" else args.variants.split(",")
    report = {"machine": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "cpu": cpu_facts(), "frames": frames, "size": f"{width}x{height}", "dtype": str(dtype),
              "vae_params": sum(p.numel() for p in vae.parameters()), "preset": args.preset, "crf": args.crf,
              "results": []}
    with tempfile.TemporaryDirectory() as out_dir:
        with torch.no_grad():
            for name, graphs in (("warmup", False), ("warmup_graphs", True)):
                run_variant(name, vae, timer, latents, device, out_dir, (height, width), args,
                            dict(gpu_yuv=True, encoder="process"), cuda_graphs=graphs)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for name in chosen:
                options = variants[name]
                result = run_variant(name, vae, timer, latents, device, out_dir, (height, width), args,
                                     None if options is None else dict(options),
                                     stream=not name.startswith("decode_then"),
                                     cuda_graphs=name.endswith("_graphs"))
                report["results"].append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
            if args.profile:
                from torch.profiler import ProfilerActivity, profile
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=acts) as prof:
                    run_variant("profiled_streamed_rgb_thread", vae, timer, latents, device, out_dir,
                                (height, width), args, dict(gpu_yuv=False, encoder="thread"))
                report["profile_top_cpu"] = prof.key_averages().table(sort_by="self_cpu_time_total",
                                                                     row_limit=18, max_name_column_width=48)
        if device.type == "cuda":
            report["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    base = next((r for r in report["results"] if r["variant"] == "decode_alone"), None)
    if base:
        for r in report["results"]:
            r["vs_decode_alone"] = round(r["wall_s"] / base["wall_s"], 3)
            r["frames_equal"] = r["checksum"] == base["checksum"]
    graphed = next((r for r in report["results"] if r["variant"] == "decode_alone_graphs"), None)
    if graphed:
        for r in report["results"]:
            r["vs_decode_alone_graphs"] = round(r["wall_s"] / graphed["wall_s"], 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
