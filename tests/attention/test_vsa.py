"""Video Sparse Attention (backend/attention/vsa*.py): the plan (tiles, permutation, schedule), the rule against its
float64 reference (torch fallback on the CPU, the Triton kernel on a GPU; interpreted on the CPU:
test_vsa_interpreted.py), top-k = all tiles equal to dense attention, and the tiny H3 model end to end with the "vsa"
backend."""

import os
import subprocess
import sys

import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.attention.dispatch import _sdpa
from comfyui_h3.backend.attention.registry import AttentionSpec, available, get_backend
from comfyui_h3.backend.attention.vsa_kernel import (reference, select_tiles, sparse_attention, triton,
                                                   triton_video_attention)
from comfyui_h3.backend.attention.vsa_plan import VSASettings, make_plan
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.layout import ReferenceBlock, build_layout, build_reference_layout
from comfyui_h3.backend.pipelines.h3.request import H3Request
from vsa_forward import assert_compiled_equals_eager, flat_plan
from triton_interpreter import require_interpreter

# (prefix rows, latent grid (t, h, w)): no prefix, a long prefix over several blocks, edge tiles on every axis
SHAPES = [(0, (8, 4, 8)), (70, (5, 6, 7)), (300, (3, 9, 4)), (130, (8, 4, 5))]


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def fp32_dense(q, k, v):
    return _sdpa(q.float(), k.float(), v.float()).to(q.dtype)


def test_plan_permutation_round_trip_and_tile_membership():
    geo = type("Geo", (), dict(latent_height=40, latent_width=26, latent_frames=6, audio_latents=7))()
    layout = build_layout(torch.ones(11, dtype=torch.long), geo, (1, 2, 2), ("first",))
    plan = make_plan(layout, VSASettings(topk=3))
    s = layout.seq_len
    assert torch.equal(plan.order[plan.inverse], torch.arange(s)) and torch.equal(plan.inverse[plan.order],
                                                                                  torch.arange(s))
    assert plan.grid == (6, 20, 13) and plan.num_tiles == 2 * 5 * 4 and int(plan.tile_sizes.sum()) == 6 * 20 * 13
    # the prefix is every non-target row in packed order: text, the keyframe condition rows, the audio rows
    n_target = 6 * 20 * 13
    assert plan.num_prefix == s - n_target and torch.equal(plan.order[:plan.num_prefix], torch.arange(s - n_target))
    assert plan.prefix_blocks[-1] == (64 * (plan.num_prefix // 64), plan.num_prefix % 64)
    # every tile holds exactly the rows of its 4x4x4 cell of the target grid (edge tiles fewer)
    pos = layout.position_ids
    frame_t = torch.unique(pos[-n_target:, 0])
    h_vals, w_vals = torch.unique(pos[-n_target:, 1]), torch.unique(pos[-n_target:, 2])
    def cell(row):
        return tuple(int(torch.searchsorted(vals, pos[row, axis])) // 4
                     for axis, vals in enumerate((frame_t, h_vals, w_vals)))

    cells = []
    for start, size in zip(plan.tile_starts.tolist(), plan.tile_sizes.tolist()):
        members = {cell(int(r)) for r in plan.order[start:start + size]}
        assert len(members) == 1
        cells.append(members.pop())
    assert len(set(cells)) == plan.num_tiles == len(cells)  # every cell once
    # full tiles first, then the edge tiles grouped by size; (t, h, w) order inside each group
    assert plan.size_groups == [(64, 15), (32, 15), (16, 5), (8, 5)]
    run = 0
    for size, count in plan.size_groups:
        assert cells[run:run + count] == sorted(cells[run:run + count])
        assert all(plan.tile_sizes[run:run + count] == size)
        run += count
    assert sorted(plan.tile_sizes.tolist()) == sorted(t * 4 * w for t in (4, 2) for _ in range(5) for w in (4, 4, 4, 1))
    tiled = plan.permute_layout(layout)  # the DiT's view: same rows, new places
    assert torch.equal(tiled.position_ids[tiled.video_indices], pos[layout.video_indices])
    assert torch.equal(tiled.token_tags[tiled.audio_indices], layout.token_tags[layout.audio_indices])


def test_plan_of_a_reference_layout_keeps_references_in_the_prefix():
    geo = type("Geo", (), dict(latent_height=16, latent_width=16, latent_frames=5, audio_latents=3))()
    blocks = [ReferenceBlock("image", (1, 16, 16)), ReferenceBlock("video", (2, 8, 8), 4)]
    layout = build_reference_layout(torch.ones(5, dtype=torch.long), geo, (1, 2, 2), blocks)
    plan = make_plan(layout)
    assert plan.grid == (5, 8, 8) and plan.num_prefix == layout.seq_len - 5 * 64
    assert torch.equal(plan.order[plan.num_prefix:].sort().values, layout.video_indices[-5 * 64:].sort().values)


@pytest.mark.parametrize("num_prefix,grid", SHAPES)
def test_fallback_matches_the_float64_rule(num_prefix, grid):
    torch.manual_seed(num_prefix)
    plan, s = flat_plan(num_prefix, grid, topk=3)
    q, k, v = (torch.randn(2, s, 3, 32).bfloat16() for _ in range(3))
    want, sel = reference(q, k, v, num_prefix, plan.tile_sizes, plan.topk)
    assert torch.equal(select_tiles(q, k, num_prefix, plan.tile_sizes, plan.topk), sel)
    assert sel.shape[-1] == min(3, plan.num_tiles) and (sel.diff(dim=-1) > 0).all()
    got = sparse_attention(q, k, v, plan, _sdpa)
    assert got.dtype == torch.bfloat16 and rel_err(got, want) <= 2e-3


@pytest.mark.parametrize("num_prefix,grid", SHAPES[1:3])
def test_topk_all_tiles_is_dense_attention(num_prefix, grid):
    torch.manual_seed(1)
    plan, s = flat_plan(num_prefix, grid, topk=10_000)  # clamped to every tile
    assert plan.topk == plan.num_tiles
    q, k, v = (torch.randn(1, s, 2, 32).bfloat16() for _ in range(3))
    dense = _sdpa(q.double(), k.double(), v.double())
    assert rel_err(sparse_attention(q, k, v, plan, _sdpa), dense) <= 2e-3
    want, _ = reference(q, k, v, num_prefix, plan.tile_sizes, plan.topk)
    assert rel_err(want, dense) < 1e-12


def test_sparse_rule_is_not_dense():
    """The selection matters: with one tile of several, video rows differ from dense attention."""
    torch.manual_seed(2)
    plan, s = flat_plan(64, (8, 8, 8), topk=1)
    q, k, v = (torch.randn(1, s, 1, 32) for _ in range(3))
    got = sparse_attention(q, k, v, plan, _sdpa)
    assert rel_err(got[:, 64:], _sdpa(q, k, v)[:, 64:]) > 0.05
    assert torch.allclose(got[:, :64], _sdpa(q, k, v)[:, :64], atol=1e-6)  # prefix queries stay dense


def test_tma_fallback_rule(monkeypatch):
    """tma_view: which descriptor view the TMA kernel takes, or None (the pointer kernel runs). On the CPU only under
    Triton's interpreter, so the rule's tensor checks are exercised with the interpreter flag forced on."""
    pytest.importorskip("triton")
    from comfyui_h3.backend.attention import vsa_kernel_tma as tma

    if tma.TensorDescriptor is None:
        pytest.skip("this Triton has no triton.tools.tensor_descriptor (Triton < 3.3): tma_view is always None")
    q, k, v = torch.randn(1, 100, 3, 4, 32).half().unbind(2)
    monkeypatch.setattr(tma, "interpreting", lambda: False)
    assert tma.tma_view(q, k, v, torch.empty_like(q)) is None  # CPU tensors without the interpreter
    monkeypatch.setattr(tma, "interpreting", lambda: True)
    out = torch.empty_like(q)
    assert tma.tma_view(q, k, v, out) == "4d" and tma.tma_view(q, k, v, out, "rows") == "rows"  # auto: 4-D first
    assert tma.tma_view(q, k, v, out.float()) == "4d"  # a float32 output (the kernel's own arithmetic)
    heads_outer = torch.randn(2, 4, 100, 32).half().transpose(1, 2)
    assert tma.tma_view(heads_outer, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), heads_outer) is None
    assert tma.tma_view(heads_outer, heads_outer, heads_outer, torch.empty_like(heads_outer)) == "4d"
    assert tma.tma_view(heads_outer, heads_outer, heads_outer, torch.empty_like(heads_outer), "rows") is None
    misaligned = torch.randn(100 * 4 * 32 + 4).half()[4:].view(1, 100, 4, 32)  # base 8 bytes off 16
    assert tma.tma_view(misaligned, k, v, out) is None
    padded = torch.randn(1, 100, 4 * 32 + 4).half()[..., :128].unflatten(-1, (4, 32))  # rows 264 bytes apart
    assert tma.tma_view(q, padded, v, out) is None
    assert tma.tma_view(q, k, v, out.to(torch.int16)) is None and tma.tma_view(q, k, v.float(), out) is None
    with pytest.raises(ValueError, match="tma_view"):
        tma.tma_view(q, k, v, out, "2d")


@pytest.mark.skipif(not torch.cuda.is_available() or triton is None,
                    reason="needs a CUDA GPU and triton: the bf16 Triton kernel runs only there (CPU: interpreted "
                           "fp16 test above, fallback tests)")
@pytest.mark.parametrize("num_prefix,grid", SHAPES + [(1000, (12, 16, 20))])
@pytest.mark.parametrize("kernel,topk", [("pairs1", 4), ("pairs2", 5), ("tma", 5), ("tma-4d", 4), ("tma-pairs", 5),
                                         ("tma-ahead", 4), ("tma-lazy", 5), ("tma-ahead-lazy", 4)])
def test_triton_kernel_on_gpu_matches_the_rule(num_prefix, grid, kernel, topk, monkeypatch):
    """Both launch variants: the pointer kernel (one or two selected tiles per key block) and the TMA-descriptor one
    (rows view, 4-D view; two key blocks per iteration, look-ahead scores, conditional rescale) on views of a fused
    QKV buffer, as the DiT passes them."""
    from comfyui_h3.backend.attention import vsa_kernel
    from comfyui_h3.backend.attention.vsa_kernel_tma import tma_view

    config = {"pairs1": dict(pairs=1, tma=False), "pairs2": dict(pairs=2, tma=False),
              "tma": dict(tma=True, tma_view="rows"),
              "tma-4d": dict(tma=True, tma_view="4d"), "tma-pairs": dict(tma=True, tma_view="4d", tma_pairs=2),
              "tma-ahead": dict(tma=True, tma_view="4d", tma_lookahead=True),
              "tma-lazy": dict(tma=True, tma_view="4d", tma_lazy=True),
              "tma-ahead-lazy": dict(tma=True, tma_view="4d", tma_lookahead=True, tma_lazy=True)}[kernel]
    if config.get("tma") and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA kernel needs compute capability >= 9 (Hopper); this GPU runs the pointer kernel")
    for key, value in config.items():
        monkeypatch.setitem(vsa_kernel.KERNEL_CONFIG, key, value)
    torch.manual_seed(num_prefix)
    plan, s = flat_plan(num_prefix, grid, topk=topk)
    qkv = torch.randn(1, s, 3, 4, 128, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    want, sel = reference(q, k, v, num_prefix, plan.tile_sizes, plan.topk)
    qc, kc, vc = qkv.cuda().unbind(2)
    if config.get("tma"):  # the TMA kernel runs, not the pointer fallback
        assert tma_view(qc, kc, vc, torch.empty_like(qc), config.get("tma_view", "auto")) == config.get(
            "tma_view", "rows")
    assert torch.equal(select_tiles(qc, kc, num_prefix, plan.tile_sizes, plan.topk).cpu(), sel)
    got = sparse_attention(qc, kc, vc, plan, _sdpa, use_triton=True).cpu()
    # bf16 output: within 1e-3 of the error the exact answer has once rounded to bf16 (1.1-1.7e-3 on these shapes)
    assert rel_err(got, want) <= rel_err(want.bfloat16(), want) + 1e-3
    # the kernel's own arithmetic (bf16 operands, fp32 softmax / accumulation), seen through a float32 output
    starts, sizes, _ = plan.tables(qc.device)
    wide = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
    triton_video_attention(qc, kc, vc, num_prefix, starts, sizes, sel.cuda(), wide)
    assert rel_err(wide[:, num_prefix:].cpu(), want[:, num_prefix:]) <= 2e-3
    full, _ = flat_plan(num_prefix, grid, topk=10_000)
    dense = _sdpa(q.double(), k.double(), v.double())
    assert rel_err(sparse_attention(qc, kc, vc, full, _sdpa, use_triton=True).cpu(),
                   dense) <= rel_err(dense.bfloat16(), dense) + 1e-3


def test_settings_schedule_and_names():
    assert VSASettings(topk=0.1).tiles(95) == 10 and VSASettings(topk=64).tiles(30) == 30
    assert VSASettings(dense_steps=0.25).dense_count(50) == 13 and VSASettings(dense_steps=10).dense_count(4) == 4
    assert VSASettings.parse("topk=0.1, dense=10") == VSASettings(0.1, 10)
    for bad in ("topk=-1", "dense=2.5", "topk=0", "speed=3", "topk", "topk=x"):
        with pytest.raises(ValueError, match="VSA"):
            VSASettings.parse(bad)
    assert "vsa" in available()
    configured = get_backend("vsa:topk=32,dense=0.2")
    assert configured.name == "vsa:topk=32,dense=0.2" and get_backend(configured.name).name == configured.name
    with pytest.raises(ValueError, match="takes no options"):
        get_backend("sdpa:topk=3")


def test_attention_spec_is_typed_and_its_text_is_read_once(monkeypatch):
    """The engine carries AttentionSpec(name, settings); text is read by AttentionSpec.parse where a user types it,
    and every rank configures its backend from the settings object without reading text again."""
    from comfyui_h3.backend.engine_config import EngineConfig

    spec = AttentionSpec.parse("vsa:topk=32,dense=0.2")
    assert spec == AttentionSpec("vsa", VSASettings(32.0, 0.2)) and str(spec) == "vsa:topk=32,dense=0.2"
    defaults = AttentionSpec.parse("vsa")
    assert defaults == AttentionSpec("vsa", VSASettings()) and str(defaults) == "vsa"
    assert EngineConfig("h3", None, attention="vsa:topk=32,dense=0.2").attention == spec  # text given: read once
    monkeypatch.setattr(VSASettings, "parse", classmethod(lambda cls, text: pytest.fail("text read again")))
    assert get_backend(spec).name == "vsa:topk=32,dense=0.2"
    from comfyui_h3.backend.parallel.context import SINGLE
    from comfyui_h3.backend.runtime import Runtime

    assert Runtime.make("cpu", SINGLE, spec, "float32").attention.name == "vsa:topk=32,dense=0.2"
    with pytest.raises(ValueError, match="takes VSASettings settings"):
        get_backend(AttentionSpec("vsa", object()))


def test_bind_runs_dense_steps_first_then_sparse():
    geo = type("Geo", (), dict(latent_height=16, latent_width=16, latent_frames=8, audio_latents=2))()
    layout = build_layout(torch.ones(3, dtype=torch.long), geo, (1, 2, 2))
    from comfyui_h3.backend.pipelines.h3.step_plan import StepPlan

    sched = type("Sched", (), dict(num_evaluations=4))()
    step_plan = StepPlan(layout, torch.zeros(1, 3, 4), sched, lambda i: torch.arange(layout.seq_len) * (i + 1.0))
    plan = make_plan(layout, VSASettings(topk=2, dense_steps=0.5))
    tiled, per_step = plan.bind(step_plan)
    kinds = [per_step(i).sparse for i in range(4)]
    assert kinds == [False, False, True, True]
    assert torch.equal(tiled.row_timesteps(1), step_plan.row_timesteps(1)[plan.order])
    same, none = make_plan(layout, VSASettings(topk=2, dense_steps=4)).bind(step_plan)
    assert same is step_plan and none(3) is None


@pytest.fixture(scope="module")
def dense_run(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0).run(_t2va())


def _t2va():
    return H3Request(prompt="thunder over hills", num_frames=124, steps=3, seed=9, width=128, height=64,
                     decode=False)


def _vsa_run(tiny_h3_dir, spec):
    return h3_config(str(tiny_h3_dir), dtype="float32", attention=spec).build_pipeline(0).run(_t2va())


@pytest.mark.slow
def test_tiny_t2va_all_dense_steps_equals_dense_bitwise(tiny_h3_dir, dense_run):
    got = _vsa_run(tiny_h3_dir, "vsa:topk=1,dense=3")
    assert torch.equal(got.video_latents, dense_run.video_latents)
    assert torch.equal(got.audio_latents, dense_run.audio_latents)


@pytest.mark.slow
def test_tiny_t2va_in_tile_order_with_every_tile_matches_dense(tiny_h3_dir, dense_run):
    """Rows run in tile order for the whole request (the permutation through the DiT's layout) and every tile is
    selected: the same latents as dense to float32 reordering noise. A wrong permutation would be far off."""
    got = _vsa_run(tiny_h3_dir, "vsa:topk=10000,dense=1")
    assert rel_err(got.video_latents, dense_run.video_latents) < 1e-4
    assert rel_err(got.audio_latents, dense_run.audio_latents) < 1e-4
    sparse = _vsa_run(tiny_h3_dir, "vsa:topk=1,dense=0")
    assert torch.isfinite(sparse.video_latents).all()
    assert rel_err(sparse.video_latents, dense_run.video_latents) > 1e-4  # top-1 of several tiles is not dense


def test_loader_offers_vsa_settings_as_appended_optional_widgets(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes import loader

    spec = loader.H3ModelLoader.INPUT_TYPES()
    assert list(spec["required"]) == ["model", "device", "dtype", "attention", "sp_degree", "gpus", "executor",
                                      "ray_address"]  # saved workflows' widget order
    assert list(spec["optional"])[3:5] == ["vsa_topk", "vsa_dense_steps"] and "vsa" in spec["required"]["attention"][0]
    for name, default in (("vsa_topk", 0.1), ("vsa_dense_steps", 0.25)):
        kind, opts = spec["optional"][name]
        assert kind == "FLOAT" and opts["default"] == default and opts["tooltip"]
    monkeypatch.setattr(loader, "ensure_tiny_model", lambda: tiny_h3_dir)
    load = loader.H3ModelLoader().load
    assert str(load(loader.TINY_NAME, "cpu", "float32", "vsa")[0].config.attention) == "vsa"
    tuned = load(loader.TINY_NAME, "cpu", "float32", "vsa", vsa_topk=32.0, vsa_dense_steps=0.5)[0].config.attention
    assert str(tuned) == "vsa:topk=32,dense=0.5"
    assert tuned == AttentionSpec("vsa", VSASettings(32.0, 0.5))  # typed from the widgets, no text in between
    assert str(load(loader.TINY_NAME, "cpu", "float32", "sdpa", vsa_topk=32.0)[0].config.attention) == "sdpa"
    with pytest.raises(ValueError, match="dense_steps"):
        load(loader.TINY_NAME, "cpu", "float32", "vsa", vsa_dense_steps=2.5)


@pytest.mark.parametrize("flags,want", [([], "sdpa"), (["--attention", "vsa"], "vsa"),
                                        (["--attention", "vsa", "--vsa-topk", "64", "--vsa-dense-steps", "10"],
                                         "vsa:topk=64,dense=10")])
def test_cli_vsa_flags_reach_the_engine_config(monkeypatch, flags, want):
    from cli_engine_configs import engine_configs_for

    configs = engine_configs_for(monkeypatch, flags, _t2va())
    assert len(configs) == 3 and all(str(c.attention) == want for c in configs)


def test_cli_vsa_options_without_vsa_are_refused():
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_generate import attention_spec

    with pytest.raises(ValueError, match="need --attention vsa"):
        attention_spec(_parser().parse_args(["generate", "--prompt", "x", "--vsa-topk", "8"]))
    with pytest.raises(ValueError, match="Unknown attention backend"):
        attention_spec(_parser().parse_args(["generate", "--prompt", "x", "--attention", "flash9"]))


@pytest.mark.slow
def test_bench_dry_run():
    """bench/vsa.py --tiny: every part of the H200 benchmark runs (tiny config, CPU, torch fallback), so a GPU run
    does not fail on a slip in the script."""
    done = subprocess.run([sys.executable, os.path.join(REPO_DIR, "bench", "vsa.py"), "--tiny", "--seconds", "6", "5",
                           "--iters", "1", "--fp8", "--sage", "--steps", "8", "--dense-first", "0.25"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    parts = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [p["part"] for p in parts] == ["env"] + ["plan", "block", "attention", "projection"] * 2 + ["summary"]
    plan, block, attention, projection = parts[1:5]
    assert plan["edge_tiles"] > 0 and 0 < plan["topk_tiles"] < plan["video_tiles"]
    assert 0 < block["block_rel_err_vsa_vs_dense"] < 0.05 and block["vsa_block_ms"] > 0
    assert block["vsa_fp8_block_ms"] > 0  # the emulated FP8 GEMMs on the CPU
    assert block["vsa_sage_block_ms"] > 0 and 0 < attention["vsa_sage_attention_rel_vs_vsa"] < 0.06  # the CPU rule
    assert 0 < attention["attended_fraction"] < 1 and attention["all_tiles_rel_err_vs_dense"] < 1e-5
    # 2 of the 8 steps dense, 6 sparse, each forward 50 blocks
    want = 2 * 50 * block["dense_block_ms"] / 1e3 + 6 * 50 * block["vsa_block_ms"] / 1e3
    assert projection["vsa_request_s"] == pytest.approx(want) and parts[5]["rows"] < plan["rows"]


@pytest.mark.slow
@pytest.mark.skipif(triton is None, reason="triton is not installed: the kernels cannot be interpreted")
def test_bench_kernel_only_dry_run():
    """bench/vsa.py --kernel-only --tiny: the H200 kernel comparison's script path (the selection's parts, every
    variant timed with its error vs the pointer kernel) on the CPU through Triton's interpreter."""
    require_interpreter()
    import json

    sys.path.insert(0, os.path.join(REPO_DIR, "bench"))
    from vsa import KERNEL_VARIANTS

    done = subprocess.run([sys.executable, os.path.join(REPO_DIR, "bench", "vsa.py"), "--kernel-only", "--tiny",
                           "--seconds", "5", "--iters", "1", "--selection", "random", "local"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", TRITON_INTERPRET="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    parts = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    n = len(KERNEL_VARIANTS)
    # the selection's parts are timed on the random selection only
    assert [p["part"] for p in parts] == ["env", "plan", "select"] + ["kernel"] * n + ["plan"] + ["kernel"] * n
    assert parts[0]["interpreted"]
    assert [p["selection"] for p in parts if p["part"] == "plan"] == ["random", "local"]
    assert parts[1]["tma_views"] == {"rows": "rows", "4d": "4d"} and parts[1]["edge_tiles"] > 0
    select = parts[2]
    assert select["topk_same_tiles"] is True and select["select_tiles_ms"] > 0 and select["topk_triton_ms"] > 0
    kernels = [p for p in parts if p["part"] == "kernel"]
    assert [p["kernel"] for p in kernels[:n]] == list(KERNEL_VARIANTS)
    for line in kernels:
        assert line["kernel_ms"] > 0 and line["rel_vs_pointer"] < 1e-3, line  # nan (rows left unwritten) fails


def test_local_selection_is_each_tiles_nearest_window():
    sys.path.insert(0, os.path.join(REPO_DIR, "bench"))
    from vsa import local_selection

    sel = local_selection(10, 4, 1, 2, "cpu")
    assert sel.shape == (1, 2, 10, 4) and torch.equal(sel[0, 0], sel[0, 1])
    assert sel[0, 0, 0].tolist() == [0, 1, 2, 3] and sel[0, 0, 5].tolist() == [3, 4, 5, 6]
    assert sel[0, 0, 9].tolist() == [6, 7, 8, 9]  # shifted inside the grid, still 4 distinct tiles, ascending


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fl2va", "edit", "extend"])
def test_tiny_other_layouts_in_tile_order_match_dense(tiny_h3_dir, name):
    """Keyframe condition rows, per-row edit timesteps and extension guide rows: all ride in the prefix / tiles and
    come back to their places (every tile selected: dense to float32 reordering noise)."""
    from h3_requests import REQUESTS

    want = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0).run(REQUESTS[name]())
    got = h3_config(str(tiny_h3_dir), dtype="float32", attention="vsa:topk=10000,dense=0").build_pipeline(0).run(
        REQUESTS[name]())
    assert rel_err(got.video_latents, want.video_latents) < 1e-4
    assert rel_err(got.audio_latents, want.audio_latents) < 1e-4


@pytest.mark.slow
def test_two_gloo_ranks_vsa_equals_one_rank(tiny_h3_dir):
    """Ulysses splits the heads; the rule works per head on the whole sequence, so 2 ranks give one rank's result."""
    from comfyui_h3.backend.engine import Engine

    spec = "vsa:topk=1,dense=1"
    want = h3_config(str(tiny_h3_dir), dtype="float32", attention=spec).build_pipeline(0).run(_t2va())
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1, attention=spec))
    try:
        got = eng.generate(_t2va())
    finally:
        eng.shutdown()
    assert rel_err(got.video_latents, want.video_latents) < 1e-5
    assert rel_err(got.audio_latents, want.audio_latents) < 1e-5


def test_seedvr2_refuses_vsa_and_does_not_list_it():
    """SeedVR2 has no packed H3 layout for a plan: a vsa engine would silently run dense, so it is refused."""
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
    from comfyui_h3.nodes.seedvr2_loader import H3SeedVR2Loader

    with pytest.raises(ValueError, match="SeedVR2 takes a dense attention backend"):
        seedvr2_config("dit.safetensors", "vae.safetensors", "text.safetensors", attention="vsa").validate()
    choices = H3SeedVR2Loader.INPUT_TYPES()["required"]["attention"][0]
    assert "sdpa" in choices and not any(name.startswith("vsa") for name in choices)


def test_compiled_blocks_with_vsa_equal_eager(tiny_h3_dir):
    """The engine compiles each block on CUDA; the sparse attention runs eagerly inside them (a graph break), so the
    compiled forward on rows in tile order computes what the eager one does, for a sparse and a dense step."""
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
    from comfyui_h3.backend.pipelines.h3.components import compile_blocks
    from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry

    spec = "vsa:topk=2,dense=0"
    eager = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, attention=spec)
    compiled = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, attention=spec)
    compile_blocks(compiled)
    layout = build_layout(torch.tensor([1, 1, 0, 1]), resolve_geometry(124, 64, 128), (1, 2, 2), ("first",))
    plan = make_plan(layout, VSASettings(topk=2))
    assert plan.num_tiles > 2
    assert_compiled_equals_eager(eager, compiled, layout, plan)


def test_fallback_chunks_keep_the_rule():
    """The fallback's (heads, rows) chunking for bounded memory gives the unchunked result."""
    from comfyui_h3.backend.attention.vsa_kernel import torch_video_attention

    torch.manual_seed(3)
    plan, s = flat_plan(70, (5, 6, 7), topk=3)
    q, k, v = (torch.randn(2, s, 3, 32) for _ in range(3))
    _, _, tile_of = plan.tables("cpu")
    sel = select_tiles(q, k, 70, plan.tile_sizes, plan.topk)
    whole = torch_video_attention(q, k, v, 70, tile_of, sel)
    chunked = torch_video_attention(q, k, v, 70, tile_of, sel, mask_budget=5000)  # one head, a few rows a chunk
    assert torch.allclose(chunked, whole, atol=1e-6, rtol=0)


def test_tiny_t2va_vsa_with_the_adaln_cache(tiny_h3_dir, dense_run):
    """The AdaLN table cache plans its steps from the bound (tile-ordered) StepPlan: same result as without it."""
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy as WeightPolicy

    cached = h3_config(str(tiny_h3_dir), dtype="float32", attention="vsa:topk=10000,dense=1",
                       weights=WeightPolicy(adaln="cache")).build_pipeline(0).run(_t2va())
    plain = _vsa_run(tiny_h3_dir, "vsa:topk=10000,dense=1")
    assert torch.equal(cached.video_latents, plain.video_latents)
    assert rel_err(cached.video_latents, dense_run.video_latents) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("model", [["tiny"], ["full", "--tiny"]], ids=["tiny-folder", "random-in-memory"])
def test_bench_quality_dry_run(model):
    """bench/vsa.py --quality tiny|full: the quality table (final latents vs dense per setting) runs end to end (full
    with --tiny: bench/e2e.py's in-memory random builders on tiny configs, the H200 run's code path)."""
    import json

    done = subprocess.run([sys.executable, os.path.join(REPO_DIR, "bench", "vsa.py"), "--quality", *model, "--steps", "2",
                           "--seconds", "5", "--settings", "1:0", "1000:0"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["setting"] for r in rows] == ["dense", "1:0", "1000:0"]
    one_tile, every_tile = rows[1]["video_rel_err"], rows[2]["video_rel_err"]  # one tile of several vs every tile
    assert every_tile < 1e-5 and one_tile > 10 * max(every_tile, 1e-6)
