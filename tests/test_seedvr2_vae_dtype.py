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
