"""SeedVR2 window geometry vs the official code (fixture made by tools/make_seedvr2_window_goldens.py)."""

import hashlib
import json

import pytest
import torch

from repo_paths import FIXTURES
from comfyui_h3.backend.models.seedvr2 import windows as W

FIXTURE = json.loads((FIXTURES / "seedvr2_windows.json").read_text())
CASES = FIXTURE["cases"]
LAYOUTS = [(tuple(c["grid"]), key, entry) for c in CASES for key, entry in c["layouts"].items()]


def _ids(layouts):
    return [f"{'x'.join(map(str, g))}-{k.split('|')[0]}" for g, k, _ in layouts]


def _flat(wins):
    return [[t0, t1, h0, h1, w0, w1] for (t0, t1), (h0, h1), (w0, w1) in wins]


@pytest.mark.parametrize("name", ["3b", "7b"])
def test_model_window_settings_match_official_configs(name):
    official = FIXTURE["models"][name]
    assert W.layer_window_methods(official["num_layers"]) == official["window_method"]
    assert all(tuple(w) == W.WINDOW_COUNTS for w in official["window"])


@pytest.mark.parametrize("grid,key,entry", LAYOUTS, ids=_ids(LAYOUTS))
def test_windows_and_permutation_equal_official(grid, key, entry):
    method, counts = key.split("|")
    counts = tuple(int(c) for c in counts.split(","))
    layout = W.window_layout(method, grid, counts)
    assert _flat(layout.windows) == entry["windows"]
    perm = layout.perm
    assert perm.dtype == torch.int64 and perm.numel() == entry["perm_len"]
    assert perm[:16].tolist() == entry["perm_head"]
    assert hashlib.sha256(perm.numpy().astype("<i8").tobytes()).hexdigest() == entry["perm_sha256"]


@pytest.mark.parametrize("grid,key,entry", LAYOUTS, ids=_ids(LAYOUTS))
def test_permutation_is_a_permutation_and_inverse_inverts(grid, key, entry):
    layout = W.window_layout(key.split("|")[0], grid)
    n = grid[0] * grid[1] * grid[2]
    assert torch.equal(torch.sort(layout.perm).values, torch.arange(n))
    x = torch.randn(n, 3)
    assert torch.equal(x[layout.perm][layout.inverse], x)
    assert torch.equal(layout.perm[layout.inverse], torch.arange(n))
    assert sum(layout.lengths) == n


@pytest.mark.parametrize("grid,key,entry", LAYOUTS, ids=_ids(LAYOUTS))
def test_shape_groups_cover_every_window_once(grid, key, entry):
    layout = W.window_layout(key.split("|")[0], grid)
    seen = sorted(i for g in layout.groups for i in g.windows)
    assert seen == list(range(len(layout.windows)))
    assert len({g.shape for g in layout.groups}) == len(layout.groups)
    rows = torch.cat([g.rows.reshape(-1) for g in layout.groups])
    assert torch.equal(torch.sort(rows).values, torch.arange(rows.numel()))
    ids = torch.arange(grid[0] * grid[1] * grid[2]).view(grid)
    for g in layout.groups:
        assert g.rows.shape == (len(g.windows), g.shape[0] * g.shape[1] * g.shape[2])
        for r, i in zip(g.rows, g.windows):
            (t0, t1), (h0, h1), (w0, w1) = layout.windows[i]
            assert W.window_shape(layout.windows[i]) == g.shape
            # the group's rows pick exactly that window's tokens, in row-major order of its sub-block
            assert torch.equal(layout.perm[r], ids[t0:t1, h0:h1, w0:w1].reshape(-1))


def test_worked_example_counts():
    grid = (5, 45, 80)
    reg, sh = W.regular_windows(grid), W.shifted_windows(grid)
    assert W.window_size(grid) == (2, 15, 27)
    assert (len(reg), len(sh)) == (27, 48)
    assert reg[:2] == [((0, 2), (0, 15), (0, 27)), ((2, 4), (0, 15), (0, 27))]
    assert sh[:3] == [((0, 1), (0, 7), (0, 13)), ((1, 3), (0, 7), (0, 13)), ((3, 5), (0, 7), (0, 13))]
    assert len(W.group_by_shape(reg)) == 4 and len(W.group_by_shape(sh)) == 12


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="at least 1"):
        W.regular_windows((0, 45, 80))
    with pytest.raises(ValueError, match="too elongated"):
        W.shifted_windows((1, 1, 100000))
    with pytest.raises(ValueError, match="unknown SeedVR2 window method"):
        W.windows_for("720pwin", (1, 4, 4))
    with pytest.raises(ValueError, match="cover"):
        W.window_permutation((1, 4, 4), [((0, 1), (0, 4), (0, 2))])
