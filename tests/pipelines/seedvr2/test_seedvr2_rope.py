"""SeedVR2 window RoPE vs the official modules (fixture made by tools/make_seedvr2_rope_goldens.py)."""

import json

import pytest
import torch
from safetensors import safe_open

from repo_paths import FIXTURES
from comfyui_h3.backend.models.seedvr2 import rope as R

FIXTURE_PATH = FIXTURES / "seedvr2_rope.safetensors"
with safe_open(str(FIXTURE_PATH), framework="pt") as _f:
    META = _f.metadata()
    T = {k: _f.get_tensor(k) for k in _f.keys()}
SHAPES = {"3b": json.loads(META["shapes_3b"]), "7b": json.loads(META["shapes_7b"])}
TXT_LEN = int(META["txt_len"])
ROT = {"3b": 126, "7b": 60}


def _table(model, shape, device="cpu"):
    if model == "3b":
        return R.mmrope3d_video_table(shape, TXT_LEN, 128, device)
    return R.pixel_video_table(shape, 128, device)


def _windows(model):
    start = 0
    for shape in SHAPES[model]:
        n = shape[0] * shape[1] * shape[2]
        yield tuple(shape), slice(start, start + n)
        start += n


@pytest.mark.parametrize("model", ["3b", "7b"])
def test_video_matches_official_per_window_shape(model):
    for shape, sl in _windows(model):
        table = _table(model, shape)
        assert table[0].shape == (sl.stop - sl.start, ROT[model])
        for name in ("q_vid", "k_vid"):
            ours = R.apply_rope(T[f"{model}.{name}"][sl], table)
            torch.testing.assert_close(ours, T[f"{model}.out_{name}"][sl], rtol=0, atol=1e-5, msg=f"{shape} {name}")


def test_3b_text_matches_official():
    table = R.mmrope3d_text_table(TXT_LEN, 128)
    for name in ("q_txt", "k_txt"):
        torch.testing.assert_close(R.apply_rope(T[f"3b.{name}"], table), T[f"3b.out_{name}"], rtol=0, atol=1e-5)


def test_frequencies_match_official_buffers():
    assert torch.equal(R.mmrope3d_frequencies(128), T["3b.freqs"])
    assert torch.equal(R.pixel_frequencies(128), T["7b.freqs"])
    assert R.mmrope3d_frequencies(128).numel() == 21 and R.pixel_frequencies(128).numel() == 10


@pytest.mark.parametrize("model", ["3b", "7b"])
def test_shape_group_batch_norms_and_untouched_channels(model):
    # A [G, n, heads, head_dim] shape group rotated with one table equals rotating each window alone.
    shape, _ = next(_windows(model))
    table = _table(model, shape)
    n = table[0].shape[0]
    x = torch.randn(3, n, 4, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    y = R.apply_rope(x, table)
    for g in range(3):
        torch.testing.assert_close(y[g], R.apply_rope(x[g], table), rtol=0, atol=0)
    rot = ROT[model]
    assert torch.equal(y[..., rot:], x[..., rot:])  # unrotated channels untouched
    assert not torch.allclose(y[..., :rot], x[..., :rot])
    # Each interleaved pair is a plane rotation: pair norms (hence the vector norm) are kept.
    pn = lambda t: t[..., :rot].unflatten(-1, (rot // 2, 2)).norm(dim=-1)
    torch.testing.assert_close(pn(y), pn(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_positions_and_dtype():
    # 7B: a one-token window sits at -1 on every axis; 3B video time starts at the text length.
    cos, sin = R.pixel_video_table((1, 1, 1))
    f = R.pixel_frequencies(128).repeat_interleave(2)
    torch.testing.assert_close(cos[0], torch.cos(-f).repeat(3))
    cos3, _ = R.mmrope3d_video_table((1, 1, 1), 9)
    f3 = R.mmrope3d_frequencies(128).repeat_interleave(2)
    torch.testing.assert_close(cos3[0, :42], torch.cos(9 * f3))
    assert torch.equal(cos3[0, 42:], torch.ones(84))
    x = torch.randn(1, 2, 128).to(torch.bfloat16)
    assert R.apply_rope(x, R.pixel_video_table((1, 1, 1))).dtype == torch.bfloat16


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ValueError, match="window shape"):
        R.pixel_video_table((0, 2, 2))
    with pytest.raises(ValueError, match="RoPE input"):
        R.apply_rope(torch.zeros(5, 2, 128), R.pixel_video_table((1, 2, 2)))
