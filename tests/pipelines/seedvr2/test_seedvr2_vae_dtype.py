"""The SeedVR2 VAE's dtype per device: bf16 stays bf16 on GPUs and on CPUs with native bf16, and becomes float32 on
CPUs without it (where torch's bf16 convolutions take a slow reference path)."""

import torch

from comfyui_h3.backend.pipelines.seedvr2 import components


def test_bf16_vae_runs_in_float32_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setattr(components, "cpu_has_native_bf16", lambda: False)
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert components.vae_dtype_for(cpu, torch.bfloat16) == torch.float32
    assert components.vae_dtype_for(cpu, torch.float16) == torch.float16  # asked for explicitly: kept
    assert components.vae_dtype_for(gpu, torch.bfloat16) == torch.bfloat16
    monkeypatch.setattr(components, "cpu_has_native_bf16", lambda: True)
    assert components.vae_dtype_for(cpu, torch.bfloat16) == torch.bfloat16


def test_native_bf16_check_answers_a_bool():
    assert isinstance(components.cpu_has_native_bf16(), bool)


def test_the_manifest_says_which_dtype_the_vae_ran_in(tmp_path):
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    root = make_tiny_seedvr2(tmp_path / "m", "3b")
    engine = Engine(seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE,
                                   dtype="float32", vae_dtype="bfloat16", cpu_threads=1))
    video = torch.randint(0, 256, (5, 16, 24, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    try:
        m = engine.generate(UpscaleRequest(video, scale=2.0)).manifest
    finally:
        engine.shutdown()
    # the worker decides on its own CPU: this machine's answer is the one to expect
    assert m["engine"]["vae_dtype"] == ("bfloat16" if components.cpu_has_native_bf16() else "float32")
    assert m["engine"]["compute_dtype"] == "float32"
