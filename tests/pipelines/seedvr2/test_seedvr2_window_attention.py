"""SeedVR2 joint window attention vs the official code (fixture made by
tools/make_seedvr2_window_attention_goldens.py) and vs a slow per-window reference."""

import json

import pytest
import torch
from safetensors import safe_open

from repo_paths import FIXTURES
from comfyui_h3.backend.attention.registry import get_backend
from comfyui_h3.backend.models.seedvr2 import windows as W
from comfyui_h3.backend.models.seedvr2.window_attention import window_attention

FIXTURE_PATH = FIXTURES / "seedvr2_window_attention.safetensors"
with safe_open(str(FIXTURE_PATH), framework="pt") as _f:
    META = _f.metadata()
    TENSORS = {k: _f.get_tensor(k) for k in _f.keys()}
CASES = json.loads(META["cases"])
LAYOUTS = [(i, c, m) for i, c in enumerate(CASES) for m in c["layouts"]]
NAMES = ("q_vid", "k_vid", "v_vid", "q_txt", "k_txt", "v_txt")


def _ids(items):
    return [f"{'x'.join(map(str, c['grid']))}-{m.split('_')[0]}" for _, c, m in items]


def _flat(wins):
    return [[t0, t1, h0, h1, w0, w1] for (t0, t1), (h0, h1), (w0, w1) in wins]


def _reference(q, k, v, tq, tk, tv, layout):
    """One explicit softmax per window over [window video ; text], float64; text averaged over windows."""
    ids = torch.arange(q.shape[0]).view(layout.grid)
    vid = torch.zeros(q.shape, dtype=torch.float64)
    txt = torch.zeros(tq.shape, dtype=torch.float64)
    for (t0, t1), (h0, h1), (w0, w1) in layout.windows:
        rows = ids[t0:t1, h0:h1, w0:w1].reshape(-1)
        qj, kj, vj = (torch.cat([a[rows], b]).double().transpose(0, 1) for a, b in ((q, tq), (k, tk), (v, tv)))
        scores = qj @ kj.transpose(-1, -2) / q.shape[-1] ** 0.5
        probs = torch.exp(scores - scores.amax(-1, keepdim=True))
        probs = probs / probs.sum(-1, keepdim=True)
        out = (probs @ vj).transpose(0, 1)
        vid[rows] = out[: rows.numel()]
        txt += out[rows.numel():]
    return vid.float(), (txt / len(layout.windows)).float()


def test_fixture_records_official_commit():
    assert META["source"] == "github.com/ByteDance-Seed/SeedVR" and len(META["commit"]) == 40
    assert {tuple(c["grid"]) for c in CASES} >= {(3, 5, 7), (2, 6, 9)}
    assert any(m == W.SHIFTED for _, _, m in LAYOUTS) and any(m == W.REGULAR for _, _, m in LAYOUTS)


@pytest.mark.parametrize("i,case,method", LAYOUTS, ids=_ids(LAYOUTS))
def test_equals_official_outputs(i, case, method):
    layout = W.window_layout(method, case["grid"], case["counts"])
    assert _flat(layout.windows) == case["layouts"][method]  # the golden was made on the same windows
    inputs = [TENSORS[f"{i}.{n}"] for n in NAMES]
    vid, txt = window_attention(*inputs, layout)
    torch.testing.assert_close(vid, TENSORS[f"{i}.{method}.out_vid"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(txt, TENSORS[f"{i}.{method}.out_txt"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "grid,counts,method",
    [((3, 5, 7), (2, 20, 25), W.SHIFTED), ((4, 4, 6), (2, 30, 40), W.SHIFTED), ((2, 6, 9), (1, 20, 25), W.REGULAR),
     ((3, 20, 36), W.WINDOW_COUNTS, W.SHIFTED)],
)
@pytest.mark.parametrize("n_txt", [3, 0])
def test_equals_slow_reference_and_batches_by_shape(grid, counts, method, n_txt):
    layout = W.window_layout(method, grid, counts)
    gen = torch.Generator().manual_seed(7)
    n = grid[0] * grid[1] * grid[2]
    q, k, v = (torch.randn(n, 3, 4, generator=gen) for _ in range(3))
    tq, tk, tv = (torch.randn(n_txt, 3, 4, generator=gen) for _ in range(3))
    sdpa = get_backend("sdpa")
    batches = []

    def counting(q_, k_, v_, plan=None):
        batches.append(q_.shape[0])
        assert plan == "the-plan"
        return sdpa(q_, k_, v_, plan)

    vid, txt = window_attention(q, k, v, tq, tk, tv, layout, attention=counting, plan="the-plan")
    ref_vid, ref_txt = _reference(q, k, v, tq, tk, tv, layout)
    torch.testing.assert_close(vid, ref_vid, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(txt, ref_txt, rtol=1e-5, atol=1e-5)
    assert txt.shape == (n_txt, 3, 4)
    # one kernel call per shape group, together covering every window once
    assert len(batches) == len(layout.groups) < len(layout.windows)
    assert sum(batches) == len(layout.windows)


def test_bad_shapes_are_one_clear_error():
    layout = W.window_layout(W.REGULAR, (2, 6, 9), (1, 20, 25))
    q = torch.randn(108, 2, 8)
    t = torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match=r"video q has shape \(107, 2, 8\)"):
        window_attention(q[:107], q[:107], q[:107], t, t, t, layout)
    with pytest.raises(ValueError, match="k_txt has shape"):
        window_attention(q, q, q, t, t[:, :1], t, layout)
