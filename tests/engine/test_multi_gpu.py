"""Ulysses on several CUDA devices over NCCL (skipped with fewer GPUs; tests/pipelines/h3/test_ulysses.py runs the same paths on
gloo CPU ranks): t2va, mask editing and extension on 2 and 4 GPUs equal one GPU (fp32, eager), the extension file is
written by rank 0, and Stop is agreed by both ranks of a 2-GPU engine with the next prompt working."""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than 2 CUDA devices on this machine")


def _requests(tmp_path=None):
    from comfyui_h3.backend.media.encode import next_free_path
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest, H3Request

    rng = np.random.default_rng(6)
    frames = rng.integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    mask = np.zeros((64, 96), np.float32)
    mask[16:48, 32:64] = 1.0
    gen = torch.Generator().manual_seed(6)
    path = next_free_path(str(tmp_path), "nccl_ext", "mp4") if tmp_path is not None else None
    return {
        "t2va": H3Request(prompt="rain on a lake", num_frames=124, width=96, height=64, steps=3, seed=4),
        "edit": H3Request(prompt="a boat", steps=2, seed=3, source_frames=frames, mask=mask, preset="replace",
                          decode=False),
        "extend": H3ExtendRequest(prompts=["waves"], added_frames=51, window_frames=56, overlap_frames=22, steps=2,
                                  seed=1, source_video_latents=torch.randn(1, 24, 37, 4, 6, generator=gen),
                                  source_audio_latents=torch.randn(2, 32, 207, generator=gen), output_path=path),
    }


def _run_all(config, tmp_path=None):
    from comfyui_h3.backend.engine import Engine

    engine = Engine(config)
    try:
        return {name: engine.generate(req) for name, req in _requests(tmp_path).items()}
    finally:
        engine.shutdown()


@pytest.mark.parametrize("world", [2, 4])
def test_n_gpus_equal_one(tiny_h3_dir, tmp_path, world):
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.media.decode import probe_video

    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks need {world} CUDA devices; this machine has {torch.cuda.device_count()}")
    one = _run_all(h3_config(str(tiny_h3_dir), device="cuda:0", dtype="float32", compile="off"))
    gpus = ",".join(str(i) for i in range(world))
    two = _run_all(h3_config(str(tiny_h3_dir), device=f"cuda:{gpus}", dtype="float32", compile="off",
                                world_size=world), tmp_path)
    for name in one:
        for key in ("video_latents", "audio_latents"):
            a, b = getattr(two[name], key), getattr(one[name], key)
            err = ((a - b).norm() / b.norm()).item()
            assert a.shape == b.shape and err <= 1e-4, (name, key, err)
    # latents agree to float rounding (NCCL reductions, other GEMM tilings), so a few pixels may round the other way
    diff = (two["t2va"].frames.int() - one["t2va"].frames.int()).abs()
    assert diff.max() <= 2 and diff.float().mean() < 0.01, (diff.max(), diff.float().mean())
    path = two["extend"].extend["path"]
    assert probe_video(path).frame_count == 124 + 51 == two["extend"].extend["frames_written"]


def test_stop_on_two_gpus_and_next_prompt(tiny_h3_dir):
    from comfyui_h3.backend.engine import Engine, EngineCancelled
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    engine = Engine(h3_config(str(tiny_h3_dir), device="cuda:0,1", dtype="bfloat16", world_size=2))
    try:
        seen = []
        with pytest.raises(EngineCancelled):
            engine.generate(H3Request(prompt="wind", num_frames=124, width=96, height=64, steps=6),
                            progress=lambda d, t: seen.append(d), should_cancel=lambda: len(seen) >= 2)
        assert 2 <= max(seen) < 6
        out = engine.generate(H3Request(prompt="wind", num_frames=124, width=96, height=64, steps=2))
        assert out.frames.shape == (124, 64, 96, 3)
    finally:
        engine.shutdown()
