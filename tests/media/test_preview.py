"""Live previews while sampling (backend/pipelines/h3/preview.py and the path to ComfyUI's preview channel): the
projection and the contact sheet (shape, dtype, range, determinism, exact frames), the driver capturing at the
interval, the worker sending previews with its progress (none when off), and the node handing them to ComfyUI's
ProgressBar as its preview image. The real ComfyUI lane: tests/lane/test_comfyui_previews.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
from comfyui_h3.backend.pipelines.h3.layout import build_layout, patchify
from comfyui_h3.backend.pipelines.h3.preview import (FIT_SIZE, LatentRGB, StepPreview, contact_sheet, fit_colours,
                                                     ridge_fit, rows_to_frames, sheet_columns, strip_frames,
                                                     target_grid)
from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest, H3Request, RequestError

PATCH = (1, 2, 2)


def test_strip_frames_spread_over_the_clip():
    assert strip_frames(61) == [0, 20, 40, 60]  # the 10-s shape's 61 latent frames
    assert strip_frames(37) == [0, 12, 24, 36]
    assert strip_frames(3) == [0, 1, 2] and strip_frames(1) == [0] and strip_frames(0) == []
    assert strip_frames(61, 1) == [0]


@pytest.mark.parametrize("width,height", [(1344, 768), (96, 64), (128, 64), (192, 64), (64, 64), (768, 1344),
                                          (64, 128), (64, 192), (1000, 40)])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_sheet_keeps_the_clips_orientation(width, height, count):
    """The live preview is laid out like the clip it previews: landscape frames make a landscape sheet, portrait ones
    a portrait sheet (a 2:1 clip's 4 frames once came as a 1 x 4 portrait strip, 256x512 on the node); 4 frames
    make 2 x 2, the clip's own aspect, as a KSampler preview has its image's."""
    frame_h, frame_w = height // 16, width // 16  # the latent grid the sheet is drawn at
    sheet = contact_sheet(torch.rand(count, frame_h, frame_w, 3))
    sheet_h, sheet_w = sheet.shape[:2]
    if width > height:
        assert sheet_w > sheet_h, (width, height, count, tuple(sheet.shape))
    elif width < height:
        assert sheet_w < sheet_h, (width, height, count, tuple(sheet.shape))
    if count == 4:
        assert sheet_columns(4, frame_h, frame_w) == 2 and sheet_w * frame_h == sheet_h * frame_w


def test_sheet_of_a_short_clip_leaves_its_empty_cell_black():
    frames = torch.stack([torch.full((4, 7, 3), v) for v in (0.2, 0.6, 1.0)])  # 3 latent frames of a landscape clip
    sheet = contact_sheet(frames)
    assert tuple(sheet.shape) == (8, 14, 3)  # 2 x 2
    assert sheet[0, 0, 0] == 51 and sheet[0, 7, 0] == 153 and sheet[4, 0, 0] == 255 and not sheet[4:, 7:].any()


def test_rows_to_frames_inverts_patchify():
    latents = torch.randn(1, 24, 5, 6, 8)
    frames = rows_to_frames(patchify(latents, PATCH), 5, 3, 4, 24, PATCH)
    assert torch.equal(frames, latents[0].permute(1, 2, 3, 0))  # [T, H, W, C]


def test_contact_sheet_layout_dtype_range_and_downscale():
    rgb = torch.stack([torch.full((6, 10, 3), v) for v in (0.0, 0.25, 1.5, -2.0)])  # out-of-range values clamp
    sheet = contact_sheet(rgb)
    assert sheet.dtype == torch.uint8 and tuple(sheet.shape) == (12, 20, 3)
    assert sheet[0, 0, 0] == 0 and sheet[0, 10, 0] == 64 and sheet[6, 0, 0] == 255 and sheet[6, 10, 0] == 0
    big = contact_sheet(torch.rand(4, 200, 300, 3), max_side=100)
    assert tuple(big.shape) == (2 * 67, 2 * 100, 3)


def test_ridge_fit_recovers_a_linear_map():
    gen = torch.Generator().manual_seed(3)
    w, b = torch.randn(24, 3, generator=gen), torch.randn(3, generator=gen)
    x = torch.randn(500, 24, generator=gen)
    got_w, got_b = ridge_fit(x, x @ w + b, ridge=0.0)
    assert torch.allclose(got_w, w, atol=1e-4) and torch.allclose(got_b, b, atol=1e-4)


def test_fit_inverts_a_linear_encoder():
    """An encoder that writes each clip's colour through a known [24, 3] map: the fitted projection gives the colour
    back (the fit pairs every latent cell of clip k with colour k)."""
    gen = torch.Generator().manual_seed(0)
    mix, offset = torch.randn(24, 3, generator=gen), torch.randn(24, generator=gen)
    calls = []

    def encode(pixels):
        calls.append(tuple(pixels.shape))
        assert pixels.dtype == torch.uint8
        colour = pixels[:, :, 0, 0, 0].float() / 255.0  # [B, 3]
        z = colour @ mix.T + offset  # [B, 24]
        return z[:, :, None, None, None].expand(-1, -1, 7, FIT_SIZE // 16, FIT_SIZE // 16)

    rgb = LatentRGB.fit(encode, frames=22)
    assert calls[0] == (8, 3, 22, FIT_SIZE, FIT_SIZE) and len(calls) == 4  # 32 colours in batches of 8
    colours = (fit_colours() * 255).round() / 255
    back = (colours @ mix.T + offset) @ rgb.weight + rgb.bias
    assert (back - colours).abs().max() < 2e-2  # exact but for the small ridge


def _layout(frames=124, height=64, width=96, keyframes=()):
    geo = resolve_geometry(frames, height, width)
    return geo, build_layout(torch.ones(3, dtype=torch.long), geo, PATCH, keyframes)


def test_target_grid_of_a_layout():
    geo, layout = _layout()
    assert target_grid(layout) == (geo.latent_frames, geo.latent_height // 2, geo.latent_width // 2)
    geo, layout = _layout(keyframes=("first", "last"))  # condition rows are not the target's
    assert target_grid(layout) == (geo.latent_frames, geo.latent_height // 2, geo.latent_width // 2)


def test_capture_is_the_projection_of_x0_of_the_chosen_frames():
    geo, layout = _layout(keyframes=("first",))
    gen = torch.Generator().manual_seed(1)
    rgb = LatentRGB(torch.randn(24, 3, generator=gen) * 0.3, torch.full((3,), 0.5))
    target = torch.randn(1, 24, geo.latent_frames, geo.latent_height, geo.latent_width, generator=gen)
    velocity = torch.randn(target.shape, generator=gen)
    t = 0.3
    x_in = target - (1 - t) * velocity  # so that x0 = x_in + (1 - t) v = target
    preview = StepPreview(rgb, PATCH, every=1)
    preview.begin(layout, "cpu")
    assert preview.due()
    sheet = preview.capture(patchify(x_in, PATCH), patchify(velocity, PATCH),
                            torch.full((layout.video_indices.numel() - layout.num_condition_video_rows,), t))
    assert isinstance(sheet, np.ndarray) and sheet.dtype == np.uint8
    h, w = geo.latent_height, geo.latent_width
    assert sheet.shape == (2 * h, 2 * w, 3)
    frames = strip_frames(geo.latent_frames)
    want = ((target[0, :, frames].permute(1, 2, 3, 0) @ rgb.weight + rgb.bias).clamp(0, 1) * 255).round()
    got = torch.from_numpy(sheet).reshape(2, h, 2, w, 3).permute(0, 2, 1, 3, 4).reshape(4, h, w, 3).float()
    assert (got - want).abs().max() <= 1  # float rounding of x0 at most one level


def test_due_counts_steps_over_the_request():
    geo, layout = _layout()
    preview = StepPreview(LatentRGB(torch.zeros(24, 3), torch.zeros(3)), PATCH, every=3)
    preview.begin(layout, "cpu")
    assert [preview.due() for _ in range(4)] == [False, False, True, False]
    preview.begin(layout, "cpu")  # an extension's next window goes on counting
    assert [preview.due() for _ in range(3)] == [False, True, False]
    with pytest.raises(ValueError, match="at least 1"):
        StepPreview(LatentRGB(torch.zeros(24, 3), torch.zeros(3)), PATCH, every=0)


@pytest.mark.parametrize("every", [-1, 1.5, True, "2"])
def test_requests_refuse_a_bad_interval(every):
    with pytest.raises(RequestError, match="preview_every"):
        H3Request(prompt="x", preview_every=every).validate()
    with pytest.raises(RequestError, match="preview_every"):
        H3ExtendRequest(prompts=["x"], added_frames=17, source_video_latents=torch.zeros(1, 24, 7, 4, 4),
                        source_audio_latents=torch.zeros(2, 32, 10), preview_every=every).validate()


# ---- through the pipeline and the worker (tiny model, CPU) ----------------------------------------------------------

def _request(**kw):
    base = dict(prompt="a kite over a beach", num_frames=124, steps=4, seed=3, width=96, height=64, decode=False)
    base.update(kw)
    return H3Request(**base)


@pytest.fixture(scope="module")
def pipe(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)


@pytest.mark.slow
def test_pipeline_previews_at_the_interval_and_nothing_when_off(pipe):
    seen = []

    def on_step(done, total, preview=None):
        seen.append((done, None if preview is None else preview.shape))

    pipe._latent_rgb = None
    plain = pipe.run(_request(), on_step=lambda done, total: None)  # off: on_step never gets a preview argument
    assert pipe._latent_rgb is None  # and nothing was fitted
    got = pipe.run(_request(preview_every=2), on_step=on_step)
    assert seen == [(1, None), (2, (8, 12, 3)), (3, None), (4, (8, 12, 3))]  # 2 x 2 frames of 4 x 6 latents
    assert torch.equal(got.video_latents, plain.video_latents)  # previews never touch the state
    assert pipe.preview is None  # the request's previews end with it
    fitted = pipe._latent_rgb
    assert fitted.weight.shape == (24, 3) and torch.isfinite(fitted.weight).all()
    again = LatentRGB.fit(lambda px: pipe.c.cond.encode_pixels(px, sample=False),
                          pipe.c.frames_per_chunk + pipe.c.latents_per_chunk)
    assert torch.equal(again.weight, fitted.weight) and torch.equal(again.bias, fitted.bias)  # deterministic


@pytest.mark.slow
def test_extension_previews_count_over_its_windows(pipe):
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    video = np.random.default_rng(1).integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    seen = []
    pipe.preview = StepPreview(LatentRGB(torch.zeros(24, 3), torch.full((3,), 0.5)), PATCH, every=2)
    try:
        run_extend(pipe, H3ExtendRequest(prompts=["waves"], added_frames=68, window_frames=56, overlap_frames=22,
                                         source_frames=video, steps=1, seed=2),
                   on_step=lambda done, total, preview=None: seen.append((done, total, preview is not None)))
    finally:
        pipe.preview = None
    assert seen == [(1, 2, False), (2, 2, True)]  # one step per window; the second window's step is the 2nd


@pytest.mark.slow
def test_edit_previews(pipe):
    from comfyui_h3.backend.pipelines.h3.tasks.edit import run_edit

    frames = np.random.default_rng(2).integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    mask = np.zeros((124, 64, 96), np.float32)
    mask[:, 16:48, 32:64] = 1
    seen = []
    pipe.preview = StepPreview(LatentRGB(torch.zeros(24, 3), torch.full((3,), 0.5)), PATCH, every=1)
    try:
        run_edit(pipe, _request(steps=2, source_frames=frames, mask=mask, preset="removal"),
                 on_step=lambda done, total, preview=None: seen.append(None if preview is None else preview.shape))
    finally:
        pipe.preview = None
    assert seen == [(8, 12, 3), (8, 12, 3)]


@pytest.mark.slow
def test_worker_sends_previews_with_its_progress(tiny_h3_dir):
    """Through the engine's worker process: previews ride the progress messages of steps 2 and 4 (every 2); with
    preview_every 0 no progress call carries one."""
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    engine = Engine(h3_config(str(tiny_h3_dir), dtype="float32", cpu_threads=1))
    try:
        seen = []
        engine.generate(_request(preview_every=2),
                        progress=lambda done, total, **kw: seen.append((done, kw.get("preview"))))
        assert [done for done, _ in seen] == [1, 2, 3, 4]
        assert [done for done, p in seen if p is not None] == [2, 4]
        sheet = seen[1][1]
        assert isinstance(sheet, np.ndarray) and sheet.dtype == np.uint8 and sheet.shape == (8, 12, 3)
        plain = []
        engine.generate(_request(), progress=lambda done, total, **kw: plain.append(kw))
        assert plain == [{}] * 4
    finally:
        engine.shutdown()


# ---- the node side: ComfyUI's preview setting and its ProgressBar ----------------------------------------------------

class _Method:
    def __init__(self, value):
        self.value = value


@pytest.fixture
def comfy_args(monkeypatch):
    """A fake `comfy.cli_args` (ComfyUI's parsed flags: preview_method is an enum, set per prompt by the frontend)."""
    import sys
    import types

    module = types.ModuleType("comfy.cli_args")
    module.args = types.SimpleNamespace(preview_method=_Method("none"), preview_size=384)
    monkeypatch.setitem(sys.modules, "comfy.cli_args", module)
    monkeypatch.delenv("COMFYUI_H3_PREVIEW_EVERY", raising=False)
    monkeypatch.delenv("COMFYUI_H3_COMFY", raising=False)
    return module.args


def test_preview_interval_follows_comfyui_preview_method(comfy_args, monkeypatch):
    from comfyui_h3 import comfy_services as services

    assert services.preview_every() == 0  # ComfyUI's default method: none
    for method in ("auto", "latent2rgb", "taesd"):
        comfy_args.preview_method = _Method(method)
        assert services.preview_every() == 1
    monkeypatch.setenv("COMFYUI_H3_PREVIEW_EVERY", "5")
    assert services.preview_every() == 5
    monkeypatch.setenv("COMFYUI_H3_PREVIEW_EVERY", "0")
    assert services.preview_every() == 0
    for bad in ("two", "-1", "1.5"):
        monkeypatch.setenv("COMFYUI_H3_PREVIEW_EVERY", bad)
        with pytest.raises(ValueError, match="COMFYUI_H3_PREVIEW_EVERY"):
            services.preview_every()
    comfy_args.preview_method = _Method("none")
    assert services.preview_every() == 0  # off wins, whatever the interval
    image = services.preview_image(np.zeros((8, 12, 3), np.uint8))
    assert image[0] == "JPEG" and image[1].size == (12, 8) and image[1].mode == "RGB" and image[2] == 384


def test_preview_is_off_headless(monkeypatch):
    import sys

    from comfyui_h3 import comfy_services as services

    monkeypatch.delitem(sys.modules, "comfy.cli_args", raising=False)
    assert services.preview_every() == 0


def test_run_engine_hands_previews_to_comfyui_progress_bar(comfy_args, monkeypatch):
    from comfyui_h3.nodes import sample as sample_node

    comfy_args.preview_method = _Method("auto")
    updates, asked = [], []

    class Reporter:
        def __init__(self, *args, **kwargs):
            pass

        def set_text(self, text):
            pass

        def update_absolute(self, value, total=None, preview=None):
            updates.append((value, total, preview))

    class Engine:
        started = True

        def generate(self, request, progress, should_cancel):
            asked.append(request.preview_every)
            progress(1, 2)
            progress(2, 2, preview=np.full((4, 6, 3), 9, np.uint8))
            return "the result"

    class Handle:
        def engine(self):
            return Engine()

    class Request:
        preview_every = 0

        def validate(self):
            pass

    monkeypatch.setattr(sample_node.services, "ProgressReporter", Reporter)
    assert sample_node.run_engine(Handle(), Request(), 2, node_id="5") == "the result"
    assert asked == [1]
    assert updates[0] == (1, 2, None)
    value, total, (kind, image, size) = updates[1]
    assert (value, total, kind, size) == (2, 2, "JPEG", 384) and image.size == (6, 4)
    assert image.getpixel((0, 0)) == (9, 9, 9)


@pytest.mark.slow
def test_bench_dry_run():
    """bench/preview_cost.py --tiny: every part of the H200 benchmark runs (tiny config and shape, CPU), so a GPU
    run does not fail on a slip in the script."""
    import json
    import os
    import subprocess
    import sys

    repo = REPO_DIR
    done = subprocess.run([sys.executable, os.path.join(repo, "bench", "preview_cost.py"), "--tiny", "--iters", "1",
                           "--preview-iters", "2"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert result["bench"] == "preview_cost" and result["sheet_shape"] == [8, 12, 3]
    assert result["step_ms_off"] > 0 and result["step_ms_on"] > 0 and result["preview_ms"] > 0
    assert result["fit_vae"] == "tiny" and result["fit_s"] > 0
