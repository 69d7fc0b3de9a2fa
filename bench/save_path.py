"""Save path: decode-output frames on the GPU -> MP4. Fast path (uint8 on the GPU, pinned double-buffered chunked
D2H on a side stream, background encoder) next to the naive path (fp32 to the host, convert on the CPU, encode) and
pure encode (uint8 frames already in host memory -> encoder), in the same run.

    python bench/save_path.py                       # H200: 10 s at 1344x768 and 1920x1088, x264 veryfast CRF 18
    python bench/save_path.py --small --device cpu  # a seconds-long smoke run on the CPU

Input: float32 [1, 3, T, H, W] in 0..1 on the device (what H3's VAE decode hands over after `.float()`), a smooth
moving pattern plus mild noise (not pure noise: x264's worst case would hide the transfer cost behind encode time).
Variants:
- encode: uint8 frames in host memory -> Mp4Writer, 16-frame chunks (the floor of the save stage).
- fast: StreamingVideoSaver.write(whole decode output) + close.
- fast, clip-streamed: a simulated decoder (torch.cuda._sleep per 17-frame clip, default 0.93 s per clip = the measured
  13.4 s per 10-s decode) hands each clip to the saver as it is made; compared with decode-then-save.
- naive: video.cpu() (fp32, pageable) -> uint8 on the CPU -> Mp4Writer.
Host memory: peak RSS (VmHWM after resetting it through /proc/self/clear_refs) above the RSS before each variant.
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

from comfyui_h3.backend.media.encode import Mp4Writer  # noqa: E402
from comfyui_h3.backend.media.frames import video_to_uint8  # noqa: E402
from comfyui_h3.backend.media.stream_writer import StreamingVideoSaver  # noqa: E402


def _status(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> int:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    return _status("VmRSS")


def peak_above(base: int) -> int:
    return max(0, _status("VmHWM") - base)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_video(frames, height, width, device, seed=0):
    """float32 [1, 3, T, H, W] in 0..1: moving gradients + mild noise, built frame-block-wise on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    video = torch.empty((1, 3, frames, height, width), dtype=torch.float32, device=device)
    y = torch.linspace(0, 1, height, device=device).view(height, 1)
    x = torch.linspace(0, 1, width, device=device).view(1, width)
    for t in range(frames):
        phase = t / 24.0
        for c in range(3):
            base = 0.5 + 0.35 * torch.sin(6.28 * (x * (1.5 + c) + y * (0.7 + 0.3 * c) + phase * (0.2 + 0.1 * c)))
            noise = torch.randn((height, width), generator=gen, device=device) * 0.02
            video[0, c, t] = base + noise
    return video


def naive_uint8(host_video: torch.Tensor) -> torch.Tensor:
    """The old path's CPU conversion: [1, 3, T, H, W] float32 -> uint8 [T, H, W, 3] (clamp, x255, round half even)."""
    return host_video[0].permute(1, 2, 3, 0).clamp(0, 1).mul(255.0).round_().to(torch.uint8)


def encode_host(path, frames, fps, crf, preset):
    with Mp4Writer(path, frames.shape[2], frames.shape[1], fps, crf=crf, preset=preset) as writer:
        for start in range(0, frames.shape[0], 16):
            writer.write_frames(frames[start:start + 16])


def run_size(width, height, frames, device, args, out_dir):
    tag = f"{width}x{height}"
    res = {"size": tag, "frames": frames}
    video = make_video(frames, height, width, device)
    sync(device)
    fp32_bytes = video.numel() * 4
    u8_bytes = video.numel()
    res["fp32_bytes"], res["uint8_bytes"] = fp32_bytes, u8_bytes

    # warm-up: encoder, pinned allocator, kernels
    with StreamingVideoSaver(os.path.join(out_dir, f"warm_{tag}.mp4"), width, height, 24, crf=args.crf,
                             preset=args.preset) as saver:
        saver.write(video[:, :, :8])

    # 1. fast path
    base = reset_peak()
    sync(device)
    t0 = time.perf_counter()
    saver = StreamingVideoSaver(os.path.join(out_dir, f"fast_{tag}.mp4"), width, height, 24, crf=args.crf,
                                preset=args.preset, chunk_frames=args.chunk_frames)
    with saver:
        saver.write(video)
        t_issued = time.perf_counter()
    res["fast_s"] = time.perf_counter() - t0
    res["fast_issue_s"] = t_issued - t0
    res["fast_stats"] = dict(saver.stats)
    res["fast_peak_host_bytes"] = peak_above(base)

    # 2. pure encode (uint8 already on the host; the same frames the fast path encoded)
    host_u8 = video_to_uint8(video).cpu()
    base = reset_peak()
    t0 = time.perf_counter()
    encode_host(os.path.join(out_dir, f"encode_{tag}.mp4"), host_u8, 24, args.crf, args.preset)
    res["encode_s"] = time.perf_counter() - t0

    # 3. naive path
    del host_u8
    base = reset_peak()
    sync(device)
    t0 = time.perf_counter()
    host = video.cpu()
    t1 = time.perf_counter()
    u8 = naive_uint8(host)
    t2 = time.perf_counter()
    encode_host(os.path.join(out_dir, f"naive_{tag}.mp4"), u8, 24, args.crf, args.preset)
    t3 = time.perf_counter()
    res.update(naive_s=t3 - t0, naive_d2h_s=t1 - t0, naive_convert_s=t2 - t1, naive_encode_s=t3 - t2,
               naive_peak_host_bytes=peak_above(base))
    fast_u8 = video_to_uint8(video).cpu()
    res["naive_vs_fast_differing_values"] = int((fast_u8 != u8).sum())
    del host, u8, fast_u8

    # 4. clip-streamed from a simulated decoder vs decode-then-save
    if device.type == "cuda" and args.decode_clip_s > 0:
        cycles = _sleep_cycles(args.decode_clip_s, device)
        clip = 17

        def decode_clips():
            for start in range(0, frames, clip):
                torch.cuda._sleep(cycles)  # stands in for one VAE clip decode on this stream
                yield video[:, :, start:start + clip] * 1.0  # a fresh output tensor, as a decoder makes

        sync(device)
        t0 = time.perf_counter()
        outs = [c for c in decode_clips()]
        sync(device)
        res["sim_decode_s"] = time.perf_counter() - t0
        del outs
        sync(device)
        t0 = time.perf_counter()
        with StreamingVideoSaver(os.path.join(out_dir, f"stream_{tag}.mp4"), width, height, 24, crf=args.crf,
                                 preset=args.preset, chunk_frames=args.chunk_frames) as saver:
            for chunk in decode_clips():
                saver.write(chunk)
        res["streamed_decode_plus_save_s"] = time.perf_counter() - t0
        res["sequential_decode_plus_save_s"] = res["sim_decode_s"] + res["fast_s"]
    del video
    if device.type == "cuda":
        torch.cuda.empty_cache()
    sizes = {k: os.path.getsize(os.path.join(out_dir, f"{k}_{tag}.mp4")) for k in ("fast", "encode", "naive")}
    res["file_bytes"] = sizes
    res["fast_equals_encode_file"] = _same_file(os.path.join(out_dir, f"fast_{tag}.mp4"),
                                                os.path.join(out_dir, f"encode_{tag}.mp4"))
    res["fast_over_encode"] = res["fast_s"] / res["encode_s"]
    res["naive_over_encode"] = res["naive_s"] / res["encode_s"]
    res["d2h_ratio"] = res["fast_stats"]["d2h_bytes"] / fp32_bytes if device.type == "cuda" else None
    return res


def _same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def _sleep_cycles(seconds, device):
    """Calibrate torch.cuda._sleep cycles per second."""
    cycles = 100_000_000
    sync(device)
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    sync(device)
    per_s = cycles / (time.perf_counter() - t0)
    return int(per_s * seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sizes", default="1344x768,1920x1088")
    parser.add_argument("--preset", default="veryfast")
    parser.add_argument("--crf", type=int, default=18)
    parser.add_argument("--chunk-frames", type=int, default=16)
    parser.add_argument("--decode-clip-s", type=float, default=0.93,
                        help="simulated VAE decode time per 17-frame clip (0 skips the streamed variant)")
    parser.add_argument("--small", action="store_true", help="CPU smoke sizes: 1 s at 128x72")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.small:
        args.seconds, args.sizes = 1.0, "128x72"
    device = torch.device(args.device)
    frames = int(round(args.seconds * 24)) + 3  # 10 s -> 243 frames, like H3's 17n+5 snap
    import av

    info = {"torch": torch.__version__, "av": av.__version__, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpus": os.cpu_count(), "preset": args.preset, "crf": args.crf, "chunk_frames": args.chunk_frames}
    print(json.dumps(info), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as out_dir:
        for size in args.sizes.split(","):
            width, height = (int(v) for v in size.split("x"))
            res = run_size(width, height, frames, device, args, out_dir)
            results.append(res)
            print(json.dumps(res), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"info": info, "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
