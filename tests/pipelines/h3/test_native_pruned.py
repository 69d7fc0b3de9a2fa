"""ComfyUI's "pruned" native MiniMax-H3 DiT (`minimax_h3_*_pruned_*`; docs/NATIVE_H3.md): no time embedder, a curve
table `adaln_t_table` [grid, width] whose linearly interpolated rows the AdaLN projections take without silu.

Pruned files are written from the tiny folder by the rule native_write.py documents (the time embedder and AdaLN
projections sampled at the grid): at grid timesteps the loaded model's modulation is the full DiT's, between them the
linear blend of its two neighbours' (computed here from the full DiT, independently of curve_rows), and a whole
engine run stays close to the full DiT's."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.models.checkpoint import CheckpointError

GRID = 65


@pytest.fixture(scope="module")
def pruned(tiny_h3_dir, tmp_path_factory):
    from comfyui_h3.backend.models.native_write import write_native_pruned_transformer, write_native_transformer

    out = tmp_path_factory.mktemp("pruned")
    write_native_transformer(tiny_h3_dir / "transformer", out / "full.safetensors")
    write_native_pruned_transformer(tiny_h3_dir / "transformer", out / "pruned.safetensors", grid=GRID)
    return out


def _config(tiny_h3_dir):
    return tiny_h3_dir / "transformer" / "config.json"


def _modulation(dit, t: torch.Tensor) -> torch.Tensor:
    """Every AdaLN row the DiT's forward makes for timesteps t: the blocks' [K * 3, 6 * hidden] and the output
    norm's [K, 2 * hidden], flattened per timestep."""
    from comfyui_h3.backend.models.h3_transformer import norm_out_table

    with torch.no_grad():
        temb = dit.time_embedding(t)
        parts = [torch.cat(b.adaln_proj(temb), -1).reshape(len(t), -1) for b in dit.transformer_blocks]
        lin = dit.norm_out.linear
        parts.append(norm_out_table(temb, lin.weight, lin.bias, silu=not dit.pruned))
    return torch.cat(parts, -1).to(torch.float32)


def test_pruned_file_is_the_native_curve_layout(pruned):
    full, cut = load_file(pruned / "full.safetensors"), load_file(pruned / "pruned.safetensors")
    assert set(cut) == {k for k in full if not k.startswith("time_embedder.")} | {"adaln_t_table"}
    assert cut["adaln_t_table"].dtype == torch.float32 and cut["adaln_t_table"].shape == (GRID, 24)
    for key in [k for k in full if "adaln_proj.linear" in k]:  # full width: the projections are unchanged
        assert torch.equal(cut[key], full[key]), key


def test_pruned_modulation_is_the_full_dits_at_the_grid_and_its_linear_blend_between(pruned, tiny_h3_dir):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
    from comfyui_h3.backend.models.native_load import load_native_transformer

    full = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False)
    dit = load_native_transformer(pruned / "pruned.safetensors", _config(tiny_h3_dir), dtype=torch.float32)
    assert dit.pruned and dit.time_embedder is None and dit.config.adaln_curve_grid == GRID
    grid_t = (torch.arange(GRID, dtype=torch.float64) / (GRID - 1)).to(torch.float32)
    at_grid = _modulation(full, grid_t)
    torch.testing.assert_close(_modulation(dit, grid_t), at_grid, rtol=1e-5, atol=1e-6)

    # between grid points, the engine's own per-row timesteps included (cond rows 0.999, audio cond 1.0, t=0)
    t = torch.cat([torch.rand(40, generator=torch.Generator().manual_seed(0)),
                   torch.tensor([0.0, 0.3333, 0.999, 1.0, 1.0 - 1e-7])])
    pos = t.double() * (GRID - 1)
    low = pos.floor().long().clamp(max=GRID - 2)
    frac = (pos - low).unsqueeze(1)
    expected = (1 - frac) * at_grid[low].double() + frac * at_grid[low + 1].double()
    got = _modulation(dit, t)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    off_grid = frac.squeeze(1) > 0.05
    assert (got[off_grid] - _modulation(full, t)[off_grid]).abs().amax() > 0  # interpolated, not the embedder


def _run(components, **kw):
    from comfyui_h3.backend.pipelines.h3.pipeline import H3Pipeline
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    request = dict(prompt="a cat", num_frames=124, width=128, height=64, steps=2, seed=3, decode=False)
    return H3Pipeline(components).run(H3Request(**{**request, **kw}))


@pytest.mark.slow
def test_engine_runs_a_pruned_file_close_to_the_full_dit_and_adaln_cache_is_a_no_op(pruned, tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.adaln_cache import AdaLNCache
    from comfyui_h3.backend.pipelines.h3.components import EngineOptions, H3Components
    from comfyui_h3.backend.pipelines.h3.pipeline import H3Pipeline

    def components(adaln="direct", dit=None):
        files = () if dit is None else (("transformer", str(pruned / dit)),)
        return H3Components(tiny_h3_dir, EngineOptions(device="cpu", dtype=torch.float32, files=files, adaln=adaln))

    full = _run(components())
    cut_components = components(dit="pruned.safetensors")
    cut = _run(cut_components)
    for a, b in ((cut.video_latents, full.video_latents), (cut.audio_latents, full.audio_latents)):
        assert a.shape == b.shape and torch.isfinite(a).all()
        # only the interpolation between grid points differs (measured: max |diff| 4.2e-6 video / 1.2e-6 audio, of
        # latents up to 6.0 / 5.8)
        assert (a - b).abs().amax() < 1e-4 * b.abs().amax()
    # an edit's ramp mask: many per-row timesteps per step (the step plan's rows between t and the cond 0.999)
    from h3_requests import edit

    full_edit, cut_edit = (H3Pipeline(c).run(edit()) for c in (components(), cut_components))
    assert (cut_edit.video_latents - full_edit.video_latents).abs().amax() < 1e-4 * full_edit.video_latents.abs().amax()
    cached = components(adaln="cache", dit="pruned.safetensors")  # no cache: the direct path, the same latents
    again = _run(cached)
    assert torch.equal(again.video_latents, cut.video_latents) and cached.adaln_report() == {}
    dit = cut_components.transformer_for("t2va")
    with pytest.raises(ValueError, match="needs no AdaLN table cache"):
        AdaLNCache(dit)


def test_fp8_scaled_pruned_file_loads_dequantised_and_runs(tiny_h3_dir, tmp_path):
    """Like Comfy-Org's minimax_h3_*_pruned_fp8_scaled: an 8-wide curve basis, the blocks' weights scaled FP8."""
    from comfyui_h3.backend.models.native_load import load_native_transformer
    from comfyui_h3.backend.models.native_write import write_native_pruned_transformer
    from comfyui_h3.backend.pipelines.h3.components import EngineOptions, H3Components

    path = write_native_pruned_transformer(tiny_h3_dir / "transformer", tmp_path / "minimax_h3_pruned_fp8.safetensors",
                                           grid=GRID, rank=8, fp8="scaled")
    with safe_open(str(path), "pt") as handle:
        stored = {k: handle.get_tensor(k) for k in handle.keys()}
    assert stored["adaln_t_table"].shape == (GRID, 8) and "scaled_fp8" in stored
    weight = stored["blocks.1.adaln_proj.linear.weight"]
    assert weight.dtype == torch.float8_e4m3fn and weight.shape == (864, 8)
    dit = load_native_transformer(path, _config(tiny_h3_dir), dtype=torch.bfloat16)
    linear = dit.transformer_blocks[1].adaln_proj.linear
    # dequantised per tensor, kept in float32 as the curve form runs (the engine's dtype is bfloat16)
    assert linear.weight.dtype == torch.float32 and dit.adaln_t_table.dtype == torch.float32
    assert torch.equal(linear.weight, weight.float() * stored["blocks.1.adaln_proj.linear.scale_weight"])
    components = H3Components(tiny_h3_dir, EngineOptions(device="cpu", dtype=torch.bfloat16,
                                                         files=(("transformer", str(path)),)))
    result = _run(components, steps=1)
    assert torch.isfinite(result.video_latents).all() and result.video_latents.shape == (1, 24, 37, 4, 8)


def test_wrong_pruned_files_are_errors_naming_the_file_and_the_key(pruned, tiny_h3_dir, tmp_path):
    from comfyui_h3.backend.models.native_load import load_native_transformer

    cut = load_file(pruned / "pruned.safetensors")
    cases = []
    for name, table in (("narrow", torch.zeros(GRID, 23)), ("flat", torch.zeros(GRID * 24)),
                        ("one_row", torch.zeros(1, 24))):
        path = tmp_path / f"{name}.safetensors"
        save_file(dict(cut, adaln_t_table=table), path)
        cases.append((path, "adaln_t_table", None))
    path = tmp_path / "no_table.safetensors"
    save_file({k: v for k, v in cut.items() if k != "adaln_t_table"}, path)  # then it is a full DiT without embedder
    cases.append((path, "is missing DiT weights", None))
    cases.append((pruned / "pruned.safetensors", "FastH3 adapter", tmp_path / "any_adapter.safetensors"))
    for path, says, adapter in cases:
        with pytest.raises(CheckpointError) as info:
            load_native_transformer(path, _config(tiny_h3_dir), adapter=adapter)
        message = str(info.value)
        assert str(path) in message and says in message and "\n" not in message, message
