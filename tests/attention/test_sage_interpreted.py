"""The SAGE Triton kernels on the CPU through Triton's interpreter (backend/attention/sage_kernel.py,
sage_quant_kernel.py): the INT8 quantiser pass bit for bit against the torch rule's, and the attention kernel's
indexing against the float64 rule. Each runs in a subprocess (TRITON_INTERPRET must be set before triton is imported).
Triton 3.8's interpreter rounds float32 -> e4m3 wrongly at binade edges (31.04 -> 16, where torch and the GPU give 32),
so FP8 results are checked loosely here and bit for bit by the GPU tests in test_sage.py."""

import os
import subprocess
import sys
import textwrap

import pytest

from repo_paths import REPO_DIR
from comfyui_h3.backend.attention.sage_kernel import triton
from triton_interpreter import require_interpreter

pytestmark = [pytest.mark.slow, pytest.mark.skipif(triton is None, reason="triton is not installed: the Triton "
                                                   "kernels cannot be interpreted")]

_QUANTISERS = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention import sage_rule, sage_kernel
    for s in (64, 77, 300):
        torch.manual_seed(s)
        q, k, v = torch.randn(1, s, 3, 2, 64).to(torch.bfloat16).unbind(2)  # strided views, as fused qkv gives
        k = k + 2
        # the dense rule's blocks; VSA's rows; the dense rule's tiles with a scale per row
        for blocks in ((sage_rule.BLOCK_M, sage_rule.BLOCK_N), (1, 1), (sage_rule.BLOCK_M, sage_rule.BLOCK_N, "row")):
            want, got = sage_rule.quantize(q, k, v, *blocks), sage_kernel.quantize_on_gpu(q, k, v, *blocks)
            for name in ("q8", "q_scale", "k8", "k_scale", "v_scale"):
                a, b = getattr(want, name), getattr(got, name)
                assert a.shape == b.shape and torch.equal(a, b), (s, blocks, name)
            same = (want.v8.float() == got.v8.float()).float().mean().item()
            assert want.v8.shape == got.v8.shape and same > 0.9, (s, blocks, same)  # the interpreter's e4m3 edges
            assert torch.all(got.v8.float()[..., s:] == 0), (s, blocks)
    print("ok")
""")

_ATTENTION = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention import sage_rule, sage_kernel
    cases = [(64, 2, 0.0, "block"), (200, 2, 0.0, "block"), (256, 3, 0.0, "block"), (200, 2, 0.05, "block"),
             (200, 2, 0.0, "row"), (300, 2, 0.05, "row")]
    for s, heads, skip, scales in cases:
        torch.manual_seed(s)
        q, k, v = (torch.randn(1, s, heads, 64) for _ in range(3))
        if scales == "row":  # rows of very different sizes, shuffled: a scale read from the wrong row would show
            q = q * torch.logspace(-1, 0.5, s)[torch.randperm(s)][None, :, None, None]
            k = k * torch.logspace(-1, 0.7, s)[torch.randperm(s)][None, :, None, None]
        settings = sage_rule.SageSettings(skip, scales)
        ops = sage_rule.quantize(q * 3, k, v, scales=scales)
        want = sage_rule.attend_quantized(ops, settings)
        got = sage_kernel.attend_operands(ops, settings, torch.empty(1, s, heads, 64))
        err = float((got.double() - want).norm() / want.norm())
        print(s, heads, skip, scales, err)
        assert err < 0.06, err  # a layout or indexing slip gives O(1); the e4m3 edges a few percent
    print("ok")
""")


@pytest.mark.parametrize("code", [_QUANTISERS, _ATTENTION], ids=["quantisers", "attention"])
def test_sage_kernels_interpreted(code):
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
