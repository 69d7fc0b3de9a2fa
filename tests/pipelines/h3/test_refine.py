"""H3 Refine and video-to-video starts (refine.py, init_clip.py, row_fit.py): the latent upscale against bilinear
interpolation written out in float64, the refine request through the tiny pipeline (the noised upscaled start, the
kept soundtrack bit for bit), a decoded clip encoded on the worker equal to its latents given directly, and the
refusals: sizes that shrink or do not fit, memory that does not hold the rows (naming what would)."""

import math

import numpy as np
from functools import partial

import pytest
import torch

from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.pipelines.h3 import refine, row_fit
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
from comfyui_h3.backend.pipelines.h3.init_clip import InitClip, prepare_init_clip
from comfyui_h3.backend.pipelines.h3.request import H3Request

from h3_requests import on_two_gloo_ranks, t2va


def bilinear64(plane: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """Half-pixel-centre bilinear (align_corners False; edges clamped), in float64, one [h, w] plane."""
    h, w = plane.shape
    x = plane.double()

    def taps(n_out, n_in):
        rows = []
        for i in range(n_out):
            src = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
            i0 = min(int(math.floor(src)), n_in - 1)
            i1 = min(i0 + 1, n_in - 1)
            rows.append((i0, i1, src - i0))
        return rows

    out = torch.empty(out_h, out_w, dtype=torch.float64)
    for r, (y0, y1, fy) in enumerate(taps(out_h, h)):
        row = (1 - fy) * x[y0] + fy * x[y1]
        for col, (x0, x1, fx) in enumerate(taps(out_w, w)):
            out[r, col] = (1 - fx) * row[x0] + fx * row[x1]
    return out


def test_upscale_latents_is_per_frame_bilinear():
    g = torch.Generator().manual_seed(5)
    video = torch.randn(1, 3, 2, 4, 6, generator=g)
    got = refine.upscale_latents(video, width=9 * 16, height=7 * 16)
    assert got.shape == (1, 3, 2, 7, 9) and got.dtype == torch.float32
    for c in range(3):
        for t in range(2):
            assert (got[0, c, t].double() - bilinear64(video[0, c, t], 7, 9)).abs().max() <= 1e-6
    same = refine.upscale_latents(video, width=96, height=64)
    assert torch.equal(same, video) and same is not video


def test_refine_sizes_are_checked():
    refine.check_refine_size((1344, 768), refine.REFINE_SIZE)  # the default route: 0.8 % stretch
    for target, message in (((1920, 1080), "multiples of 32"), ((1280, 768), "smaller than the source"),
                            ((1344, 1344), "changes the source's aspect")):
        with pytest.raises(RequestError, match=message):
            refine.check_refine_size((1344, 768), target)


_req = partial(t2va, prompt="surf", steps=4, seed=3)  # a small t2va; keywords override


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    return tiny_pipeline


@pytest.fixture(scope="module")
def source(pipe):
    return pipe.run(_req(seed=9, width=128, height=64))


def test_a_refine_starts_from_the_noised_upscale_and_keeps_the_soundtrack(pipe, source, monkeypatch):
    from comfyui_h3.backend.pipelines.h3 import strength
    from comfyui_h3.backend.pipelines.h3.layout import patchify

    seen = {}
    real = pipe.denoise

    def spy(dit, plan, video, audio, *a, **k):
        seen.update(sigma=float(plan.schedule.video_sigmas[0]), video=video.clone(), layout=plan.layout)
        return real(dit, plan, video, audio, *a, **k)

    monkeypatch.setattr(pipe, "denoise", spy)
    request = refine.refine_request(source.video_latents, source.audio_latents, "surf", width=192, height=96,
                                    denoise=0.5, steps=4, seed=3, decode=False)
    got = pipe.run(request)
    assert got.video_latents.shape == (1, 24, source.video_latents.shape[2], 6, 12)
    assert torch.equal(got.audio_latents, source.audio_latents)  # "keep": the source's bit for bit
    up = refine.upscale_latents(source.video_latents, 192, 96)
    g = torch.Generator("cpu").manual_seed(3)
    noise = torch.randn(up.shape, generator=g)
    sigma = torch.tensor(seen["sigma"])
    want = patchify(strength.noised(up, noise, sigma), pipe.c.patch_size)
    start = seen["layout"].num_condition_video_rows
    assert torch.equal(seen["video"][start:].cpu(), want)
    assert seen["sigma"] < 1.0


def _clip_frames(frames=30, h=40, w=72, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (frames, h, w, 3), dtype=np.uint8)


def test_prepare_init_clip_puts_a_clip_on_the_grids():
    frames = _clip_frames(130)  # 130 frames at 24 fps -> 124 (17n+5, cut down), fitted to 64x32
    clip = prepare_init_clip(frames, 24.0)
    assert (clip.num_frames, clip.size) == (124, (64, 32)) and clip.waveform is None
    assert np.array_equal(clip.frames, frames[:124, 4:36, 4:68])
    stretched = prepare_init_clip(frames[:70], 12.0, torch.zeros(2, 800), 16000, width=96, height=64)
    assert (stretched.num_frames, stretched.size, stretched.sample_rate) == (124, (96, 64), 16000)  # 12 fps doubled
    assert np.array_equal(stretched.frames[0], stretched.frames[1])  # each 12-fps frame held for two slots
    for kw, message in (({"fps": 24.0, "width": 96}, "together"), ({"fps": 24.0, "width": 100, "height": 64},
                        "multiples of 32"), ({"fps": 24.0, "waveform": torch.zeros(2, 10)}, "sample rate")):
        with pytest.raises(RequestError, match=message):
            prepare_init_clip(frames, **kw)
    with pytest.raises(RequestError, match="at least 5"):
        prepare_init_clip(frames[:3], 24.0)
    long = np.repeat(frames[:1], 400, axis=0)  # 16.7 s: its first 345 frames (H3's longest clip)
    assert prepare_init_clip(long, 24.0).num_frames == 345


def test_a_clip_of_any_rate_refines_from_its_own_canvas():
    from comfyui_h3.backend.pipelines.h3.init_clip import fitted_size

    fast = _clip_frames(330, 40, 72)  # 5.5 s at 60 fps: a handful of its frames are less than one 24-fps frame
    assert fitted_size(fast) == prepare_init_clip(fast, 60.0).size == (64, 32)
    request = refine.refine_clip_request(fast, 60.0, None, None, "surf", width=128, height=64, denoise=0.5)
    assert (request.num_frames, request.width, request.height) == (124, 128, 64)


def test_a_clip_start_equals_its_latents_given_directly(pipe):
    from comfyui_h3.backend.pipelines.h3.extension_source import encode_soundtrack

    c = pipe.c
    wave = torch.randn(2, 124 * c.audio_rate // 24, generator=torch.Generator().manual_seed(2)) * 0.1
    clip = prepare_init_clip(_clip_frames(124, 64, 64, seed=3), 24.0, wave, c.audio_rate)
    geo = resolve_geometry(124, 64, 64, c.spatial_ratio, c.spatial_ratio * c.patch_size[2], c.frames_per_chunk,
                           c.latents_per_chunk)
    video = c.cond.encode_video(clip.frames)
    audio, _ = encode_soundtrack(c, wave, c.audio_rate, geo.audio_latents)
    direct = pipe.run(_req(init_video=video, init_audio=audio, denoise=0.6))
    from_clip = pipe.run(_req(init_clip=clip, denoise=0.6))
    assert torch.equal(direct.video_latents, from_clip.video_latents)
    assert torch.equal(direct.audio_latents, from_clip.audio_latents)
    with pytest.raises(RequestError, match="the request follows its clip"):
        _req(init_clip=clip, width=96, height=64).validate()
    with pytest.raises(RequestError, match="not both"):
        _req(init_clip=clip, init_video=video, denoise=0.6).validate()
    with pytest.raises(RequestError, match="must be an InitClip"):
        _req(init_clip=clip.frames).validate()


def test_rows_that_do_not_fit_are_refused_naming_what_fits():
    geo = resolve_geometry(243, 1088, 1920)
    video_rows = geo.latent_frames * (geo.latent_height // 2) * (geo.latent_width // 2)
    audio_rows = 2 * geo.audio_latents
    total = video_rows + audio_rows + 300
    need = row_fit.activation_bytes(total, 1)
    row_fit.check_rows_fit(geo, total, video_rows, audio_rows, need)  # exactly enough: runs
    row_fit.check_rows_fit(geo, total, video_rows, audio_rows, None)  # unknown (CPU): no check
    available = need * 7 // 10
    with pytest.raises(RequestError) as info:
        row_fit.check_rows_fit(geo, total, video_rows, audio_rows, available)
    text = str(info.value)
    assert "1920x1088, 243 frames" in text and "GiB" in text
    width, height = map(int, text.split("Fits: ")[1].split(" at this length")[0].split("x"))
    frames = int(text.split("; or ")[1].split(" frames")[0])
    smaller = resolve_geometry(243, height, width)
    rows = lambda g: g.latent_frames * (g.latent_height // 2) * (g.latent_width // 2) + 300 + 2 * g.audio_latents
    assert row_fit.activation_bytes(rows(smaller), 1) <= available
    larger = resolve_geometry(243, height + 32, round((height + 32) * 1920 / 1088 / 32) * 32)
    assert row_fit.activation_bytes(rows(larger), 1) > available
    shorter = resolve_geometry(frames, 1088, 1920)
    assert row_fit.activation_bytes(rows(shorter), 1) <= available < row_fit.activation_bytes(
        rows(resolve_geometry(frames + 17, 1088, 1920)), 1)
    with pytest.raises(RequestError, match=r"Fits: \d+x\d+ at this length\. "):  # shorter than 5 s: not offered
        row_fit.check_rows_fit(geo, total, video_rows, audio_rows, need // 3)
    # two ranks share the rows: the same request fits where one rank's half does
    row_fit.check_rows_fit(geo, total, video_rows, audio_rows, row_fit.activation_bytes(total, 2), degree=2)


def test_a_request_whose_rows_do_not_fit_is_refused_before_any_step(pipe, monkeypatch):
    steps = []
    monkeypatch.setattr(pipe.c, "dit_room", lambda dit: 1 << 20)  # 1 MiB free: nothing fits
    monkeypatch.setattr(pipe, "denoise", lambda *a, **k: steps.append(1))
    with pytest.raises(RequestError, match=r"64x64, 124 frames packs \d+ rows: .* free on cpu"):
        pipe.run(_req())
    assert steps == []


def test_refine_sizes_follow_the_target_onto_32s():
    assert refine.refine_size((1344, 768)) == (1920, 1088)  # short side 1088: 1080p
    assert refine.refine_size((768, 1344)) == (1088, 1920)
    assert refine.refine_size((1344, 768), "scale", scale=1.43) == (1920, 1088)
    assert refine.refine_size((128, 64), "scale", scale=1.43) == (192, 96)
    assert refine.refine_size((128, 64), "scale", scale=1.0) == (128, 64)
    assert refine.refine_size((1344, 768), "size", width=2560, height=1440) == (2560, 1440)
    with pytest.raises(RequestError, match="target must be"):
        refine.refine_size((1344, 768), "double")


@pytest.mark.slow
def test_a_refine_on_two_gloo_ranks_equals_one_rank(tiny_h3_dir, pipe, source):
    """Sequence parallelism runs the second pass as any request: 2 CPU ranks (gloo) == 1 rank."""
    request = refine.refine_request(source.video_latents, source.audio_latents, "surf", width=192, height=96,
                                    denoise=0.5, steps=4, seed=3, decode=False)
    single, got = pipe.run(request), on_two_gloo_ranks(tiny_h3_dir, request)
    assert ((got.video_latents - single.video_latents).norm() / single.video_latents.norm()).item() <= 1e-4
    assert torch.equal(got.audio_latents, source.audio_latents)
