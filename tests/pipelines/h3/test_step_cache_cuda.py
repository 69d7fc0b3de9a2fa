"""Step caching on a CUDA GPU (skipped without one; tests/pipelines/h3/test_step_cache.py covers the same logic on the
CPU): on the tiny model in bf16 with compiled blocks -- the CUDA default -- off and a cache that never skips are the
exact path bit for bit, a fixed schedule skips the steps it names, and with every block streamed the same decisions
give the same latents."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device on this machine (the CPU tests cover the same logic)")


def _run(pipe, setting):
    from h3_requests import t2va

    return pipe.run(t2va(steps=8, seed=5, step_cache=setting))


def test_the_cache_on_the_gpu(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy

    pipe = h3_config(str(tiny_h3_dir), device="cuda", dtype="bfloat16").build_pipeline(0)
    plain, never = _run(pipe, "off"), _run(pipe, "1e-12")
    assert torch.equal(plain.video_latents, never.video_latents)
    assert torch.equal(plain.audio_latents, never.audio_latents)
    fixed = _run(pipe, "every:2")
    assert fixed.manifest["step_cache"]["plans"][0]["cached_steps"] == [7]
    streamed = h3_config(str(tiny_h3_dir), device="cuda", dtype="bfloat16",
                         weights=H3WeightPolicy(placement="offload", resident_blocks=0)).build_pipeline(0)
    again = _run(streamed, "every:2")
    assert torch.equal(again.video_latents, fixed.video_latents)
