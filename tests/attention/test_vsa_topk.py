"""VSA's tile selection top-k (backend/attention/vsa_topk.py): the one-pass Triton kernel (radix search for the k-th
score, ranks by a cumulative count) against torch.topk + sort, through Triton's interpreter on the CPU and natively
on a GPU; ties at the k-th score keep the lowest columns."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.attention.vsa_topk import (MAX_COLUMNS, topk_ascending, topk_ascending_torch,
                                                 triton_topk_supported)
from triton_interpreter import require_interpreter

try:
    import triton
except ImportError:  # pragma: no cover - depends on the install
    triton = None


_INTERPRETED = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention.vsa_topk import topk_ascending, topk_ascending_torch
    g = torch.Generator().manual_seed(0)
    # rows of 1, odd, a power of two and past one (masked columns), k from 1 to every column
    for shape, k in [((3, 5, 37), 4), ((2, 128), 128), ((7, 1), 1), ((4, 300), 17), ((2, 3, 64), 63)]:
        x = torch.randn(*shape, generator=g) * 10 ** torch.randint(-3, 4, (1,), generator=g).item()
        for dtype in (torch.long, torch.int32):
            got = topk_ascending(x, k, dtype, use_triton=True)
            assert got.dtype == dtype and torch.equal(got.long(), topk_ascending_torch(x, k)), (shape, k, got)
    # signed zeros, infinities, negatives, ties at the k-th value (lowest columns kept)
    x = torch.tensor([[0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 1.0, 2.0, 1.0]])
    assert topk_ascending(x, 4, use_triton=True).tolist() == [[2, 4, 6, 7]]
    assert topk_ascending(x, 5, use_triton=True).tolist() == [[2, 4, 6, 7, 8]]
    assert topk_ascending(x, 7, use_triton=True).tolist() == [[0, 1, 2, 4, 6, 7, 8]]
    assert topk_ascending(x, 9, use_triton=True).tolist() == [list(range(9))]
    neg = -torch.arange(1.0, 11.0).flip(0)  # -10 .. -1: the largest are the last columns
    assert topk_ascending(neg[None], 3, use_triton=True).tolist() == [[7, 8, 9]]
    print("ok")
""")


@pytest.mark.slow
@pytest.mark.skipif(triton is None, reason="triton is not installed: the top-k kernel cannot be interpreted")
def test_triton_topk_interpreted_matches_torch():
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    run = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def test_torch_path_and_when_triton_runs():
    x = torch.randn(2, 3, 50)
    got = topk_ascending(x, 5)  # a CPU tensor: torch.topk + sort
    assert got.dtype == torch.long and got.shape == (2, 3, 5)
    assert torch.equal(got, torch.topk(x, 5).indices.sort(-1).values)
    assert (got.diff(dim=-1) > 0).all()
    assert topk_ascending(x, 5, torch.int32).dtype == torch.int32
    assert not triton_topk_supported(x, 5)  # not CUDA
    if torch.cuda.is_available() and triton is not None:
        xc = x.cuda()
        assert triton_topk_supported(xc, 5) and not triton_topk_supported(xc.double(), 5)
        assert not triton_topk_supported(xc, 51) and not triton_topk_supported(torch.zeros(1, MAX_COLUMNS + 1,
                                                                                           device="cuda"), 1)


@pytest.mark.skipif(not torch.cuda.is_available() or triton is None,
                    reason="needs a CUDA GPU and triton: the CPU runs the kernel interpreted (test above)")
@pytest.mark.parametrize("tiles,k", [(1188, 119), (597, 60), (4096, 1), (2000, 2000), (7, 3)])
def test_triton_topk_on_gpu_matches_torch(tiles, k):
    g = torch.Generator(device="cuda").manual_seed(tiles)
    scores = torch.randn(3, 8, tiles, tiles if tiles < 2000 else 16, device="cuda", generator=g).transpose(-1, -2)
    scores = scores.contiguous() if tiles == 597 else scores  # the others: a transposed (non-contiguous) view
    got = topk_ascending(scores, k)
    assert torch.equal(got, topk_ascending_torch(scores, k))
