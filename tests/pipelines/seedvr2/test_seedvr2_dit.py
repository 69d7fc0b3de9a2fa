"""SeedVR2 DiTs (3B and 7B) vs the official NaDiT (fixtures made by tools/make_seedvr2_dit_goldens.py): fp32
outputs on tiny configs, the released key sets and parameter counts, one attention call per window-shape group, and
the routing protocol with a non-canonical row order."""

import dataclasses
import json
import math

import pytest
import torch
from safetensors import safe_open

from repo_paths import FIXTURES, REPO
from comfyui_h3.backend.attention.registry import get_backend
from comfyui_h3.backend.models.seedvr2 import rope as R
from comfyui_h3.backend.models.seedvr2 import windows as W
from comfyui_h3.backend.models.seedvr2.dit import SeedVR2DiT
from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig
from comfyui_h3.backend.models.seedvr2.routing import LayerRows, LocalRouting, WindowRouting, canonical_rows
from comfyui_h3.backend.models.seedvr2.window_attention import window_attention, window_attention_rows

import sys  # noqa: E402
sys.path.insert(0, str(REPO / "tools"))  # the golden scripts' deterministic weights
from seedvr2_det import det_dit_weights, det_uniform  # noqa: E402

VARIANTS = ("3b", "7b")
RELEASED = json.loads((FIXTURES / "seedvr2_dit_keys.json").read_text())


def _load(variant):
    with safe_open(str(FIXTURES / f"seedvr2_dit_{variant}.safetensors"), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


GOLDEN = {v: _load(v) for v in VARIANTS}
CASES = [(v, i, c) for v in VARIANTS for i, c in enumerate(json.loads(GOLDEN[v][0]["cases"]))]


def _config(variant):
    return DiTConfig.from_dict(json.loads(GOLDEN[variant][0]["config"]))


_MODELS = {}


def _model(variant):
    """The tiny model with the fixture's weights, loaded strictly (the official RoPE buffers included)."""
    if variant not in _MODELS:
        meta, tensors = GOLDEN[variant]
        model = SeedVR2DiT(_config(variant)).eval()
        weights = det_dit_weights({k: list(p.shape) for k, p in model.named_parameters()})
        sums = json.loads(meta["weight_sums"])
        assert sorted(sums) == sorted(weights)
        for k, s in sums.items():
            assert float(weights[k].double().sum()) == pytest.approx(s, rel=1e-12, abs=1e-9), k
        state = dict(weights)
        state.update({k: tensors["rope_freqs"] for k in model.state_dict() if k.endswith(".rope.rope.freqs")})
        model.load_state_dict(state, strict=True)
        _MODELS[variant] = model
    return _MODELS[variant]


def _inputs(variant, i, case):
    t, h, w = case["grid"]
    cfg = _config(variant)
    vid = det_uniform((t, 2 * h, 2 * w, cfg.vid_in_channels), salt=10 * i + 1)
    txt = det_uniform((case["txt_len"], cfg.txt_dim), salt=10 * i + 2)
    assert float(vid.double().sum()) == pytest.approx(case["vid_sum"], rel=1e-12, abs=1e-9)
    assert float(txt.double().sum()) == pytest.approx(case["txt_sum"], rel=1e-12, abs=1e-9)
    return vid, txt


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _ids(items):
    return [f"{v}-{'x'.join(map(str, c['grid']))}-{'.'.join(map(str, c['counts']))}" for v, _, c in items]


# ---- goldens ---------------------------------------------------------------------------------------------------------


def test_fixtures_record_official_commit():
    commits = {RELEASED["commit"]} | {GOLDEN[v][0]["commit"] for v in VARIANTS}
    assert len(commits) == 1 and len(commits.pop()) == 40
    assert RELEASED["3b"]["module"] == "models.dit_v2.nadit.NaDiT"
    assert RELEASED["7b"]["module"] == "models.dit.nadit.NaDiT"
    grids = {tuple(c["grid"]) for _, _, c in CASES}
    assert grids >= {(1, 20, 36), (3, 20, 36), (10, 6, 8), (3, 31, 17)}


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_preset_is_the_golden_config(variant):
    assert _config(variant) == DiTConfig.tiny(variant, txt_dim=int(GOLDEN[variant][0]["txt_dim"]))


@pytest.mark.parametrize("variant,i,case", CASES, ids=_ids(CASES))
def test_equals_official_fp32(variant, i, case):
    model = _model(variant)
    vid, txt = _inputs(variant, i, case)
    routing = LocalRouting(case["grid"], model.config.layers, case["counts"])
    with torch.no_grad():
        out = model(vid, txt, case["timestep"], routing=routing)
    ref = GOLDEN[variant][1][f"{i}.out"]
    assert out.shape == ref.shape == (*vid.shape[:3], 16)
    assert _rel(out, ref) <= 1e-5
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


ROPE_FP16 = FIXTURES / "seedvr2_dit_rope_fp16.safetensors"  # tools/make_seedvr2_dit_rope_fp16_goldens.py


def _rope_keys(model):
    return [k for k in model.state_dict() if k.endswith(".rope.rope.freqs")]


def _tiny_file(tmp_path, variant, freqs):
    """The golden tiny DiT saved as a checkpoint whose every RoPE buffer is `freqs` (dtype as given)."""
    from safetensors.torch import save_file

    model = _model(variant)
    state = {k: (freqs.clone() if k in _rope_keys(model) else v).contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / f"seedvr2_tiny_{variant}.safetensors"
    save_file(state, str(path))
    return path


def _run_case(model, variant, i):
    case = json.loads(GOLDEN[variant][0]["cases"])[i]
    vid, txt = _inputs(variant, i, case)
    with torch.no_grad():
        return model(vid, txt, case["timestep"], routing=LocalRouting(case["grid"], model.config.layers,
                                                                          case["counts"]))


@pytest.mark.parametrize("variant", VARIANTS)
def test_rope_formula_is_the_official_buffer_of_an_fp32_file(variant):
    cfg = _model(variant).config
    official = GOLDEN[variant][1]["rope_freqs"]
    ours = R.mmrope3d_frequencies(cfg.rope_dim) if cfg.rope == "mmrope3d" else R.pixel_frequencies(cfg.head_dim)
    torch.testing.assert_close(ours, official, rtol=0, atol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp16_rope_buffers_give_the_official_result(variant, tmp_path):
    # The official code rotates with the buffers the checkpoint stores (fp16-rounded in the released fp16 files).
    from comfyui_h3.backend.models.seedvr2.checkpoints import load_dit

    with safe_open(str(ROPE_FP16), framework="pt") as f:
        meta, gold = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    stored = gold[f"{variant}.freqs"]
    assert stored.dtype == torch.float16
    weights = json.loads(meta["weight_sums"])[variant]
    assert weights == json.loads(GOLDEN[variant][0]["weight_sums"])  # the same tiny model as the DiT goldens
    model = load_dit(_tiny_file(tmp_path, variant, stored), "cpu", torch.float32)
    for blk in model.blocks:
        assert blk.attn.rope.rope.values == tuple(stored.float().tolist())
        assert blk.attn.rope.rope.dtype == "float16"  # the angles are computed in it, as the official code does
        assert blk.attn.rope.rope.freqs.dtype == torch.float32
    case = json.loads(meta["case"])
    vid, txt = _inputs(variant, case["salt"], case)
    routing = LocalRouting(case["grid"], model.config.layers, case["counts"])
    with torch.no_grad():
        out = model(vid, txt, case["timestep"], routing=routing)
        formula = _model(variant)(vid, txt, case["timestep"], routing=routing)  # the formula's frequencies
    ref = gold[f"{variant}.out"]
    assert _rel(out, ref) <= 1e-5
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    # ...and the fp16 rounding shows in the official output: the formula's frequencies do not give it.
    assert _rel(formula, ref) > 20 * max(_rel(out, ref), 1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_rope_buffers_fall_back_to_the_formula(variant, fp8, tmp_path):
    from comfyui_h3.backend.models.seedvr2.checkpoints import load_dit

    official = GOLDEN[variant][1]["rope_freqs"]
    model = load_dit(_tiny_file(tmp_path, variant, official.to(fp8)), "cpu", torch.float32)
    for blk in model.blocks:
        assert blk.attn.rope.rope.values == tuple(official.tolist())
    out = _run_case(model, variant, 2)
    torch.testing.assert_close(out, GOLDEN[variant][1]["2.out"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rope_buffers_that_are_not_seedvr2_are_refused_naming_file_and_key(variant, dtype, tmp_path):
    from comfyui_h3.backend.models.checkpoint import CheckpointError
    from comfyui_h3.backend.models.seedvr2.checkpoints import load_dit

    official = GOLDEN[variant][1]["rope_freqs"]
    # Within the dtype's rounding loads; a few ulps of the dtype off (or NaN) is another file.
    load_dit(_tiny_file(tmp_path, variant, official.to(dtype)), "cpu", torch.float32)
    ulp = torch.finfo(dtype).eps
    for bad in (official * (1 + 4 * ulp), official.clone().index_fill_(0, torch.tensor([1]), float("nan"))):
        path = _tiny_file(tmp_path, variant, bad.to(dtype))
        with pytest.raises(CheckpointError) as e:
            load_dit(path, "cpu", torch.float32)
        assert str(path) in str(e.value) and "blocks.0.attn.rope.rope.freqs" in str(e.value)


def test_rope_values_survive_a_cast_of_the_model(tmp_path):
    # Casting the model (bf16 compute) must not round the frequencies it rotates with.
    from comfyui_h3.backend.models.seedvr2.checkpoints import load_dit

    with safe_open(str(ROPE_FP16), framework="pt") as f:
        freqs = f.get_tensor("3b.freqs")
    model = load_dit(_tiny_file(tmp_path, "3b", freqs), "cpu", torch.bfloat16).to(torch.bfloat16)
    assert model.blocks[0].attn.rope.rope.values == tuple(freqs.float().tolist())
    assert model.blocks[0].attn.rope.rope.dtype == "float16"


# ---- released checkpoints: keys, shapes, sizes -------------------------------------------------------------------


@pytest.mark.parametrize("variant,approx", [("3b", 3.391e9), ("7b", 8.240e9)])
def test_released_config_has_the_official_keys_and_size(variant, approx):
    with torch.device("meta"):
        model = SeedVR2DiT(DiTConfig.released(variant))
    ours = [[k, list(t.shape)] for k, t in model.state_dict().items()]
    assert ours == RELEASED[variant]["keys"]  # same names, shapes and order
    params = sum(p.numel() for p in model.parameters())
    assert params == RELEASED[variant]["params"]
    assert params == pytest.approx(approx, rel=2e-4)
    assert len(ours) == {"3b": 635, "7b": 1128}[variant]


def test_released_3b_layout_quirks_in_keys():
    keys = {k for k, _ in RELEASED["3b"]["keys"]}
    assert "blocks.9.mlp.txt.proj_in.weight" in keys and "blocks.10.mlp.all.proj_in.weight" in keys
    assert "vid_out_ada.out_scale" in keys and "vid_out_ada.out_gate" not in keys
    keys7 = {k for k, _ in RELEASED["7b"]["keys"]}
    assert "blocks.35.mlp.txt.proj_in.bias" in keys7 and "vid_out_norm.weight" not in keys7


def test_strict_load_rejects_a_foreign_state_dict():
    model = SeedVR2DiT(DiTConfig.tiny("3b", txt_dim=8))
    other = SeedVR2DiT(DiTConfig.tiny("7b", txt_dim=8)).state_dict()
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(other, strict=True)


# ---- structure of the computation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_attention_call_per_shape_group(variant):
    model = _model(variant)
    i, case = 4, json.loads(GOLDEN[variant][0]["cases"])[4]
    vid, txt = _inputs(variant, i, case)
    routing = LocalRouting(case["grid"], model.config.layers, case["counts"])
    sdpa = get_backend("sdpa")
    calls = []

    def counting(q, k, v, plan=None):
        assert plan == "plan-x"
        calls.append(q.shape[0])
        return sdpa(q, k, v, plan)

    with torch.no_grad():
        out = model(vid, txt, case["timestep"], routing=routing, attention=counting, plan="plan-x")
    layers = [routing.rows(i) for i in range(model.config.layers)]
    assert len(calls) == sum(len(r.groups) for r in layers) < sum(r.total_windows for r in layers)
    assert sum(calls) == sum(r.total_windows for r in layers)
    assert _rel(out, GOLDEN[variant][1][f"{i}.out"]) <= 1e-5


@pytest.mark.parametrize("variant", VARIANTS)
def test_row_chunking_changes_nothing(variant):
    model = _model(variant)
    i, case = 3, json.loads(GOLDEN[variant][0]["cases"])[3]
    vid, txt = _inputs(variant, i, case)
    default = model.chunk_rows
    with torch.no_grad():
        whole = model(vid, txt, case["timestep"])
        model.chunk_rows = 97
        try:
            chunked = model(vid, txt, case["timestep"])
        finally:
            model.chunk_rows = default
    assert default >= vid.shape[0] * vid.shape[1] * vid.shape[2] // 4  # the default ran it in one chunk
    assert _rel(chunked, whole) <= 1e-6


class _ShuffledRouting:
    """Test double of a sharded routing on one rank: every layer holds its rows in a different random order (as a
    window-sharded rank does), with groups indexing into that order; advance permutes between orders."""

    def __init__(self, grid, num_layers, counts, seed=0):
        self.local = LocalRouting(grid, num_layers, counts)
        gen = torch.Generator().manual_seed(seed)
        n = self.local.num_tokens
        self.orders = [torch.randperm(n, generator=gen) for _ in range(num_layers)]  # row_ids per layer
        self.text_reductions = 0

    def start(self, tokens):
        self.local.start(tokens)
        return tokens[self.orders[0]]

    def rows(self, layer):
        canon = self.local.rows(layer)
        ids = self.orders[layer]
        position = torch.empty_like(ids)
        position[ids] = torch.arange(ids.numel())
        groups = tuple((shape, position[idx]) for shape, idx in canon.groups)
        return LayerRows(layout=canon.layout, row_ids=ids, groups=groups, total_windows=canon.total_windows)

    def advance(self, x, layer):
        cur, nxt = self.orders[layer], self.orders[layer + 1]
        canon = torch.empty_like(x)
        canon[cur] = x
        return canon[nxt]

    def reduce_text(self, txt_sum):
        self.text_reductions += 1
        return txt_sum

    def finish(self, x):
        canon = torch.empty_like(x)
        canon[self.orders[-1]] = x
        return canon


@pytest.mark.parametrize("variant", VARIANTS)
def test_any_local_row_order_gives_the_same_result(variant):
    model = _model(variant)
    i, case = 4, json.loads(GOLDEN[variant][0]["cases"])[4]
    vid, txt = _inputs(variant, i, case)
    routing = _ShuffledRouting(case["grid"], model.config.layers, case["counts"])
    assert isinstance(routing, WindowRouting) and isinstance(LocalRouting((1, 2, 2), 2), WindowRouting)
    with torch.no_grad():
        out = model(vid, txt, case["timestep"], routing=routing)
    assert _rel(out, GOLDEN[variant][1][f"{i}.out"]) <= 1e-5
    assert routing.text_reductions == model.config.layers - 1  # the last layer's text is never used


def test_routing_that_returns_none_off_the_driver():
    model = _model("7b")
    i, case = 2, json.loads(GOLDEN["7b"][0]["cases"])[2]
    vid, txt = _inputs("7b", i, case)

    class OffDriver(LocalRouting):
        def finish(self, x):
            return None

    with torch.no_grad():
        assert model(vid, txt, 1000.0, routing=OffDriver(case["grid"], 4, case["counts"])) is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_bfloat16_activations_track_fp32(variant):
    model = _model(variant)
    i, case = 2, json.loads(GOLDEN[variant][0]["cases"])[2]
    vid, txt = _inputs(variant, i, case)
    routing = LocalRouting(case["grid"], model.config.layers, case["counts"])
    low = SeedVR2DiT(model.config).to(torch.bfloat16)
    low.load_state_dict(model.state_dict())
    with torch.no_grad():
        out = low(vid.bfloat16(), txt.bfloat16(), case["timestep"], routing=routing)
    assert out.dtype == torch.bfloat16
    assert _rel(out.float(), GOLDEN[variant][1][f"{i}.out"]) < 0.05


def test_bad_inputs_are_one_clear_error():
    model = SeedVR2DiT(DiTConfig.tiny("7b", txt_dim=8))
    txt = torch.zeros(3, 8)
    with pytest.raises(ValueError, match=r"input has shape \(2, 5, 8, 33\); expected \[T, H, W, 33\]"):
        model(torch.zeros(2, 5, 8, 33), txt, 1000.0)
    with pytest.raises(ValueError, match=r"input has shape \(2, 4, 8, 16\)"):
        model(torch.zeros(2, 4, 8, 16), txt, 1000.0)
    with pytest.raises(ValueError, match=r"text has shape \(3, 9\); expected \[L_txt, 8\]"):
        model(torch.zeros(1, 4, 4, 33), torch.zeros(3, 9), 1000.0)
    with pytest.raises(ValueError, match="unknown"):
        DiTConfig.released("13b")
    with pytest.raises(ValueError, match="mm_layers 3 must equal layers 4"):
        dataclasses.replace(DiTConfig.tiny("7b"), mm_layers=3)


# ---- window_attention_rows -------------------------------------------------------------------------------------------


def test_rows_entry_point_rotates_per_group_and_returns_the_text_sum():
    grid, counts = (5, 9, 11), (2, 12, 15)
    layout = W.window_layout(W.SHIFTED, grid, counts)
    gen = torch.Generator().manual_seed(3)
    n, heads, dim, n_txt = math.prod(grid), 2, 32, 4
    q, k, v = (torch.randn(n, heads, dim, generator=gen) for _ in range(3))
    tq, tk, tv = (torch.randn(n_txt, heads, dim, generator=gen) for _ in range(3))

    def table(shape):
        return R.mmrope3d_video_table(shape, n_txt, 32)

    # Reference: rotate each window's q/k with rope.apply_rope in canonical order, then the plain entry point.
    qr, kr = q.clone(), k.clone()
    for shape, idx in canonical_rows(layout).groups:
        flat = idx.reshape(-1)
        qr[flat] = R.apply_rope(q[flat].view(*idx.shape, heads, dim), table(shape)).reshape(-1, heads, dim)
        kr[flat] = R.apply_rope(k[flat].view(*idx.shape, heads, dim), table(shape)).reshape(-1, heads, dim)
    ref_vid, ref_txt = window_attention(qr, kr, v, tq, tk, tv, layout)

    q0, k0 = q.clone(), k.clone()
    vid, txt_sum = window_attention_rows(q, k, v, tq, tk, tv, canonical_rows(layout), rope=table)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # rotation happens on the gathered copies
    assert txt_sum.dtype == torch.float32
    torch.testing.assert_close(vid, ref_vid, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(txt_sum / len(layout.windows), ref_txt, rtol=1e-6, atol=1e-6)


def test_rows_entry_point_with_no_local_rows():
    layout = W.window_layout(W.REGULAR, (2, 6, 9), (1, 20, 25))
    empty = LayerRows(layout=layout, row_ids=torch.empty(0, dtype=torch.int64), groups=(), total_windows=3)
    z = torch.zeros(0, 2, 8)
    t = torch.randn(4, 2, 8)

    def never(*a, **k):
        raise AssertionError("no window, no attention call")

    vid, txt_sum = window_attention_rows(z, z, z, t, t, t, empty, attention=never)
    assert vid.shape == (0, 2, 8) and torch.equal(txt_sum, torch.zeros(4, 2, 8))
