"""Run by tests/pipelines/h3/test_extension.py in a fresh process: extend a 256x448 tiny-model source by N windows into a file and
print {"loaded_mb", "peak_mb", "frames", "window_mb"}: peak resident set size after loading and at the end, and the
current resident set size at the end of each window's (single) denoise step."""

import json
import os
import resource
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(model_dir: str, out_dir: str, windows: int) -> None:
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.media.encode import next_free_path
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest
    from comfyui_h3.backend.pipelines.h3.stream_decode import StreamingVideoDecoder

    torch.set_grad_enabled(False)
    pipe = h3_config(model_dir, dtype="float32").build_pipeline(0)
    c = pipe.c
    gen = torch.Generator().manual_seed(0)
    video = torch.randn(1, c.latent_channels, 37, 16, 28, generator=gen)  # 124 frames at 256x448
    audio = torch.randn(2, c.audio_channels, 207, generator=gen)
    c.transformer_for("extend")
    warm = StreamingVideoDecoder(c.vae, c.device)  # one clip decoded: the decoder's own working set
    warm.push(video[:, :, :7])
    warm.finish()
    loaded = peak_mb()
    path = next_free_path(out_dir, f"mem{windows}", "mp4")
    window_mb = []
    result = run_extend(pipe, H3ExtendRequest(
        prompts=["waves"], added_frames=102 * windows, window_frames=124, overlap_frames=22, steps=1,
        source_video_latents=video, source_audio_latents=audio, output_path=path),
        on_step=lambda step, total: window_mb.append(current_mb()))
    print(json.dumps({"loaded_mb": loaded, "peak_mb": peak_mb(), "frames": result.extend["frames_written"],
                      "window_mb": window_mb}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
