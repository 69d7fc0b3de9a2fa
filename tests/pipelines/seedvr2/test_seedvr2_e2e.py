"""A whole SeedVR2 restoration (one sample, one step, tiny 3B-like and 7B-like DiTs + the tiny VAE, float32 CPU) equals
the official code's: tests/fixtures/seedvr2_e2e.safetensors from tools/make_seedvr2_e2e_goldens.py, which runs the
official preprocessing, VideoDiffusionInfer (encode, one Euler v_lerp step at t = 1000, decode) and the wavelet colour
fix with the same weights, recording the posterior eps and x_T that our restore_batch is given here. The issue's
bound: fp32 relative error <= 1e-4 before and after the colour fix; uint8 frames equal but for rounding."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from repo_paths import FIXTURES, REPO
from comfyui_h3.backend.models.seedvr2.dit import SeedVR2DiT
from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig
from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig
from comfyui_h3.backend.parallel.context import SINGLE
from comfyui_h3.backend.pipelines.seedvr2 import restore
from comfyui_h3.backend.pipelines.seedvr2.preprocess import plan_geometry

import sys  # noqa: E402
sys.path.insert(0, str(REPO / "tools"))  # the golden scripts' deterministic weights
from seedvr2_det import det_dit_weights, det_vae_weights  # noqa: E402

FIXTURE = FIXTURES / "seedvr2_e2e.safetensors"
with safe_open(str(FIXTURE), framework="pt") as _f:
    META = _f.metadata()
    T = {k: _f.get_tensor(k) for k in _f.keys()}
VARIANTS = ("3b", "7b")
TOL = 1e-4  # the end-to-end bound
STAGE_TOL = 1e-5  # the DiT / VAE goldens' bound, for the intermediate latents


def _check_sums(weights, sums):
    assert sorted(weights) == sorted(sums)
    for k, s in sums.items():
        assert float(weights[k].double().sum()) == pytest.approx(s, rel=1e-12, abs=1e-9), k


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


_CACHE = {}


def components(variant):
    """Our DiT and VAE with the fixture's weights (strict loads: our keys are the official ones), float32 CPU."""
    if variant not in _CACHE:
        config = DiTConfig.from_dict(json.loads(META[f"{variant}.config"]))
        assert config == DiTConfig.tiny(variant, txt_dim=int(META["txt_dim"]))
        dit = SeedVR2DiT(config).eval()
        weights = det_dit_weights({k: list(p.shape) for k, p in dit.named_parameters()})
        _check_sums(weights, json.loads(META[f"{variant}.dit_weight_sums"]))
        dit.load_state_dict({**dit.state_dict(), **weights}, strict=True)  # buffers (RoPE freqs) are unused
        vae_config = VAEConfig.tiny()
        tiny = json.loads(META["vae_tiny"])
        assert (list(vae_config.block_channels), vae_config.norm_groups) == (tiny["block_out_channels"],
                                                                             tiny["norm_num_groups"])
        vae = SeedVR2VAE(vae_config).eval()
        vae_weights = det_vae_weights({k: list(p.shape) for k, p in vae.state_dict().items()},
                                      float(META["decoder_out_gain"]))
        _check_sums(vae_weights, json.loads(META["vae_weight_sums"]))
        vae.load_state_dict(vae_weights, strict=True)
        _CACHE[variant] = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, vae_dtype=torch.float32,
                                          dit=dit, vae=vae, text=T["text"], placement=None)
    return _CACHE[variant]


def geometry():
    frames = T["frames_in"]
    g = plan_geometry(frames.shape[1], frames.shape[2], scale=float(META["scale"]), fit=META["fit"])
    assert list(g.model) == json.loads(META["model_size"])
    return g


def run_restore(variant, monkeypatch, noise):
    """restore_batch with spies on its stages: (uint8 frames, stages: cond, velocity, decoded, fixed)."""
    c = components(variant)
    seen = {"decoded": [], "fixed": []}
    real_condition, real_fix, real_dit = restore.sample_condition, restore.color_fix, c.dit

    def condition(*a, **k):
        seen["cond"] = real_condition(*a, **k)
        return seen["cond"]

    def fix(x, ref, method):
        seen["decoded"].append(x.clone())
        seen["fixed"].append(real_fix(x, ref, method))
        return seen["fixed"][-1]

    def dit(*a, **k):
        seen["velocity"] = real_dit(*a, **k)
        return seen["velocity"]

    monkeypatch.setattr(restore, "sample_condition", condition)
    monkeypatch.setattr(restore, "color_fix", fix)
    monkeypatch.setattr(c, "dit", dit)
    with torch.no_grad():
        out = restore.restore_batch(c, T["frames_in"], geometry(), "wavelet", torch.Generator(), SINGLE, noise=noise)
    seen["decoded"] = torch.cat(seen["decoded"], dim=1)  # [3, F, H, W] (chunks of frames)
    seen["fixed"] = torch.cat(seen["fixed"], dim=1)
    return out, seen


def test_fixture_records_the_official_commit_and_recipe():
    assert META["source"] == "github.com/ByteDance-Seed/SeedVR" and len(META["commit"]) == 40
    g = geometry()
    # a crop that moves the picture (official DivisibleCrop offsets) and 7 frames padded to 9 for the model
    assert g.fit == "crop" and g.offset == (3, 3) and g.model == (48, 80) and g.resized == (54, 86)
    assert int(META["model_frames"]) == 9 and T["frames_in"].shape[0] == 7


@pytest.mark.parametrize("variant", VARIANTS)
def test_restoration_equals_official_fp32(variant, monkeypatch):
    n = T["frames_in"].shape[0]
    out, seen = run_restore(variant, monkeypatch, (T[f"{variant}.eps"], T[f"{variant}.x_T"]))
    # the stages, to say where a difference starts: preprocess + VAE encode, then the DiT step
    assert rel(seen["cond"], T[f"{variant}.cond"]) <= STAGE_TOL
    x0 = T[f"{variant}.x_T"] - seen["velocity"]
    assert rel(x0, T[f"{variant}.x0"]) <= STAGE_TOL
    # the requirement: decoded frames before and after the colour fix
    decoded = seen["decoded"][:, :n].permute(1, 0, 2, 3)
    fixed = seen["fixed"][:, :n].permute(1, 0, 2, 3)
    assert rel(decoded, T[f"{variant}.decoded"]) <= TOL
    assert rel(fixed, T[f"{variant}.fixed"]) <= TOL
    # uint8: equal except a value sitting on a rounding boundary (one level, a tiny fraction of the pixels)
    expected = T[f"{variant}.frames"]
    assert out.shape == expected.shape and out.dtype == torch.uint8
    diff = (out.int() - expected.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 1e-3


def test_given_noise_is_what_the_generator_draws():
    """The injection point changes nothing: eps then x_T drawn from the batch's generator, given explicitly, restore
    the same frames as restore_batch drawing them itself (the official order: posterior eps first, then x_T)."""
    variant = "3b"
    eps_shape, xt_shape = T[f"{variant}.eps"].shape, T[f"{variant}.x_T"].shape
    g = restore.batch_generator(11, 2)
    eps = torch.randn(eps_shape, generator=g)
    x_t = torch.randn(xt_shape, generator=g)
    c, g = components(variant), geometry()
    with torch.no_grad():
        given = restore.restore_batch(c, T["frames_in"], g, "wavelet", torch.Generator(), SINGLE, noise=(eps, x_t))
        drawn = restore.restore_batch(c, T["frames_in"], g, "wavelet", restore.batch_generator(11, 2), SINGLE)
    assert torch.equal(given, drawn)  # restore_batch draws them on a thread, beside the encode
    aside_eps, aside_x_t = restore.draw_noise_aside(restore.batch_generator(11, 2), *x_t.shape[:3], pin=False).result()
    assert torch.equal(aside_eps, eps) and torch.equal(aside_x_t, x_t)
    with pytest.raises(ValueError, match="x_T noise has shape"):
        restore.restore_batch(c, T["frames_in"], g, "wavelet", torch.Generator(), SINGLE, noise=(eps, x_t[:1]))
