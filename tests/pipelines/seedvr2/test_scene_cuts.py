"""Hard cuts in SeedVR2 upscales (backend/pipelines/seedvr2/scene_cuts.py, batches.plan_shots): found cheaply from
frame differences, never inside a batch or a cross-fade, and a clip without cuts unchanged by the option."""

from __future__ import annotations

import math

import pytest
import torch

from comfyui_h3.backend.pipelines.seedvr2.batches import blend_weights, plan_batches, plan_shots
from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest
from comfyui_h3.backend.pipelines.seedvr2.scene_cuts import find_cuts, shots


def _shot(frames: int, h: int, w: int, phase: float, hue: tuple) -> torch.Tensor:
    """A smooth moving pattern: stripes drifting a little each frame, tinted `hue` (a shot of one scene)."""
    y = torch.arange(h).view(1, h, 1).float()
    x = torch.arange(w).view(1, 1, w).float()
    t = torch.arange(frames).view(frames, 1, 1).float()
    wave = 0.5 + 0.5 * torch.sin(2 * math.pi * (x / 23.0 + y / 37.0 + phase) + 0.15 * t)
    rgb = torch.stack([wave * c for c in hue], dim=-1)
    return (rgb * 255).round().clamp(0, 255).to(torch.uint8)


def _two_shots(first: int, second: int, h: int = 24, w: int = 40) -> torch.Tensor:
    return torch.cat([_shot(first, h, w, 0.0, (0.9, 0.5, 0.2)), _shot(second, h, w, 0.4, (0.1, 0.4, 0.95))])


def test_a_cut_is_found_where_the_shot_changes_and_nowhere_else():
    assert find_cuts(_two_shots(14, 11)) == [14]
    assert find_cuts(_two_shots(14, 11, 768 // 8, 1344 // 8)) == [14]
    assert find_cuts(_shot(30, 48, 64, 0.0, (1.0, 1.0, 1.0))) == []  # motion within a shot
    noise = torch.randint(0, 256, (30, 48, 64, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    assert find_cuts(noise) == []  # every frame unlike the last, alike: no shot boundary stands out
    assert find_cuts(_two_shots(1, 1)) == [1] and find_cuts(_shot(1, 24, 40, 0, (1, 1, 1))) == []
    assert shots(25, [14]) == [(0, 14), (14, 25)] and shots(5, []) == [(0, 5)]


def test_a_plan_over_shots_never_crosses_a_cut():
    assert plan_shots(61, 17, 8, []) == plan_batches(61, 17, 8)  # no cut: the plan as before
    plan = plan_shots(61, 17, 8, [23, 40])
    assert plan.cuts == (23, 40)
    for cut in plan.cuts:
        assert not any(s < cut < e for s, e in plan.spans)  # no batch spans a cut
    covered = torch.zeros(61, dtype=torch.int64)
    for s, e in plan.spans:
        covered[s:e] += 1
    assert bool((covered > 0).all())
    weights = torch.zeros(61, dtype=torch.float64)
    for (s, e), w in zip(plan.spans, blend_weights(plan)):
        weights[s:e] += w
    assert torch.allclose(weights, torch.ones(61, dtype=torch.float64))
    for (s, e), w in zip(plan.spans, blend_weights(plan)):  # the frames beside a cut come from one batch alone
        for cut in plan.cuts:
            for f in (cut - 1, cut):
                if s <= f < e:
                    assert w[f - s] == 1.0
    assert all(e - s <= 17 for s, e in plan.spans)


@pytest.mark.slow
def test_an_upscale_keeps_the_cut_inside_a_batch(pipe):
    """A 25-frame clip with a cut at frame 14, in batches of 17 with an overlap of 8 (one batch and a cross-fade would
    span the cut): the first shot's output is the first shot upscaled alone, and nothing before the cut changes a
    frame after it. Off, the batches span the cut and the second shot's frames depend on the first's."""
    clip = _two_shots(14, 11)
    request = dict(scale=2.0, batch_frames=17, overlap=8, seed=5)
    kept = pipe.run(UpscaleRequest(clip, **request))
    assert kept.manifest["request"]["shapes"]["scene_cuts"] == [14]
    alone = pipe.run(UpscaleRequest(clip[:14].clone(), **request))
    assert torch.equal(kept.frames[:14], alone.frames)
    changed = clip.clone()
    changed[:14] = 255 - changed[:14]  # another first shot, the same second one
    again = pipe.run(UpscaleRequest(changed, **request))
    assert torch.equal(again.frames[14:], kept.frames[14:])
    spanned = pipe.run(UpscaleRequest(changed, scene_cuts=False, **request))
    spanned_kept = pipe.run(UpscaleRequest(clip, scene_cuts=False, **request))
    assert spanned.manifest["request"]["shapes"]["scene_cuts"] == []
    assert not torch.equal(spanned.frames[14:], spanned_kept.frames[14:])  # off: the first shot reaches the second


@pytest.mark.slow
def test_a_clip_without_cuts_is_the_same_with_the_option_on_or_off(pipe):
    clip = _shot(25, 24, 40, 0.0, (0.8, 0.8, 0.3))
    request = dict(scale=2.0, batch_frames=17, overlap=8, seed=2)
    on = pipe.run(UpscaleRequest(clip, **request))
    off = pipe.run(UpscaleRequest(clip, scene_cuts=False, **request))
    assert on.batches == off.batches == 2 and torch.equal(on.frames, off.frames)


def test_the_option_reaches_the_cli_and_the_node():
    from comfyui_h3.cli import _parser
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    base = ["upscale", "--video", "x.mp4", "--out", "y.mp4"]
    assert _parser().parse_args(base).scene_cuts is True
    assert _parser().parse_args(base + ["--no-scene-cuts"]).scene_cuts is False
    optional = H3SeedVR2Upscale.INPUT_TYPES()["optional"]
    assert list(optional)[-2:] == ["scene_cuts", "vae_tile_stats"]  # appended: saved workflows keep their order
    kind, spec = optional["scene_cuts"]
    assert kind == "BOOLEAN" and spec["default"] is True and spec["tooltip"]
