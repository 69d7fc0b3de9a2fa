"""The VSA Triton kernels themselves on the CPU, through Triton's interpreter, against the float64 rule
(backend/attention/vsa_kernel*.py): the pointer kernel, the TMA kernel's descriptor views and its other key loops.
Each runs in a subprocess (TRITON_INTERPRET must be set before triton is imported); the compiled kernels' GPU tests
are in test_vsa.py."""

import os
import subprocess
import sys
import textwrap

import pytest

from repo_paths import REPO_DIR
from comfyui_h3.backend.attention.vsa_kernel import triton
from triton_interpreter import require_interpreter

pytestmark = pytest.mark.slow  # every test here takes seconds on two cores (docs/TESTING.md)



_INTERPRETED = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention.vsa_kernel import reference, sparse_attention
    from comfyui_h3.backend.attention.vsa_plan import VSAPlan, VSASettings, tile_order
    from comfyui_h3.backend.attention import vsa_kernel
    from comfyui_h3.backend.attention.dispatch import _sdpa
    for (num_prefix, grid), topk, pairs in {cases}:
        vsa_kernel.KERNEL_CONFIG["pairs"] = pairs  # one selected tile per key block, or two side by side
        torch.manual_seed(num_prefix)
        _, sizes = tile_order(grid)
        s = num_prefix + int(sizes.sum())
        plan = VSAPlan(torch.arange(s), torch.arange(s), num_prefix, sizes, grid, VSASettings(topk=topk))
        q, k, v = torch.randn(1, s, 3, 2, 16).to(torch.float16).unbind(2)  # strided views, as fused qkv gives
        want, _ = reference(q, k, v, num_prefix, sizes, plan.topk)
        dense = lambda a, b, c: _sdpa(a.float(), b.float(), c.float()).to(a.dtype)
        got = sparse_attention(q, k, v, plan, dense, use_triton=True)
        err = float((got.double() - want).norm() / want.norm())
        print(num_prefix, grid, topk, pairs, err)
        assert err <= 2e-3, err
    print("ok")
""")


@pytest.mark.skipif(triton is None, reason="triton is not installed: the Triton kernel cannot be interpreted")
def test_triton_kernel_interpreted_matches_the_rule():
    """The Triton kernel itself (masked edge tiles, prefix blocks, selected tiles, online softmax) on the CPU through
    Triton's interpreter. In fp16: the interpreter's bf16 tl.dot is broken (garbage even for a lone 16x16 dot, Triton
    3.8), so bf16 is covered by the GPU test below; the kernel is dtype-generic."""
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    shapes = [(0, (4, 4, 4)), (70, (5, 6, 7)), (130, (3, 9, 4))]
    # an odd top-k leaves the last key block of a pair half empty; pairs=1 is the other launch setting
    cases = [(shape, topk, pairs) for shape, topk, pairs in zip(shapes, (2, 3, 3), (2, 2, 1))]
    code = _INTERPRETED.format(cases=cases)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


_INTERPRETED_TMA = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention.vsa_kernel import (reference, sparse_attention, select_tiles,
                                                       triton_video_attention)
    from comfyui_h3.backend.attention.vsa_plan import VSAPlan, VSASettings, tile_order
    from comfyui_h3.backend.attention import vsa_kernel, vsa_kernel_tma
    from comfyui_h3.backend.attention.dispatch import _sdpa
    launches = []
    launch = vsa_kernel_tma.launch_tma
    def counted(*args, **kwargs):
        launches.append(args[9])  # the view it runs
        return launch(*args, **kwargs)
    vsa_kernel_tma.launch_tma = counted
    dense = lambda a, b, c: _sdpa(a.float(), b.float(), c.float()).to(a.dtype)
    for (num_prefix, grid), topk, layout, view, want_view in {cases}:
        vsa_kernel.KERNEL_CONFIG.update(tma=True, tma_view=view)
        torch.manual_seed(num_prefix)
        _, sizes = tile_order(grid)
        s = num_prefix + int(sizes.sum())
        plan = VSAPlan(torch.arange(s), torch.arange(s), num_prefix, sizes, grid, VSASettings(topk=topk))
        if layout == "fused":  # strided views of one [B, S, 3, H, D] buffer, as fused qkv gives
            q, k, v = torch.randn(2, s, 3, 2, 16).to(torch.float16).unbind(2)
        else:  # heads outermost: no [B * S, H * D] rows view, only the 4-D descriptor
            q, k, v = (torch.randn(2, 2, s, 16).to(torch.float16).transpose(1, 2) for _ in range(3))
        assert vsa_kernel_tma.tma_view(q, k, v, torch.empty_like(q), view) == want_view
        want, _ = reference(q, k, v, num_prefix, sizes, plan.topk)
        got = sparse_attention(q, k, v, plan, dense, use_triton=True)
        assert launches.pop() == want_view and not launches
        err = float((got.double() - want).norm() / want.norm())
        print(num_prefix, grid, topk, layout, view, err)
        assert err <= 2e-3, err
    # Tile tables in reverse row order: an edge tile's program runs before the full tiles after its rows, so a store
    # past its own rows would be left standing; the TMA kernel must equal the pointer kernel (float32 out, NaN-filled).
    torch.manual_seed(5)
    _, sizes = tile_order((5, 6, 7))
    s = 70 + int(sizes.sum())
    plan = VSAPlan(torch.arange(s), torch.arange(s), 70, sizes, (5, 6, 7), VSASettings(topk=3))
    starts, sizes_t, _ = plan.tables("cpu")
    starts, sizes_t = starts.flip(0).contiguous(), sizes_t.flip(0).contiguous()
    q, k, v = torch.randn(1, s, 3, 2, 16).to(torch.float16).unbind(2)
    sel = select_tiles(q, k, 70, plan.tile_sizes, 3).to(torch.int32)
    outs = []
    for view in (None, "rows", "4d"):
        out = torch.full(q.shape, float("nan"))
        triton_video_attention(q, k, v, 70, starts, sizes_t, sel, out, tma=view is not None, tma_view=view or "auto")
        assert out[:, :70].isnan().all() and out[:, 70:].isfinite().all(), view  # video rows only, every one
        outs.append(out)
    assert launches == ["rows", "4d"], launches
    for view, out in zip(("rows", "4d"), outs[1:]):
        err = float((out[:, 70:] - outs[0][:, 70:]).norm() / outs[0][:, 70:].norm())
        print("reversed tables", view, err)
        assert err < 1e-6, (view, err)
    print("ok")
""")


@pytest.mark.skipif(triton is None, reason="triton is not installed: the Triton kernel cannot be interpreted")
def test_tma_kernel_interpreted_matches_the_rule():
    """The TMA-descriptor variant (vsa_kernel_tma.py) through Triton's interpreter, which runs tensor descriptors on
    CPU tensors (zero fill past the tensor, as TMA): both descriptor views, fused-QKV views (rows view) and
    heads-outermost tensors (4-D only), a batch of 2 (the rows view's blocks run into the next batch: masked), and
    the edge-tile store. fp16 for the interpreter's broken bf16 dot (see above); bf16 on the GPU test below."""
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    cases = [((70, (5, 6, 7)), 3, "fused", "rows", "rows"), ((0, (4, 4, 4)), 2, "fused", "auto", "4d"),
             ((130, (3, 9, 4)), 3, "heads", "auto", "4d")]
    run = subprocess.run([sys.executable, "-c", _INTERPRETED_TMA.format(cases=cases)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


_INTERPRETED_LOOPS = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention.vsa_kernel import reference, triton_video_attention
    from comfyui_h3.backend.attention.vsa_plan import VSAPlan, VSASettings, tile_order
    forms = [dict(tma_pairs=2), dict(tma_lookahead=True), dict(tma_lazy=True),
             dict(tma_lookahead=True, tma_lazy=True)]
    # an odd number of key blocks (a pair's empty second half), none before the tiles, a one-tile selection
    for (num_prefix, grid), topk in [((70, (5, 6, 7)), 3), ((0, (4, 4, 4)), 2), ((130, (3, 9, 4)), 4),
                                     ((64, (4, 4, 8)), 1)]:
        torch.manual_seed(num_prefix)
        _, sizes = tile_order(grid)
        s = num_prefix + int(sizes.sum())
        plan = VSAPlan(torch.arange(s), torch.arange(s), num_prefix, sizes, grid, VSASettings(topk=topk))
        q, k, v = torch.randn(1, s, 3, 2, 16).to(torch.float16).unbind(2)
        q = q * 6  # sharp softmax: the running max moves by more than 2^8 within a row (the lazy rescale's branch)
        want, sel = reference(q, k, v, num_prefix, sizes, plan.topk)
        starts, sizes_t, _ = plan.tables("cpu")
        for form in forms:
            out = torch.full(q.shape, float("nan"))
            triton_video_attention(q, k, v, num_prefix, starts, sizes_t, sel.to(torch.int32), out, tma=True,
                                   tma_view="4d", **form)
            err = float((out[:, num_prefix:].double() - want[:, num_prefix:]).norm() / want[:, num_prefix:].norm())
            print(num_prefix, grid, topk, form, err)
            assert err <= 2e-3, (form, err)
    print("ok")
""")


@pytest.mark.skipif(triton is None, reason="triton is not installed: the Triton kernel cannot be interpreted")
def test_tma_kernel_loop_forms_interpreted_match_the_rule():
    """The TMA kernel's other key loops (two blocks per iteration, look-ahead scores, conditional rescale) through
    Triton's interpreter, float32 output vs the float64 rule; bf16 on the GPU test below."""
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    run = subprocess.run([sys.executable, "-c", _INTERPRETED_LOOPS], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
