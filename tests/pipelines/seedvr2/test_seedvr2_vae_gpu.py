"""The SeedVR2 VAE's CUDA default (the compiled Triton norm kernels, channels_last_3d activations on cuDNN's NDHWC
convs) against the official goldens in float32 and, at the released widths in bf16, against float32 math as closely
as the NCDHW torch path it replaces. The same logic runs on the CPU in test_seedvr2_vae.py (the channels-last pass)
and test_seedvr2_vae_kernels.py (the kernels, interpreted)."""

import pytest
import torch
from safetensors import safe_open

from repo_paths import FIXTURES
from comfyui_h3.backend.models.seedvr2 import vae_layout, vae_ops
from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (compiled Triton kernels, cuDNN channels-last convs); "
                                       "the CPU tests cover the same paths interpreted")



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
    probe = torch.empty((1, 2, 1, 1, 1), device="cuda", memory_format=torch.channels_last_3d)
    assert vae_ops._writes_frames_in_place(probe)  # row bands below: each frame written in place by cuDNN
    mean, logvar = vae.encode(T["enc.2.x"].float().cuda(), chunk_bytes=1 << 16)
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
        banded = vae.encode(video, chunk_bytes=1 << 21)[0], vae.decode(z, chunk_bytes=1 << 21)  # frames in place
    finally:
        vae_ops.NORM_KERNELS, vae_layout.CHANNELS_LAST = saved
    for stage, ref, old, new, band in zip(("encode", "decode"), want, before, now, banded):
        assert torch.isfinite(new).all() and torch.isfinite(band).all(), stage
        err_old, err_new, err_band = rel(old, ref), rel(new, ref), rel(band, ref)
        assert err_new <= 1.25 * err_old + 1e-3, (stage, err_new, err_old)
        assert err_band <= 1.25 * err_old + 1e-3, (stage, err_band, err_old)


def test_the_compiled_softmax_and_gemm_attention_equal_float64():
    pytest.importorskip("triton", reason="the softmax is a Triton kernel")
    from comfyui_h3.backend.models.seedvr2 import vae_kernels

    g = torch.Generator(device="cuda").manual_seed(2)
    s = torch.randn((40, 64512 + 5), generator=g, device="cuda") * 6  # a released-size row, a ragged last block
    got = vae_kernels.softmax_rows(s, 0.3, torch.bfloat16)
    want = torch.softmax(s.double() * 0.3, -1)
    assert (got.double() - want).abs().max() <= 2 ** -8 * want.max() + 1e-12
    assert (got.double() - want.bfloat16().double()).abs().max() <= 2 ** -8 * want.max()  # rounded to nearest
    q, k, v = (torch.randn((1, 1, 4096, 512), generator=g, device="cuda").bfloat16() for _ in range(3))
    assert vae_ops._gemm_attention_for(q)
    att = vae_ops._gemm_attention(q, k, v, chunk_bytes=6 * 4096 * 1000)  # ragged query chunks
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 512 ** 0.5, -1) @ v.double()
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert rel(att, ref) <= 1.25 * rel(sdpa, ref) + 1e-3, (rel(att, ref), rel(sdpa, ref))


def test_the_compiled_row_copies_equal_torch_copies():
    pytest.importorskip("triton", reason="the row copy is a Triton kernel")
    from comfyui_h3.backend.models.seedvr2 import vae_kernels

    cl = torch.channels_last_3d
    src = torch.randn((1, 128, 4, 33, 70), device="cuda").bfloat16().contiguous(memory_format=cl)
    buf = torch.full((1, 128, 6, 31, 72), 5.0, device="cuda").bfloat16().contiguous(memory_format=cl)
    want = buf.clone()
    want[:, :, 1:3, 1:30, 1:71].copy_(src[:, :, 2:4, 3:32])
    vae_kernels.copy_rows(buf[:, :, 1:3, 1:30, 1:71], src[:, :, 2:4, 3:32])
    vae_kernels.copy_rows(buf[:, :, 3:6], buf[:, :, :1].expand(-1, -1, 3, -1, -1))
    want[:, :, 3:6] = want[:, :, :1]
    assert torch.equal(buf, want)
