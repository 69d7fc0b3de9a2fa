"""Extension through the engine's worker on a CUDA device (skipped without one; tests/pipelines/h3/test_extension.py and
tests/nodes/test_extension_nodes.py cover the same logic on the CPU): fp32 eager on the GPU equals the CPU pipeline, the
file is streamed from GPU uint8 through the pinned path, and bf16 with compiled blocks (the CUDA default) runs."""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def _request(path=None, from_latents=False):
    """A decoded source (encoded on the device), or latents (the same bits on both devices: the CPU comparison then
    checks the windows, not the VAE encoder's TF32 convolutions and fp16 latent rounding)."""
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    rng = np.random.default_rng(8)
    source = {}
    if from_latents:
        gen = torch.Generator().manual_seed(8)
        source = {"source_video_latents": torch.randn(1, 24, 37, 4, 6, generator=gen),
                  "source_audio_latents": torch.randn(2, 32, 207, generator=gen)}
    else:
        source = {"source_frames": rng.integers(0, 256, (124, 64, 96, 3), dtype=np.uint8),
                  "source_audio": torch.from_numpy(rng.standard_normal((2, 32000 * 5)).astype(np.float32) * 0.1),
                  "source_sample_rate": 32000}
    return H3ExtendRequest(prompts=["surf"], added_frames=85, window_frames=56, overlap_frames=22, steps=2, seed=2,
                           output_path=path, **source)


@pytest.mark.parametrize("dtype, compile_mode", [("float32", "off"), ("bfloat16", "auto")])
def test_extend_on_cuda(tiny_h3_dir, tmp_path, dtype, compile_mode):
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.media.decode import probe_video
    from comfyui_h3.backend.media.encode import next_free_path

    path = next_free_path(str(tmp_path), "cuda_ext", "mp4")
    engine = Engine(h3_config(str(tiny_h3_dir), device="cuda", dtype=dtype, compile=compile_mode))
    try:
        got = engine.generate(_request(path, from_latents=dtype == "float32"))
    finally:
        engine.shutdown()
    info = probe_video(path)
    assert info.frame_count == 124 + 85 == got.extend["frames_written"] and (info.width, info.height) == (96, 64)
    assert info.has_audio and abs(info.duration - 209 / 24) < 0.05
    if dtype == "float32":
        want = h3_config(str(tiny_h3_dir), device="cpu", dtype="float32").build_pipeline(0).run(
            _request(from_latents=True))
        for key in ("video_latents", "audio_latents"):
            a, b = getattr(got, key), getattr(want, key)
            assert ((a - b).norm() / b.norm()).item() <= 1e-4, key
    else:
        assert torch.isfinite(got.video_latents).all() and torch.isfinite(got.audio_latents).all()
