"""VSA at SAGE precision (backend/attention/vsa_sage.py): the per-row quantisers by hand, the rule against a row-by-row
float64 computation written apart from it, its distance from the exact VSA rule, the CPU path, the Triton kernel
through Triton's interpreter (its indexing: prefix blocks, selected tiles, edge tiles) and on an FP8 GPU."""

import dataclasses
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.attention import vsa_sage
from comfyui_h3.backend.attention.dispatch import _sdpa
from comfyui_h3.backend.attention.sage_rule import FP8
from comfyui_h3.backend.attention.vsa_kernel import reference as vsa_reference, select_tiles
from comfyui_h3.backend.attention.registry import AttentionSpec
from comfyui_h3.backend.attention.vsa_plan import VSASettings
from comfyui_h3.backend.pipelines.h3.request import H3Request
from triton_interpreter import require_interpreter
from vsa_forward import flat_plan


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_rows_get_their_own_int8_scale():
    x = torch.tensor([[[[1.0, -2.0, 0.5, 254.0]], [[0.0, 0.0, 0.0, 0.0]], [[-0.3, 0.1, 0.2, 0.0]]]])  # [1, 3, 1, 4]
    ops = vsa_sage.quantize(x, torch.zeros_like(x), x)
    codes, scale = ops.q8, ops.q_scale
    assert codes.shape == (1, 1, 3, 4) and codes.dtype == torch.int8 and scale.shape == (1, 1, 3)
    assert scale[0, 0].tolist() == pytest.approx([2.0, 1.0, 0.3 / 127])  # a zero row: scale 1
    assert codes[0, 0, 0].tolist() == [0, -1, 0, 127]  # 0.5 and 1 / 2 round half to even
    assert codes[0, 0, 1].tolist() == [0, 0, 0, 0] and codes[0, 0, 2, 0] == -127


def _row_by_row(ops, num_prefix, starts, sizes, sel):
    """The rule for every video query row with scalar loops over its key blocks (float64), from the operands."""
    b, h, s, d = ops.q8.shape
    out = torch.zeros(b, s - num_prefix, h, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            v_scale = ops.v_scale[bi, hi].double()
            for t in range(len(starts)):
                blocks = [list(range(a, min(a + 64, num_prefix))) for a in range(0, num_prefix, 64)]
                blocks += [list(range(int(starts[j]), int(starts[j]) + int(sizes[j]))) for j in sel[bi, hi, t].tolist()]
                for r in range(int(starts[t]), int(starts[t]) + int(sizes[t])):
                    qr = ops.q8[bi, hi, r].double() * float(ops.q_scale[bi, hi, r]) / math.sqrt(d)
                    m, l, acc = -math.inf, 0.0, torch.zeros(d, dtype=torch.float64)
                    for keys in blocks:
                        scores = [float(qr @ (ops.k8[bi, hi, c].double() * float(ops.k_scale[bi, hi, c])))
                                  for c in keys]
                        m_new = max(m, max(scores))
                        probs = [math.exp(x - m_new) for x in scores]
                        alpha = math.exp(m - m_new)
                        coded = torch.tensor(probs, dtype=torch.float64).mul(448).to(FP8).double()
                        acc = acc * alpha + sum(coded[i] * ops.v8[bi, hi, :, c].double() for i, c in enumerate(keys))
                        l, m = l * alpha + sum(probs), m_new
                    out[bi, r - num_prefix, hi] = acc * v_scale / (448 * l)
    return out


def test_rule_equals_a_row_by_row_computation():
    torch.manual_seed(3)
    plan, s = flat_plan(70, (5, 4, 6), topk=2)  # a prefix of two blocks, edge tiles of 32 and 48 rows
    q, k, v = (torch.randn(1, s, 2, 32) for _ in range(3))
    starts, sizes, _ = plan.tables(q.device)
    sel = select_tiles(q, k, 70, plan.tile_sizes, plan.topk)
    ops = vsa_sage.quantize(q, k + 5, v)
    got = vsa_sage.attend_video(ops, 70, starts, sizes, sel)
    want = _row_by_row(ops, 70, starts, sizes, sel)
    assert rel(got, want) < 1e-12


@pytest.mark.parametrize("num_prefix,grid", [(0, (8, 4, 8)), (70, (5, 6, 7)), (130, (8, 4, 5))])
def test_sparse_steps_at_sage_precision_stay_near_the_exact_vsa_rule(num_prefix, grid):
    torch.manual_seed(num_prefix)
    plan, s = flat_plan(num_prefix, grid, topk=3)
    q, k, v = (torch.randn(2, s, 3, 32) for _ in range(3))
    k = k + 4 * torch.randn(1, 1, 3, 32)  # a large K mean: the smoothing keeps int8 accurate
    exact, sel = vsa_reference(q, k, v, num_prefix, plan.tile_sizes, plan.topk)
    got = vsa_sage.sparse_attention(q, k, v, plan, _sdpa, use_kernel=False)
    err = rel(got[:, num_prefix:], exact[:, num_prefix:])
    assert 1e-3 < err < 0.06  # lossy (e4m3 P and V), near the rule it approximates
    ops = vsa_sage.quantize(q, k, v)
    starts, sizes, _ = plan.tables(q.device)
    rule = vsa_sage.attend_video(ops, num_prefix, starts, sizes, sel)
    assert rel(got[:, num_prefix:], rule) < 2e-3  # the rule in float32: a P now and then rounds to the next e4m3
    if num_prefix:  # prefix queries stay dense
        assert rel(got[:, :num_prefix], exact[:, :num_prefix]) < 1e-5


_KERNEL = textwrap.dedent("""
    import torch
    from comfyui_h3.backend.attention import vsa_sage
    from comfyui_h3.backend.attention.vsa_kernel import select_tiles
    from comfyui_h3.backend.attention.vsa_plan import VSAPlan, VSASettings, tile_order
    for prefix, grid, heads in ((0, (4, 4, 8), 2), (70, (5, 6, 7), 2), (130, (4, 4, 5), 1)):
        torch.manual_seed(prefix)
        _, sizes = tile_order(grid)
        s = prefix + int(sizes.sum())
        plan = VSAPlan(torch.arange(s), torch.arange(s), prefix, sizes, grid, VSASettings(topk=2))
        q, k, v = (torch.randn(1, s, heads, 64) for _ in range(3))
        starts, sizes, _ = plan.tables(q.device)
        sel = select_tiles(q, k, prefix, plan.tile_sizes, plan.topk)
        ops = vsa_sage.quantize(q * 2, k, v)
        want = vsa_sage.attend_video(ops, prefix, starts, sizes, sel)
        out = torch.zeros(1, s, heads, 64)
        vsa_sage.kernel_video_attention(ops, prefix, starts, sizes, sel, out)
        err = float((out[:, prefix:].double() - want).norm() / want.norm())
        print(prefix, grid, heads, err)
        assert err < 0.06, err  # an indexing slip gives O(1); the interpreter's e4m3 edges a few percent
        assert torch.all(out[:, :prefix] == 0)  # the kernel writes video rows only
        # q = 0: every attended key weighs the same and P is 448 exactly (no e4m3 rounding): each video row is the
        # mean of its attended V rows, which checks the indexing (prefix blocks, gathered tiles, edge masks) tightly
        ops = vsa_sage.quantize(torch.zeros_like(q), k, v)
        vsa_sage.kernel_video_attention(ops, prefix, starts, sizes, sel, out)
        want = vsa_sage.attend_video(ops, prefix, starts, sizes, sel)
        assert float((out[:, prefix:].double() - want).abs().max()) < 1e-5
    print("ok")
""")


@pytest.mark.slow
@pytest.mark.skipif(vsa_sage.triton is None, reason="triton is not installed: the kernel cannot be interpreted")
def test_kernel_interpreted_follows_the_rule():
    require_interpreter()
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=REPO_DIR)
    run = subprocess.run([sys.executable, "-c", _KERNEL], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


needs_fp8_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and vsa_sage.kernel_supported(torch.empty(1, 1, 1, 128, device="cuda"))
         if torch.cuda.is_available() else False),
    reason="needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+) and Triton; the CPU tests above check "
           "the rule and, interpreted, the kernel's indexing")


@needs_fp8_gpu
@pytest.mark.parametrize("num_prefix,grid", [(0, (8, 8, 8)), (502, (10, 12, 16))])
def test_kernel_on_the_gpu_equals_the_float64_rule(num_prefix, grid):
    plan, s = flat_plan(num_prefix, grid, topk=0.1)
    g = torch.Generator(device="cuda").manual_seed(num_prefix)
    q, k, v = (torch.randn(1, s, 4, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    got = vsa_sage.sparse_attention(q, k, v, plan, _sdpa)
    ops = vsa_sage.quantize(q, k, v)
    starts, sizes, _ = plan.tables(q.device)
    sel = select_tiles(q, k, num_prefix, plan.tile_sizes, plan.topk)
    names = ("q8", "q_scale", "k8", "k_scale", "v8", "v_scale")
    cpu = dataclasses.replace(ops, **{name: getattr(ops, name).cpu() for name in names})
    want = vsa_sage.attend_video(cpu, num_prefix, starts.cpu(), sizes.cpu(), sel.cpu())
    assert rel(got[:, num_prefix:].cpu(), want) < 3e-3  # bf16 output, exp2 vs exp, a P now and then to the next e4m3


# -- the option: settings, backend, loader widget, CLI, the tiny model ------------------------------------------------

def test_precision_is_a_vsa_setting_named_only_when_not_bf16():
    from comfyui_h3.backend.attention.registry import AttentionSpec, get_backend

    sage = VSASettings(precision="sage")
    assert sage.spec() == "topk=0.1,dense=0.25,precision=sage" and VSASettings().spec() == "topk=0.1,dense=0.25"
    assert VSASettings.parse("topk=0.2, precision=sage") == VSASettings(0.2, 0.25, "sage")
    assert AttentionSpec.parse("vsa:precision=sage") == AttentionSpec("vsa", sage)
    for bad in ("precision=fp4", "precision"):
        with pytest.raises(ValueError, match="VSA"):
            VSASettings.parse(bad)
    assert get_backend("vsa:precision=sage").name == "vsa:topk=0.1,dense=0.25,precision=sage"
    assert get_backend("vsa").check_device is None  # bf16 runs wherever the bf16 VSA runs
    assert str(AttentionSpec("vsa", sage)) == "vsa:topk=0.1,dense=0.25,precision=sage"  # what the manifest records


def test_sage_precision_is_refused_on_gpus_without_fp8(monkeypatch):
    from comfyui_h3.backend.parallel.context import ParallelContext
    from comfyui_h3.backend.runtime import Runtime

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match=r"VSA at precision sage needs FP8 .*A100.*: choose precision bf16"):
        Runtime.make("cuda:0", ParallelContext(), "vsa:precision=sage", "bfloat16")
    assert Runtime.make("cpu", ParallelContext(), "vsa:precision=sage", "float32").attention.name.endswith("sage")


def test_loader_appends_the_precision_widget_last(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes import loader

    optional = loader.H3ModelLoader.INPUT_TYPES()["optional"]
    assert list(optional)[-1] == "attention_precision"  # after every widget saved workflows know
    kind, opts = optional["attention_precision"]
    assert kind == ["bf16", "sage"] and opts["default"] == "bf16" and "lossy" in opts["tooltip"]
    monkeypatch.setattr(loader, "ensure_tiny_model", lambda: tiny_h3_dir)
    load = loader.H3ModelLoader().load
    attention = load(loader.TINY_NAME, "cpu", "float32", "vsa", attention_precision="sage")[0].config.attention
    assert attention == AttentionSpec("vsa", VSASettings(precision="sage"))
    assert str(load(loader.TINY_NAME, "cpu", "float32", "sdpa", attention_precision="sage")[0].config.attention) \
        == "sdpa"  # ignored by the other kernels, as the tooltip says


def test_cli_precision_flag(monkeypatch):
    from cli_engine_configs import engine_configs_for
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import attention_spec

    request = H3Request(prompt="x", num_frames=124, steps=3, seed=9, width=128, height=64, decode=False)
    configs = engine_configs_for(monkeypatch, ["--attention", "vsa", "--attention-precision", "sage"], request)
    assert configs and all(str(c.attention) == "vsa:topk=0.1,dense=0.25,precision=sage" for c in configs)
    with pytest.raises(ValueError, match="need --attention vsa"):
        attention_spec(_parser().parse_args(["generate", "--prompt", "x", "--attention-precision", "sage"]))
    with pytest.raises(SystemExit):
        _parser().parse_args(["generate", "--prompt", "x", "--attention", "vsa", "--attention-precision", "fp4"])


@pytest.mark.slow
def test_tiny_t2va_at_sage_precision_stays_near_bf16_vsa(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    def run(spec):
        request = H3Request(prompt="thunder over hills", num_frames=124, steps=3, seed=9, width=128, height=64,
                            decode=False)
        return h3_config(str(tiny_h3_dir), dtype="float32", attention=spec).build_pipeline(0).run(request)

    exact, sage = run("vsa:topk=2,dense=1"), run("vsa:topk=2,dense=1,precision=sage")
    for key in ("video_latents", "audio_latents"):
        err = rel(getattr(sage, key), getattr(exact, key))
        assert 0 < err < 1e-2, (key, err)  # lossy on the two sparse steps, near the bf16 rule
