"""Step caching (pipelines/h3/step_cache.py): the decision and the reused residual against numbers worked out by hand;
a cached forward equals the DiT whose later blocks are replaced by the cached residual; off (or a cache that never
skips) is the path without a cache bit for bit; every task and SP on two gloo ranks agree with one rank; the manifest
counts the forwards computed."""

from functools import partial

import pytest
import torch
from torch import nn

from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.pipelines.h3 import step_cache as sc
from comfyui_h3.backend.pipelines.h3.request import H3Request

from h3_requests import on_two_gloo_ranks, t2va
from tiny_dit import dit_inputs, tiny_dit


def test_settings_parse_presets_thresholds_and_fixed_schedules():
    assert sc.parse("off") is None and sc.parse("0") is None and sc.parse(None) is None
    assert sc.parse("fast") == sc.PRESETS["fast"]
    assert sc.parse("0.15").threshold == 0.15 and sc.parse("0.15").front == sc.PRESETS["balanced"].front
    fixed = sc.parse("every:3")
    assert fixed.every == 3 and fixed.enabled and fixed.max_run == -1
    for bad in ("sometimes", "every:1", "-1", "11"):
        with pytest.raises(RequestError, match="step_cache"):
            sc.parse(bad)
    with pytest.raises(RequestError, match="step_cache must be off"):
        H3Request(prompt="x", step_cache="sometimes").validate()


def test_the_decision_and_the_reused_residual_by_hand():
    settings = sc.StepCacheSettings(threshold=0.3, front=1, warmup=1, max_run=2, order=1)
    cache = sc.StepCache(settings, blocks=4)
    x_in = torch.zeros(1, 2, 2)
    t = lambda a, b, c, d: torch.tensor([[[a, b], [c, d]]])  # noqa: E731 - binary fractions: exact sums
    fronts = [t(1, 1, 1, 1), t(1.25, 1, 1, 1), t(1.25, 1, 1, 2.25), t(1.5, 1, 1, 2.25), t(1.5, 1.25, 1, 2.25),
              t(1.5, 1.25, 1.25, 2.25)]
    backs = {0: torch.full((1, 2, 2), 2.0), 2: torch.full((1, 2, 2), 3.0)}
    decisions = []
    for step, front in enumerate(fronts):
        cache.begin(step)
        skip = cache.reuse(front, x_in)
        decisions.append(skip)
        if skip:
            reused = cache.back_residual()
            if step == 1:  # one computed step so far: order 0, the last residual itself
                assert torch.equal(reused, backs[0])
            if step == 3:  # order 1 from steps 0 and 2: 3 + (3 - 2) / 2 * (3 - 2)
                assert torch.allclose(reused, torch.full((1, 2, 2), 3.5))
        else:
            cache.remember(backs.get(step, torch.full((1, 2, 2), 3.0)))
    # step 0: warm-up; 1: 0.25 / 4 against step 0 -> cached; 2: (0.25 + 1.25) / 4 = 0.375 -> computed; 3: 0.25 / 5.5
    # against step 2 -> cached; 4: 0.5 / 5.5 -> cached; 5: 0.75 / 5.5, but a third in a row exceeds max_run 2
    assert decisions == [False, True, False, True, True, False]
    assert cache.computed == [0, 2, 5] and cache.cached == [1, 3, 4]
    assert cache.diffs[0] is None and cache.diffs[1:3] == [0.0625, 0.375]
    assert abs(cache.diffs[5] - 0.75 / 5.5) < 1e-12
    # order 2 from three computed steps (0, 2, 5: residuals 2, 3, 3) at step 6, by Newton's divided differences
    settings2 = sc.StepCacheSettings(threshold=0.3, front=1, warmup=0, max_run=-1, order=2)
    cache2 = sc.StepCache(settings2, blocks=4)
    for k, r in ((0, 2.0), (2, 3.0), (5, 3.0)):
        cache2.begin(k)
        cache2.remember(torch.full((1, 1, 1), r))
    cache2.begin(6)
    d1, d1_prev = (3.0 - 3.0) / 3, (3.0 - 2.0) / 2
    d2 = (d1 - d1_prev) / ((5 - 0) / 2)
    assert torch.allclose(cache2.back_residual(), torch.full((1, 1, 1), 3.0 + d1 * 1 + d2 * 0.5))


class _AddResidual(nn.Module):
    """Stands for the blocks after the front: adds the cached residual (what a cached step does)."""

    def __init__(self, residual):
        super().__init__()
        self.residual = residual
        self.adaln_proj = lambda temb, dtype=None: (None,) * 6

    def forward(self, x, *args):
        return x + self.residual


def test_a_cached_forward_is_the_front_blocks_plus_the_cached_residual():
    dit = tiny_dit().eval()
    args = dit_inputs()
    settings = sc.StepCacheSettings(threshold=10.0, front=1, warmup=1, max_run=-1, order=0)
    cache = sc.StepCache(settings, blocks=len(dit.transformer_blocks))
    with torch.no_grad():
        cache.begin(0)
        first = dit(*args, step_cache=cache)  # computed: its back residual is kept
        plain = dit(*args)
        assert all(torch.equal(a, b) for a, b in zip(first, plain))
        back = cache._history[-1][1]
        moved = list(args)
        moved[3] = args[3] * 0.9  # the next step's timesteps
        cache.begin(1)
        got = dit(*moved, step_cache=cache)
        assert cache.cached == [1]
        blocks = dit.transformer_blocks
        dit.transformer_blocks = nn.ModuleList([blocks[0], _AddResidual(back)])
        want = dit(*moved)
        dit.transformer_blocks = blocks
    assert all(torch.equal(a, b) for a, b in zip(got, want))


# -- through the tiny pipeline ----------------------------------------------------------------------------------------

_req = partial(t2va, prompt="surf", steps=8, seed=3)  # a small t2va; keywords override


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    return tiny_pipeline


def test_off_and_a_cache_that_never_skips_are_the_exact_path(pipe):
    plain = pipe.run(_req())
    assert plain.manifest["step_cache"] is None
    never = pipe.run(_req(step_cache="1e-12"))
    assert torch.equal(plain.video_latents, never.video_latents)
    assert torch.equal(plain.audio_latents, never.audio_latents)
    report = never.manifest["step_cache"]
    assert report["forwards_computed"] == 8 and report["steps_cached"] == 0 and report["sigma_points"] == 8


def test_a_fixed_schedule_skips_its_steps_and_the_manifest_counts_them(pipe):
    plain = pipe.run(_req())
    got = pipe.run(_req(step_cache="every:2"))
    report = got.manifest["step_cache"]
    warm = sc.PRESETS["balanced"].warmup  # 6 of 8 steps; then 6 computed, 7 cached
    assert report["plans"][0]["cached_steps"] == [7] and report["forwards_computed"] == 7
    assert report["seconds_per_forward"] > 0 and warm == 6
    err = ((got.video_latents - plain.video_latents).norm() / plain.video_latents.norm()).item()
    assert 0 < err < 0.5  # lossy, and close


def test_every_task_runs_with_the_cache(pipe):
    import numpy as np

    frames = np.random.default_rng(0).integers(0, 256, (124, 64, 64, 3), dtype=np.uint8)
    mask = np.zeros((124, 64, 64), np.float32)
    mask[:, 16:48, 16:48] = 1
    edit = pipe.run(H3Request(prompt="a lake", steps=8, seed=1, source_frames=frames, mask=mask, decode=False,
                              step_cache="every:2"))
    assert edit.manifest["step_cache"]["steps_cached"] == 1
    keep = (edit.edit["restore_mask"] == 0)[None, None].expand_as(edit.video_latents)
    assert torch.equal(edit.video_latents[keep], edit.edit["source_video_latents"][keep])  # kept cells exact
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    src = pipe.run(_req(steps=2))
    ext = pipe.run(H3ExtendRequest(prompts=["more surf"], added_frames=17, window_frames=124, overlap_frames=22,
                                   source_video_latents=src.video_latents, source_audio_latents=src.audio_latents,
                                   steps=8, seed=2, step_cache="every:2"))
    assert ext.manifest["step_cache"]["steps_cached"] >= 1


@pytest.mark.parametrize("policy", ["adaln_cache", "offload"])
def test_the_adaln_cache_and_block_streaming_reuse_as_the_resident_path(tiny_h3_dir, pipe, policy):
    """With the AdaLN table cache, or every block streamed (a cached step streams none of the later blocks): the
    same decisions and the same latents as the plain resident path with the same cache."""
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy

    weights = H3WeightPolicy(adaln="cache") if policy == "adaln_cache" else H3WeightPolicy(placement="offload",
                                                                                          resident_blocks=0)
    other = h3_config(str(tiny_h3_dir), dtype="float32", weights=weights).build_pipeline(0)
    for setting in ("every:2", "5"):
        want, got = pipe.run(_req(step_cache=setting)), other.run(_req(step_cache=setting))
        assert got.manifest["step_cache"]["plans"][0]["cached_steps"] == \
            want.manifest["step_cache"]["plans"][0]["cached_steps"]
        assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents,
                                                                                 want.audio_latents)


@pytest.mark.slow
def test_two_gloo_ranks_decide_as_one_rank(tiny_h3_dir, pipe):
    request = _req(step_cache="5")  # past the warm-up every step may be reused, as max_run allows
    single, got = pipe.run(request), on_two_gloo_ranks(tiny_h3_dir, request)
    ranks, one = got.manifest["step_cache"]["plans"][0], single.manifest["step_cache"]["plans"][0]
    assert ranks["cached_steps"] == one["cached_steps"] and one["cached_steps"]
    assert all(abs(a - b) <= 1e-4 * max(b, 1e-3) for a, b in zip(ranks["diffs"], one["diffs"]) if b is not None)
    err = ((got.video_latents - single.video_latents).norm() / single.video_latents.norm()).item()
    assert err <= 1e-4
