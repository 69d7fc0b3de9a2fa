"""The SeedVR2 VAE's GroupNorm Triton kernels (backend/models/seedvr2/vae_kernels.py) on the CPU, through Triton's
interpreter: statistics against float64 (also where the mean dwarfs the spread), the normalisation into strided
views against the torch path (both kernel forms: channel-major and channels-last), and the tiny VAE with the kernels
against the official goldens (fp32 rel <= 1e-5; NCDHW and channels_last_3d), the decode in row bands (one frame each: the interpreter runs ~100 programs a second). Each runs in a subprocess (TRITON_INTERPRET must be set before triton
is imported); tests/test_seedvr2_vae_gpu.py runs the compiled kernels."""

import os
import subprocess
import sys
import textwrap

import pytest

from triton_interpreter import require_interpreter

pytest.importorskip("triton", reason="the VAE kernels are Triton kernels")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _interpreted(code: str) -> str:
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=900, cwd=os.path.join(REPO, "tests"))
    assert run.returncode == 0 and run.stdout.rstrip().endswith("ok"), run.stdout + run.stderr
    return run.stdout


def test_stats_and_normalisation_equal_the_torch_path_on_strided_views():
    _interpreted("""
        import torch
        from comfyui_h3.backend.models.seedvr2 import vae_kernels, vae_ops
        torch.manual_seed(0)
        norm = torch.nn.GroupNorm(4, 8, eps=1e-6)
        norm.weight.data.normal_(); norm.bias.data.normal_()
        for offset in (0.0, 300.0):  # a mean 300x the spread: the kernel's per-block moments keep the variance
            x = torch.randn(2, 8, 3, 9, 37, dtype=torch.float64) + offset
            x = x.float().permute(0, 1, 2, 4, 3).contiguous().permute(0, 1, 2, 4, 3)  # non-contiguous rows
            mean, rstd = vae_kernels.group_stats(x, 4, norm.eps)
            g = x.double().reshape(2, 4, 2, 3, 9 * 37)
            var, want = torch.var_mean(g, dim=(2, 4), correction=0)
            assert (mean.double() - want).abs().max() <= 1e-6 * max(offset, 1), (mean, want)
            want_rstd = (var + norm.eps).rsqrt()
            assert ((rstd.double() - want_rstd).abs() / want_rstd).max() <= 1e-4, offset
        vae_ops.NORM_KERNELS = False
        ref = vae_ops.FrameGroupNorm(norm, x, 1 << 20, silu=True)
        vae_ops.NORM_KERNELS = True
        fused = vae_ops.FrameGroupNorm(norm, x, 1 << 20, silu=True)
        assert fused.fused and not ref.fused
        fused.mean, fused.rstd = ref.mean, ref.rstd  # the normalisation alone
        part = x[:, :, 1:3, 2:7, 3:30]
        buf = torch.full((2, 8, 4, 7, 31), 7.0)
        fused(part, 1, buf[:, :, 1:3, 1:6, 2:29])  # into a padded buffer's inner view
        want = ref(part, 1)
        assert (buf[:, :, 1:3, 1:6, 2:29] - want).abs().max() <= 1e-5
        assert (buf[:, :, 0] == 7.0).all() and (buf[:, :, :, 0] == 7.0).all() and (buf[..., :2] == 7.0).all()
        half = vae_ops.FrameGroupNorm(norm, x.bfloat16(), 1 << 20, silu=False)
        got = half(x.bfloat16()[:, :, :1], 0)
        assert got.dtype == torch.bfloat16
        print("ok")
    """)


def test_the_channels_last_kernels_equal_float64_and_the_torch_path():
    _interpreted("""
        import torch
        from comfyui_h3.backend.models.seedvr2 import vae_kernels, vae_layout, vae_ops
        torch.manual_seed(0)
        cl = torch.channels_last_3d
        norm = torch.nn.GroupNorm(4, 12, eps=1e-6)  # 12 channels: the tile's channel block (16) is masked
        norm.weight.data.normal_(); norm.bias.data.normal_()
        for offset in (0.0, 300.0):
            whole = (torch.randn(2, 12, 3, 11, 37, dtype=torch.float64) + offset).float().contiguous(memory_format=cl)
            x = whole[:, :, :, 1:10]  # a row band of a channels-last tensor: channel stride 1, not contiguous
            assert vae_layout.is_channels_last(x) and not x.is_contiguous(memory_format=cl)
            mean, rstd = vae_kernels.group_stats(x, 4, norm.eps)
            var, want = torch.var_mean(x.double().reshape(2, 4, 3, 3, 9 * 37), dim=(2, 4), correction=0)
            assert (mean.double() - want).abs().max() <= 1e-6 * max(offset, 1), (mean, want)
            want_rstd = (var + norm.eps).rsqrt()
            assert ((rstd.double() - want_rstd).abs() / want_rstd).max() <= 1e-4, offset
        vae_ops.NORM_KERNELS = False
        ref = vae_ops.FrameGroupNorm(norm, x, 1 << 20, silu=True)
        vae_ops.NORM_KERNELS = True
        fused = vae_ops.FrameGroupNorm(norm, x, 1 << 20, silu=True)
        assert fused.fused
        fused.mean, fused.rstd = ref.mean, ref.rstd
        part = x[:, :, 1:3, 2:7, 3:30]
        want = ref(part, 1)
        for fmt in (cl, torch.contiguous_format):  # into a channels-last padded buffer, and across layouts
            buf = torch.full((2, 12, 4, 7, 31), 7.0).contiguous(memory_format=fmt)
            fused(part, 1, buf[:, :, 1:3, 1:6, 2:29])
            assert (buf[:, :, 1:3, 1:6, 2:29] - want).abs().max() <= 1e-5, fmt
            assert (buf[:, :, 0] == 7.0).all() and (buf[:, :, :, 0] == 7.0).all() and (buf[..., :2] == 7.0).all()
        got = fused(part, 1)
        assert vae_layout.is_channels_last(got) and (got - want).abs().max() <= 1e-5  # allocated in part's layout
        print("ok")
    """)


def test_tiny_vae_with_the_kernels_equals_the_official_goldens():
    _interpreted("""
        import json
        from pathlib import Path
        import torch
        from safetensors import safe_open
        from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops
        from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig
        fixtures = Path("fixtures")
        with safe_open(str(fixtures / "seedvr2_vae.safetensors"), framework="pt") as f:
            T = {k: f.get_tensor(k) for k in f.keys()}
        vae = SeedVR2VAE(VAEConfig.tiny()).eval()
        vae.load_state_dict({k[2:]: v.float() for k, v in T.items() if k.startswith("w.")}, strict=True)
        rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert vae_ops._norm_kernels_for(torch.zeros(1))
        x = T["enc.0.x"].float()
        mean, logvar = vae.encode(x, slice_frames=None)
        assert rel(mean, T["enc.0.mean"]) <= 1e-5 and rel(logvar, T["enc.0.logvar"]) <= 1e-5
        # in row bands (a 64 KiB chunk cuts the large convs into bands): the official whole result still
        out = vae.decode(T["dec.0.z"].float(), slice_latents=None, chunk_bytes=1 << 16)
        assert rel(out, T["dec.0.out"]) <= 1e-5, rel(out, T["dec.0.out"])
        # channels_last_3d end to end, the convs answering as cuDNN does (the CPU's conv returns NCDHW)
        conv3d = torch.nn.functional.conv3d
        vae_ops.F.conv3d = lambda x, *a, **k: conv3d(x, *a, **k).contiguous(memory_format=torch.channels_last_3d)
        vae_layout.CHANNELS_LAST = True
        mean, logvar = vae.encode(x, slice_frames=None)
        assert rel(mean, T["enc.0.mean"]) <= 1e-5 and rel(logvar, T["enc.0.logvar"]) <= 1e-5
        out = vae.decode(T["dec.0.z"].float(), slice_latents=None, chunk_bytes=1 << 16)
        assert rel(out, T["dec.0.out"]) <= 1e-5, rel(out, T["dec.0.out"])
        print("ok")
    """)
