"""A start from existing latents at a strength (pipelines/h3/strength.py): the truncated schedule and the noised start
against diffusers' img2img rule written out here in float64; s = 1 is t2va bit for bit; a kept soundtrack is the
source's bit for bit; bad strengths and sources are refused."""

from functools import partial

import pytest
import torch

from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.pipelines.h3 import strength
from comfyui_h3.backend.pipelines.h3.request import H3Request

from h3_requests import t2va
from comfyui_h3.backend.pipelines.h3.schedule import FASTH3_POSITIONS, DualSchedule


def ladder64(positions, shift):
    p = torch.tensor(positions, dtype=torch.float64)
    return shift * p / (1 + (shift - 1) * p)


def diffusers_start(evaluations, s):
    """diffusers' get_timesteps: init_timestep = min(N * s, N); t_start = int(max(N - init_timestep, 0))."""
    init_timestep = min(evaluations * s, evaluations)
    return int(max(evaluations - init_timestep, 0))


@pytest.mark.parametrize("steps,s", [(50, 0.35), (50, 1.0), (30, 0.6), (8, 0.01), (4, 0.5)])
def test_truncated_schedule_and_noised_start_equal_the_float64_rule(steps, s):
    full = DualSchedule.named("default", steps, 12.0, 3.0)
    start = diffusers_start(steps, s)
    want_v = ladder64(torch.linspace(1, 0, steps + 1, dtype=torch.float64).tolist(), 12.0)[start:]
    want_a = ladder64(torch.linspace(1, 0, steps + 1, dtype=torch.float64).tolist(), 3.0)[start:]
    got = strength.truncated(full, s, "same", 3.0)
    assert got.num_evaluations == steps - start >= 1
    assert (got.video_sigmas.double() - want_v).abs().max() <= 1e-6
    assert (got.audio_sigmas.double() - want_a).abs().max() <= 1e-6
    g = torch.Generator().manual_seed(1)
    source, noise = torch.randn(1, 24, 3, 4, 4, generator=g), torch.randn(1, 24, 3, 4, 4, generator=g)
    sigma = want_v[0]
    want = sigma * noise.double() + (1 - sigma) * source.double()
    assert (strength.noised(source, noise, got.video_sigmas[0]).double() - want).abs().max() <= 1e-6
    # the other soundtracks: a fresh audio grid of the remaining steps, or a constant ladder (rows never change)
    regen = strength.truncated(full, s, "regenerate", 3.0).audio_sigmas
    assert regen[0] == 1.0 and len(regen) == len(want_v) and regen[-1] == 0.0
    assert torch.equal(strength.truncated(full, s, "keep", 3.0).audio_sigmas, torch.ones(len(want_v)))


def test_the_fasth3_ladder_truncates_by_the_same_rule():
    full = DualSchedule.named("fasth3", 4, 12.0, 3.0)
    got = strength.truncated(full, 0.5, "same", 3.0)
    want = ladder64(FASTH3_POSITIONS, 12.0)[diffusers_start(4, 0.5):]
    assert (got.video_sigmas.double() - want).abs().max() <= 1e-6


# -- through the tiny pipeline ----------------------------------------------------------------------------------------

_req = partial(t2va, prompt="surf", steps=4, seed=3)  # a small t2va; keywords override


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    return tiny_pipeline


@pytest.fixture(scope="module")
def source(pipe):
    return pipe.run(_req(seed=9))


def test_strength_one_from_a_source_is_t2va_bitwise(pipe, source):
    plain = pipe.run(_req())
    from_source = pipe.run(_req(init_video=source.video_latents, init_audio=source.audio_latents, denoise=1.0))
    assert torch.equal(plain.video_latents, from_source.video_latents)
    assert torch.equal(plain.audio_latents, from_source.audio_latents)


def test_a_start_at_a_strength_runs_the_truncated_schedule_from_the_noised_source(pipe, source, monkeypatch):
    from comfyui_h3.backend.pipelines.h3.layout import audio_latents_to_rows, patchify

    seen = {}
    real = pipe.denoise

    def spy(dit, plan, video, audio, *a, **k):
        seen.update(sigmas=plan.schedule.video_sigmas.clone(), audio_sigmas=plan.schedule.audio_sigmas.clone(),
                    video=video.clone(), audio=audio.clone(), layout=plan.layout)
        return real(dit, plan, video, audio, *a, **k)

    monkeypatch.setattr(pipe, "denoise", spy)
    got = pipe.run(_req(init_video=source.video_latents, init_audio=source.audio_latents, denoise=0.6))
    shift_v, shift_a = pipe.c.video_shift, pipe.c.audio_shift
    start = diffusers_start(4, 0.6)
    want = ladder64(torch.linspace(1, 0, 5, dtype=torch.float64).tolist(), shift_v)[start:]
    assert (seen["sigmas"].double() - want).abs().max() <= 1e-6 and got.video_latents.shape == source.video_latents.shape
    # the noise t2va draws with seed 3 (no condition rows in t2va): video, then audio rows
    g = torch.Generator("cpu").manual_seed(3)
    video_noise = torch.randn(source.video_latents.shape, generator=g)
    audio_noise = torch.randn(audio_latents_to_rows(source.audio_latents).shape, generator=g)
    patch = pipe.c.patch_size
    want_v = want[0] * patchify(video_noise, patch).double() + (1 - want[0]) * patchify(source.video_latents, patch).double()
    sigma_a = ladder64(torch.linspace(1, 0, 5, dtype=torch.float64).tolist(), shift_a)[start]
    want_a = sigma_a * audio_noise.double() + (1 - sigma_a) * audio_latents_to_rows(source.audio_latents).double()
    layout = seen["layout"]
    assert (seen["video"][layout.num_condition_video_rows:].double().cpu() - want_v).abs().max() <= 1e-5
    assert (seen["audio"][layout.num_condition_audio_rows:].double().cpu() - want_a).abs().max() <= 1e-5
    assert not torch.equal(got.video_latents, pipe.run(_req()).video_latents)


def test_a_kept_soundtrack_is_the_sources_bitwise(pipe, source):
    got = pipe.run(_req(init_video=source.video_latents, init_audio=source.audio_latents, denoise=0.5,
                        init_audio_mode="keep"))
    assert torch.equal(got.audio_latents, source.audio_latents)
    assert not torch.equal(got.video_latents, source.video_latents)
    regen = pipe.run(_req(init_video=source.video_latents, denoise=0.5, init_audio_mode="regenerate"))
    assert torch.isfinite(regen.audio_latents).all() and not torch.equal(regen.audio_latents, source.audio_latents)


def test_bad_strengths_and_sources_are_refused(pipe, source):
    v, a = source.video_latents, source.audio_latents
    for kw, message in (({"init_video": v, "denoise": 0.0}, "above 0 and at most 1"),
                        ({"init_video": v, "denoise": 1.5}, "above 0 and at most 1"),
                        ({"denoise": 0.5}, "needs the source's video latents"),
                        ({"init_video": v, "denoise": 0.5}, "needs the source's audio latents"),
                        ({"init_video": v, "init_audio": a, "init_audio_mode": "blend"}, "init_audio_mode must be"),
                        ({"init_video": v[:, :, :1]}, None)):
        if message is None:  # the shapes are the worker's to check against the loaded model's geometry
            with pytest.raises(RequestError, match="source video latents are .* need"):
                pipe.run(_req(**kw))
            continue
        with pytest.raises(RequestError, match=message):
            _req(**kw).validate()
    nan = v.clone()
    nan[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(RequestError, match="source video latents holds 1 NaN"):
        _req(init_video=nan, init_audio=a, denoise=0.5).validate()
