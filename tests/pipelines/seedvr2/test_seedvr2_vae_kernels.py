"""The SeedVR2 VAE's Triton kernels (backend/models/seedvr2/vae_kernels.py) on the CPU, through Triton's
interpreter: statistics against float64 (also where the mean dwarfs the spread), the normalisation into strided
views against the torch path (both kernel forms: channel-major and channels-last), the tiny VAE with the kernels
against the official goldens (fp32 rel <= 1e-5; NCDHW and channels_last_3d), the decode in row bands (one frame
each: the interpreter runs ~100 programs a second), the attention's row softmax and GEMM attention against float64,
and the channels-last row copies. Each runs in a subprocess (TRITON_INTERPRET must be set before triton is
imported); tests/pipelines/seedvr2/test_seedvr2_vae_gpu.py runs the compiled kernels."""

import os
import subprocess
import sys
import textwrap

import pytest

from triton_interpreter import require_interpreter
from repo_paths import REPO_DIR

pytestmark = pytest.mark.slow  # every test here takes seconds on two cores (docs/TESTING.md)

pytest.importorskip("triton", reason="the VAE kernels are Triton kernels")



def _interpreted(code: str, prelude: str = "") -> str:
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    source = textwrap.dedent(prelude) + textwrap.dedent(code)
    run = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True,
                         timeout=900, cwd=os.path.join(REPO_DIR, "tests"))
    assert run.returncode == 0 and run.stdout.rstrip().endswith("ok"), run.stdout + run.stderr
    return run.stdout


# Shared by the snippets below: the kernels' statistics of x against float64, and the torch / fused norms of x.
_NORM_CHECKS = """
import torch
from comfyui_h3.backend.models.seedvr2 import vae_kernels, vae_ops


def check_stats(x, norm, offset):
    g = norm.num_groups
    b, c, t, h, w = x.shape
    mean, rstd = vae_kernels.group_stats(x, g, norm.eps)
    var, want = torch.var_mean(x.double().reshape(b, g, c // g, t, h * w), dim=(2, 4), correction=0)
    assert (mean.double() - want).abs().max() <= 1e-6 * max(offset, 1), (mean, want)
    want_rstd = (var + norm.eps).rsqrt()
    assert ((rstd.double() - want_rstd).abs() / want_rstd).max() <= 1e-4, offset


def torch_and_fused(norm, x):
    vae_ops.NORM_KERNELS = False
    ref = vae_ops.FrameGroupNorm(norm, x, 1 << 20, silu=True)
    vae_ops.NORM_KERNELS = True
    fused = vae_ops.FrameGroupNorm(norm, x, 1 << 20, silu=True)
    assert fused.fused and not ref.fused
    return ref, fused
"""


def test_stats_and_normalisation_equal_the_torch_path_on_strided_views():
    _interpreted(prelude=_NORM_CHECKS, code="""
        import torch
        from comfyui_h3.backend.models.seedvr2 import vae_kernels, vae_ops
        torch.manual_seed(0)
        norm = torch.nn.GroupNorm(4, 8, eps=1e-6)
        norm.weight.data.normal_(); norm.bias.data.normal_()
        for offset in (0.0, 300.0):  # a mean 300x the spread: the kernel's per-block moments keep the variance
            x = torch.randn(2, 8, 3, 9, 37, dtype=torch.float64) + offset
            x = x.float().permute(0, 1, 2, 4, 3).contiguous().permute(0, 1, 2, 4, 3)  # non-contiguous rows
            check_stats(x, norm, offset)
        ref, fused = torch_and_fused(norm, x)
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
    _interpreted(prelude=_NORM_CHECKS, code="""
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
            check_stats(x, norm, offset)
        ref, fused = torch_and_fused(norm, x)
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
        assert vae_ops.norm_kernels_for(torch.zeros(1))
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


def test_tiled_passes_with_the_kernels_in_channels_last_equal_the_torch_path():
    """The tiled VAE as it runs on CUDA (channels_last_3d pieces, the tiles' owned moments by the statistics kernel,
    frame statistics handed to the norms without a re-read) against the NCDHW torch path (fp64 sums): fp32 equal
    up to summation order."""
    _interpreted("""
        import torch
        from safetensors.torch import load_file
        from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops, vae_tiling
        from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig
        vae = SeedVR2VAE(VAEConfig.tiny()).eval()
        w = load_file("fixtures/seedvr2_vae.safetensors")
        vae.load_state_dict({k[2:]: v.float() for k, v in w.items() if k.startswith("w.")}, strict=True)
        rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()
        g = torch.Generator().manual_seed(3)
        x = torch.rand(1, 3, 5, 32, 48, generator=g) * 2 - 1
        z = torch.randn(1, 16, 2, 4, 6, generator=g) * 0.5
        vae_ops.NORM_KERNELS = False
        want_m, want_lv = vae_tiling.tiled_encode(vae, x, 32, overlap=16)
        want_d = vae_tiling.tiled_decode(vae, z, 32, overlap=16)
        vae_ops.NORM_KERNELS = True
        conv3d = torch.nn.functional.conv3d
        vae_ops.F.conv3d = lambda x, *a, **k: conv3d(x, *a, **k).contiguous(memory_format=torch.channels_last_3d)
        vae_layout.CHANNELS_LAST = True
        m, lv = vae_tiling.tiled_encode(vae, x, 32, overlap=16)
        d = vae_tiling.tiled_decode(vae, z, 32, overlap=16)
        assert rel(m, want_m) <= 1e-5 and rel(lv, want_lv) <= 1e-5, (rel(m, want_m), rel(lv, want_lv))
        assert rel(d, want_d) <= 1e-5, rel(d, want_d)
        print("ok")
    """)


def test_the_softmax_kernel_and_the_gemm_attention_equal_float64():
    """softmax_rows against a float64 softmax (rows longer than a block, a row of one large score, padding lanes);
    the mid block's GEMM attention (bf16 q, k, v with a 512-wide head, query chunks) against float64 attention of
    the same bf16 inputs (a flash kernel's rounding: the probabilities in bf16), and the FrameAttention module on
    that path against its SDPA path."""
    _interpreted("""
        import torch
        from comfyui_h3.backend.models.seedvr2 import vae_kernels, vae_ops
        torch.manual_seed(0)
        vae_kernels.SOFTMAX_BLOCK = 64  # several blocks per row, a ragged last block
        s = torch.randn(5, 150) * 4
        s[2, 7] = 80.0  # one score dwarfs the rest: exp stays finite, the row is one-hot
        got = vae_kernels.softmax_rows(s, 0.5, torch.float32)
        want = torch.softmax(s.double() * 0.5, -1)
        assert (got.double() - want).abs().max() <= 1e-6 and got[2, 7] > 0.999999
        assert vae_kernels.softmax_rows(s[:, :3], 1.0, torch.float32).sum(-1).sub(1).abs().max() <= 1e-6
        low = vae_kernels.softmax_rows(s, 0.5, torch.bfloat16)
        assert low.dtype == torch.bfloat16 and (low.double() - want).abs().max() <= 4e-3

        n, d = 70, 512
        q, k, v = (torch.randn(1, 1, n, d).bfloat16() for _ in range(3))
        ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / d ** 0.5, -1) @ v.double()
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        vae_ops.GEMM_ATTENTION = "everywhere"
        assert vae_ops._gemm_attention_for(q) and not vae_ops._gemm_attention_for(q.float())
        att = vae_ops._gemm_attention(q, k, v, chunk_bytes=6 * n * 16)  # 16 queries a chunk
        rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
        # a flash kernel's numerics: fp32 scores, bf16 probabilities, fp32 accumulation, one rounding of the output
        flash_like = torch.softmax(q.double() @ k.double().transpose(-1, -2) / d ** 0.5, -1).bfloat16().double()
        assert att.dtype == torch.bfloat16 and rel(att, flash_like @ v.double()) <= 3e-3
        assert rel(att, ref) <= 2 * rel(sdpa, ref) + 1e-3, (rel(att, ref), rel(sdpa, ref))  # CPU SDPA: fp32 P

        block = vae_ops.FrameAttention(d, 32, 1e-6).bfloat16()
        x = torch.randn(1, d, 2, 5, 7).bfloat16()
        fast = block(x, 1 << 20)
        vae_ops.GEMM_ATTENTION = False
        slow = block(x, 1 << 20)
        assert rel(fast, slow.double()) <= 1e-2, rel(fast, slow.double())
        print("ok")
    """)


def test_row_copies_equal_torch_copies_and_the_decode_keeps_the_goldens():
    """copy_rows on the views the VAE copies (a band's interior of a padded buffer, rows of carried frames, an
    expanded frame 0, a 3-channel input) equals torch's copy_, refuses views whose rows are not runs, and a
    channels-last decode in row bands with it (and the norm kernels) still equals the official goldens."""
    _interpreted("""
        import torch
        from safetensors import safe_open
        from comfyui_h3.backend.models.seedvr2 import vae_kernels, vae_layout, vae_ops
        from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig
        torch.manual_seed(0)
        cl = torch.channels_last_3d
        vae_kernels.COPY_BLOCK = 64  # several blocks per row run
        src = torch.randn(1, 8, 4, 9, 11).contiguous(memory_format=cl)
        buf = torch.full((1, 8, 6, 7, 13), 5.0).contiguous(memory_format=cl)
        vae_kernels.copy_rows(buf[:, :, 1:3, 1:6, 1:12], src[:, :, 2:4, 3:8])
        want = torch.full((1, 8, 6, 7, 13), 5.0); want[:, :, 1:3, 1:6, 1:12] = src[:, :, 2:4, 3:8]
        assert torch.equal(buf, want)
        vae_kernels.copy_rows(buf[:, :, 3:6], buf[:, :, :1].expand(-1, -1, 3, -1, -1))
        assert torch.equal(buf[:, :, 3:6], buf[:, :, :1].expand(-1, -1, 3, -1, -1))
        rgb = torch.randn(1, 3, 2, 5, 6).contiguous(memory_format=cl)
        out = torch.zeros(1, 3, 2, 5, 6).contiguous(memory_format=cl)
        assert torch.equal(vae_kernels.copy_rows(out, rgb), rgb)
        try:
            vae_kernels.copy_rows(torch.zeros(1, 8, 4, 9, 11), src)  # NCDHW rows are not runs of W x C
            raise SystemExit("refused nothing")
        except ValueError as e:
            assert "row runs" in str(e)

        with safe_open("fixtures/seedvr2_vae.safetensors", framework="pt") as f:
            T = {k: f.get_tensor(k) for k in f.keys()}
        vae = SeedVR2VAE(VAEConfig.tiny()).eval()
        vae.load_state_dict({k[2:]: v.float() for k, v in T.items() if k.startswith("w.")}, strict=True)
        vae_layout.CHANNELS_LAST, vae_ops.ROW_COPIES = True, "everywhere"
        calls = []
        real = vae_kernels.copy_rows
        vae_kernels.copy_rows = lambda d, s: (calls.append(d.shape), real(d, s))[1]
        conv3d = torch.nn.functional.conv3d
        vae_ops.F.conv3d = lambda x, w, *a, **k: conv3d(x, w, *a, **k).contiguous(memory_format=cl)
        out = vae.decode(T["dec.3.z"].float(), chunk_bytes=1 << 15)  # time slices: carried frames copied too
        rel = ((out.double() - T["dec.3.sliced.out"].double()).norm() / T["dec.3.sliced.out"].double().norm()).item()
        assert rel <= 1e-5 and len(calls) > 10, (rel, len(calls))
        print("ok")
    """)
