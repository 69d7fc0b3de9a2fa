"""FP8 GEMMs on a Hopper GPU (compute capability 9.0+; skipped elsewhere, saying why): the fused Triton kernels
against the torch reference at the release's widths, torch._scaled_mm against the dequantised emulation, an FP8
block (kernels + _scaled_mm) against the same block emulated, compiled against eager, and the loader's "fp8" storage on
the tiny model. The same logic on the CPU: tests/pipelines/h3/test_fp8.py."""

import copy

import pytest
import torch

from comfyui_h3.backend.models import fp8_linear as f8
from comfyui_h3.backend.models.fp8_linear import Fp8Linear
from comfyui_h3.backend.models.h3_ops import RowSegments, rope_inv_freq, rope_tables
from comfyui_h3.backend.models.h3_transformer import H3Block, H3TransformerConfig, load_h3_transformer

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the _scaled_mm path needs one (tests/pipelines/h3/test_fp8.py covers the logic on the CPU)",
                allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip(f"{torch.cuda.get_device_name()} is compute capability "
                f"{'.'.join(map(str, torch.cuda.get_device_capability()))}: these tests are for Hopper (9.0+)",
                allow_module_level=True)

DEV = torch.device("cuda")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _same_codes(a, b):
    return (a.data.float() == b.data.float()).float().mean().item()


def test_fused_kernels_equal_the_reference():
    pytest.importorskip("triton", reason="Triton is not installed: the fused kernels cannot run")
    gen = torch.Generator(device=DEV).manual_seed(0)
    cols, ffn = 5376, 14336  # the release's widths
    x = (torch.randn(2, 1500, cols, device=DEV, generator=gen) * 3).bfloat16()
    weight = (torch.rand(cols, device=DEV, generator=gen) + 0.5).bfloat16()
    shift, scale = (torch.randn(4, 6 * cols, device=DEV, generator=gen) * 0.5).bfloat16().chunk(6, dim=-1)[:2]
    runs = ((0, 40, 1), (40, 1200, 0), (1300, 1500, 3))  # rows 1200..1299 in no run
    got = f8.norm_modulate_rows(x, weight, 1e-5, runs, scale, shift, kernels=True)
    want = f8.norm_modulate_rows(x, weight, 1e-5, runs, scale, shift, kernels=False)
    assert _same_codes(got, want) >= 0.999 and torch.allclose(got.scale, want.scale, rtol=1e-5)
    h = (torch.randn(1500, 2 * ffn, device=DEV, generator=gen) * 2).bfloat16()
    for make in (f8.swiglu_rows, f8.quantise_rows):  # SwiGLU of [value | gate]; the attention output's plain pass
        got, want = make(h, True), make(h, False)
        assert _same_codes(got, want) >= 0.999 and torch.allclose(got.scale, want.scale, rtol=1e-5), make


def test_scaled_mm_equals_the_emulation():
    gen = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(3000, 5376, device=DEV, generator=gen).bfloat16()
    layer = Fp8Linear.from_weight((torch.randn(7168, 5376, device=DEV, generator=gen) * 0.02).bfloat16(), False)
    rows = f8.quantise_rows(x, kernels=True)
    emulated = f8.fp8_matmul(rows, layer.weight, layer.weight_scale, emulate=True)
    for fast in (False, True):
        got = f8.fp8_matmul(rows, layer.weight, layer.weight_scale, emulate=False, fast_accum=fast)
        assert got.dtype == torch.bfloat16 and got.shape == emulated.shape
        assert rel(got, emulated) < (2e-3 if not fast else 1e-2), fast  # summation order and bf16 rounding only


def _emulated_copy(block):
    twin = copy.deepcopy(block)
    for m in twin.modules():
        if isinstance(m, Fp8Linear):
            m.emulate = True
    twin.fp8 = "emulated"
    return twin


def _block_inputs(cfg, rows):
    gen = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(1, rows, cfg.hidden_size, device=DEV, generator=gen).bfloat16()
    positions = torch.randint(0, 50, (rows, 3), device=DEV, generator=gen).float()
    rope = rope_tables(positions, rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta).to(DEV))
    table_rows = torch.cat([torch.full((rows // 10,), 4), torch.full((rows - rows // 10,), 0)])
    temb = torch.randn(2, cfg.time_embed_dim, device=DEV, generator=gen)
    return x, RowSegments.from_rows(table_rows), rope, temb


def test_fp8_block_equals_its_emulation_and_compiles():
    from comfyui_h3.backend.attention.dispatch import get_attention

    cfg = H3TransformerConfig()  # the release's block
    torch.manual_seed(3)
    block = H3Block(cfg).to(DEV, torch.bfloat16).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0, 0.02)
    block.attn.fuse_qkv()
    fp8 = copy.deepcopy(block)
    fp8.use_fp8_gemms(emulate=False)
    assert fp8.fp8 == "scaled_mm"
    emulated = _emulated_copy(fp8)
    x, segments, rope, temb = _block_inputs(cfg, 2000)
    attention = get_attention("sdpa")
    with torch.no_grad():
        mod = block.adaln_proj(temb)
        # what the block adds to the residual (in fp32: the residual itself would hide the differences)
        update = lambda b: b(x.clone(), mod, segments, rope, attention).float() - x.float()  # noqa: E731
        want, got, emul = update(block), update(fp8), update(emulated)
        to_bf16 = rel(got, want)
        assert 0.005 < to_bf16 < 0.15  # the bf16 block's update, up to FP8 rounding
        # kernels + _scaled_mm vs reference quantisation + emulated matmul. Measured on the H200: rel(got, emul)
        # 0.035 with rel(got, want) 0.075: the fused kernels quantise activations from fp32 where the reference
        # rounds them to bf16 first, so single fp8 roundings flip and the two FP8 paths are not the same numbers.
        # What must hold: the two FP8 paths are closer to each other than FP8 is to bf16 (a wrong scale or layout
        # would put them as far apart as the update itself, or farther).
        assert rel(got, emul) < 0.6 * to_bf16, (rel(got, emul), to_bf16, rel(emul, want))
        fp8.compile(fullgraph=True)  # inductor, as the engine compiles blocks; the custom ops stay opaque
        # Compiled vs eager: inductor fuses the bf16 elementwise work around the FP8 GEMMs and rounds it differently,
        # which flips single fp8 roundings as above (H200, 2026-12-01: rel 0.037 with to_bf16 ~0.075). The same
        # bound: closer to the eager FP8 block than FP8 is to bf16.
        assert rel(update(fp8), got) < 0.6 * to_bf16, (rel(update(fp8), got), to_bf16)


def test_loader_stores_fp8_on_the_gpu(tiny_h3_dir):
    from tiny_dit import config_inputs as _tiny_inputs, to_bf16 as _bf16

    folder = tiny_h3_dir / "transformer"
    ref = load_h3_transformer(folder, DEV, torch.bfloat16)
    fp8 = load_h3_transformer(folder, DEV, torch.bfloat16, storage="fp8")
    assert all(b.fp8 == "scaled_mm" and b.attn.qkv_fp8.weight.dtype == f8.FP8 for b in fp8.transformer_blocks)
    emulated = copy.deepcopy(fp8)
    for block in emulated.transformer_blocks:
        for m in block.modules():
            if isinstance(m, Fp8Linear):
                m.emulate = True
        block.fp8 = "emulated"
    args = tuple(a.to(DEV) for a in _bf16(_tiny_inputs(ref.config)))
    with torch.no_grad():
        want, got, emul = ref(*args), fp8(*args), emulated(*args)
    for g, w, e in zip(got, want, emul):
        assert rel(g, w) < 0.03 and rel(g, e) < rel(g, w) / 2
