"""The SeedVR2 VAE's CUDA default (the compiled Triton norm kernels, channels_last_3d activations on cuDNN's NDHWC
convs) against the official goldens in float32 and, at the released widths in bf16, against float32 math as closely
as the NCDHW torch path it replaces. The same logic runs on the CPU in test_seedvr2_vae.py (the channels-last pass)
and test_seedvr2_vae_kernels.py (the kernels, interpreted)."""

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops
from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (compiled Triton kernels, cuDNN channels-last convs); "
                                       "the CPU tests cover the same paths interpreted")

FIXTURES = Path(__file__).parent / "fixtures"


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture
def exact_fp32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_cuda_default_equals_the_official_goldens_in_fp32(exact_fp32):
    pytest.importorskip("triton", reason="the norm kernels are Triton kernels")
    with safe_open(str(FIXTURES / "seedvr2_vae.safetensors"), framework="pt") as f:
        T = {k: f.get_tensor(k) for k in f.keys()}
    vae = SeedVR2VAE(VAEConfig.tiny()).eval()
    vae.load_state_dict({k[2:]: v.float() for k, v in T.items() if k.startswith("w.")}, strict=True)
    vae = vae.cuda()
    assert vae_ops.NORM_KERNELS and vae_layout.channels_last_for(torch.empty(0, device="cuda"))
    mean, logvar = vae.encode(T["enc.2.x"].float().cuda())
    assert vae.encoder.conv_in.weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert rel(mean.cpu(), T["enc.2.sliced.mean"]) <= 1e-5 and rel(logvar.cpu(), T["enc.2.sliced.logvar"]) <= 1e-5
    out = vae.decode(T["dec.3.z"].float().cuda(), chunk_bytes=1 << 16)  # row bands too
    assert rel(out.cpu(), T["dec.3.sliced.out"]) <= 1e-5


def test_bf16_kernels_in_channels_last_are_as_close_to_fp32_as_the_torch_path(exact_fp32):
    pytest.importorskip("triton", reason="the norm kernels are Triton kernels")
    torch.manual_seed(0)
    vae = SeedVR2VAE(VAEConfig.released()).cuda().eval()  # random weights at the released widths
    g = torch.Generator(device="cuda").manual_seed(1)
    video = torch.rand((1, 3, 9, 128, 192), generator=g, device="cuda") * 2 - 1
    z = torch.randn((1, 16, 3, 16, 24), generator=g, device="cuda")
    saved = vae_ops.NORM_KERNELS, vae_layout.CHANNELS_LAST
    try:
        vae_ops.NORM_KERNELS, vae_layout.CHANNELS_LAST = False, False
        want = vae.encode(video)[0], vae.decode(z)
        vae.to(torch.bfloat16)
        before = vae.encode(video)[0], vae.decode(z)  # the NCDHW torch path in bf16
        vae_ops.NORM_KERNELS, vae_layout.CHANNELS_LAST = True, "auto"
        now = vae.encode(video)[0], vae.decode(z)
    finally:
        vae_ops.NORM_KERNELS, vae_layout.CHANNELS_LAST = saved
    for stage, ref, old, new in zip(("encode", "decode"), want, before, now):
        assert torch.isfinite(new).all(), stage
        err_old, err_new = rel(old, ref), rel(new, ref)
        assert err_new <= 1.25 * err_old + 1e-3, (stage, err_new, err_old)
