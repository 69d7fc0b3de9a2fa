"""H3 Track Mask's cost per frame: SAM2 at the size of the SAM2.1 hiera base+ release (random weights), one click on
the middle frame of a 1344x768 clip, tracked forward and backward through every frame by the node's own backend
(backend/tracking: chunked preprocessing into the inference session, the prompt, both propagation passes, masks
post-processed to the frame size on the model's device and gathered on the host).

    python bench/track_mask.py [--frames 124] [--width 1344 --height 768] [--objects 1] [--json OUT.json]
    python bench/track_mask.py --tiny            # the tiny random SAM2 on the CPU at 64x40, 6 frames: a dry run

Prints one JSON line: seconds per frame (all of it, and split into frame preparation and model calls), the model
calls made, peak GPU memory, and the conditions (GPU, dtype, torch / transformers versions). The model is built
from its config with random weights (what it segments is meaningless; the work per frame is the real model's),
saved as a transformers folder and loaded the way the node loads it, in bfloat16 on a CUDA GPU. A warm-up run on
a few frames comes first (kernel selection, allocator); the timed run follows.
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

from comfyui_h3.backend.tracking.sam_models import clear_track_models, load_track_model  # noqa: E402
from comfyui_h3.backend.tracking.sam_tracker import track_masks  # noqa: E402


def base_plus_config():
    """SAM2.1 hiera base+ (sam2.1_hiera_b+.yaml: trunk embed_dim 112, 2 heads, stages 2-3-16-3, global attention
    blocks 12/16/20, window spec 8-4-14-7, background position embedding 14x14; 256-wide neck and heads, 1024 px
    input) as a transformers Sam2VideoConfig; everything else at the release's defaults."""
    from transformers import Sam2VideoConfig

    return Sam2VideoConfig(
        vision_config=dict(
            model_type="sam2_vision_model",
            backbone_config=dict(
                model_type="sam2_hiera_det_model", hidden_size=112, num_attention_heads=2,
                blocks_per_stage=[2, 3, 16, 3], embed_dim_per_stage=[112, 224, 448, 896],
                num_attention_heads_per_stage=[2, 4, 8, 16], window_size_per_stage=[8, 4, 14, 7],
                global_attention_blocks=[12, 16, 20], window_positional_embedding_background_size=[14, 14]),
            backbone_channel_list=[896, 448, 224, 112]))


def save_base_plus(folder: str, dtype: torch.dtype) -> int:
    from transformers import Sam2ImageProcessor, Sam2VideoModel, Sam2VideoProcessor
    from transformers.models.sam2_video.video_processing_sam2_video import Sam2VideoVideoProcessor

    torch.manual_seed(0)
    model = Sam2VideoModel(base_plus_config()).eval().to(dtype)
    model.save_pretrained(folder)
    Sam2VideoProcessor(image_processor=Sam2ImageProcessor(), video_processor=Sam2VideoVideoProcessor()) \
        .save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def clip(frames: int, height: int, width: int) -> torch.Tensor:
    """A grey floor with a red square crossing it (uint8 [T, H, W, 3]); content does not change SAM2's work."""
    out = torch.full((frames, height, width, 3), 110, dtype=torch.uint8)
    side = max(4, min(height, width) // 4)
    for t in range(frames):
        x = int((width - side) * t / max(frames - 1, 1))
        y = (height - side) // 2
        out[t, y:y + side, x:x + side] = torch.tensor([220, 40, 40], dtype=torch.uint8)
    return out


def prompts_for(frames: torch.Tensor, objects: int) -> str:
    """`objects` objects, each one click on the middle frame (spread over the frame)."""
    count, height, width = frames.shape[:3]
    middle = count // 2
    items = [{"id": k + 1, "points": [{"frame": middle, "x": width * (k + 1) / (objects + 1), "y": height / 2,
                                       "positive": True}]} for k in range(objects)]
    return json.dumps({"version": 1, "objects": items})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(loaded, frames: torch.Tensor, prompts: str) -> dict:
    """One tracking run, timed: prep ends when the last frame entered the session (the progress ticks count the
    frames first, then the model calls)."""
    count = frames.shape[0]
    marks = {}

    def progress(done: int, total: int) -> None:
        if done == count and "prep" not in marks:
            sync(loaded.device)
            marks["prep"] = time.perf_counter()
        marks["total"] = total

    sync(loaded.device)
    start = time.perf_counter()
    masks = track_masks(loaded, frames, prompts, progress=progress)
    sync(loaded.device)
    end = time.perf_counter()
    assert masks.shape == frames.shape[:3] and masks.dtype == torch.float32
    return {"seconds": end - start, "prep_seconds": marks["prep"] - start, "track_seconds": end - marks["prep"],
            "model_calls": marks["total"] - count}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=124, help="frames in the clip (124: H3's 5 s)")
    ap.add_argument("--width", type=int, default=1344)
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--objects", type=int, default=1, help="tracked objects (each clicked on the middle frame)")
    ap.add_argument("--warmup-frames", type=int, default=8)
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    ap.add_argument("--tiny", action="store_true",
                    help="the tiny random SAM2 on the CPU at 64x40, 6 frames, float32 (checks the script runs)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    import transformers

    if args.tiny:
        from comfyui_h3.backend.tracking.tiny import make_tiny_sam2

        args.frames, args.width, args.height, args.warmup_frames = min(args.frames, 6), 64, 40, 3
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    with tempfile.TemporaryDirectory(prefix="track-bench-") as folder:
        t0 = time.perf_counter()
        if args.tiny:
            make_tiny_sam2(os.path.join(folder, "sam2"))
            from transformers import Sam2VideoModel

            params = sum(p.numel() for p in Sam2VideoModel.from_pretrained(os.path.join(folder, "sam2")).parameters())
        else:
            os.makedirs(os.path.join(folder, "sam2"))
            params = save_base_plus(os.path.join(folder, "sam2"), dtype)
        built = time.perf_counter() - t0
        clear_track_models()
        t0 = time.perf_counter()
        loaded = load_track_model(os.path.join(folder, "sam2"), device, dtype)
        load_seconds = time.perf_counter() - t0
        frames = clip(args.frames, args.height, args.width)
        warm = clip(min(args.warmup_frames, args.frames), args.height, args.width)
        run(loaded, warm, prompts_for(warm, args.objects))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        timed = run(loaded, frames, prompts_for(frames, args.objects))
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else 0.0
        clear_track_models()
    result = {
        "bench": "track_mask",
        "model": "tiny random SAM2 (backend/tracking/tiny.py)" if args.tiny else "SAM2.1 hiera base+ config, random",
        "params_m": round(params / 1e6, 2),
        "frames": args.frames, "width": args.width, "height": args.height, "objects": args.objects,
        "prompt": "one click per object on the middle frame; forward + backward propagation",
        "s_per_frame": round(timed["seconds"] / args.frames, 5),
        "prep_s_per_frame": round(timed["prep_seconds"] / args.frames, 5),
        "track_s_per_model_call": round(timed["track_seconds"] / timed["model_calls"], 5),
        "model_calls": timed["model_calls"],
        "total_s": round(timed["seconds"], 3),
        "load_s": round(load_seconds, 3), "build_s": round(built, 3),
        "peak_gib": round(peak, 3),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    line = json.dumps(result)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
