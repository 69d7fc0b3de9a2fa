"""Latent mask editing (task "edit"): the mask -> latent grid rules against hand-computed grids, source
normalisation and its errors, the invariants on the tiny model (kept latents are the source bit for bit, pixels
outside the grown mask are the source's encode-decode, inside changes, fractional masks blend monotonically, an
all-ones mask is t2va), and the node + CLI end to end."""

import json
import math
import os

import numpy as np
import pytest
import torch

from comfyui_h3.backend.media import grow_feather_invert
from comfyui_h3.backend.pipelines.h3.editing import (PRESETS, audio_row_mask, frame_to_latent, latent_frame_count,
                                                     mask_to_latent_grid, prepare_source, quantize_up, row_timesteps)
from comfyui_h3.backend.pipelines.h3.geometry import RequestError
from comfyui_h3.backend.pipelines.h3.request import H3Request


# -- pure rules -----------------------------------------------------------------------------------------------------
def test_frame_to_latent_follows_the_vae_chunks():
    # 17-frame chunks, 3 frames of left pad, stride 4: per chunk (1, 4, 4, 4, 4) frames; 17n+5 -> 5n+2
    want22 = [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 6, 6, 6, 6]
    assert frame_to_latent(22).tolist() == want22
    assert frame_to_latent(39)[34:].tolist() == [10, 11, 11, 11, 11]
    for n in range(1, 8):
        assert latent_frame_count(17 * n + 5) == 5 * n + 2


def test_mask_to_grid_time_and_space_by_hand():
    mask = torch.zeros(22, 64, 96)
    mask[5, 17, 40] = 1.0  # frame 5 -> latent 2; pixel (17, 40) -> latent cell (1, 2) -> token (0, 1)
    mask[17, 63, 95] = 0.3  # frame 17 -> latent 5 (a 1-frame latent); cell (3, 5); token (1, 2); 0.3 -> 77/256
    mask[20, 0, 0] = 0.001  # frame 20 -> latent 6; smallest level rounds UP to 1/256
    m = mask_to_latent_grid(mask, 16, (2, 2), 17, 4)
    assert m.restore.shape == (7, 4, 6) and m.token.shape == (7, 2, 3)
    want_restore = torch.zeros(7, 4, 6)
    want_restore[2, 1, 2] = 1.0
    want_restore[5, 3, 5] = 77 / 256
    want_restore[6, 0, 0] = 1 / 256
    assert torch.equal(m.restore, want_restore)
    want_token = torch.zeros(7, 2, 3)
    want_token[2, 0, 1], want_token[5, 1, 2], want_token[6, 0, 0] = 1.0, 77 / 256, 1 / 256
    assert torch.equal(m.token, want_token)
    rows = m.restore_rows((1, 2, 2), 24)  # patchify layout: [7*2*3 rows, 24*4]
    assert rows.shape == (42, 96)
    assert rows[2 * 6 + 1].unique().tolist() == [0.0, 1.0]  # token (0,1) of latent 2: one of its 4 cells
    assert m.token_rows()[2 * 6 + 1] == 1.0


def test_levels_timesteps_and_audio_rows():
    q = quantize_up(torch.tensor([0.0, 1e-6, 0.5, 0.50001, 0.999, 1.0]))
    assert q.tolist() == [0.0, 1 / 256, 0.5, 129 / 256, 1.0, 1.0]
    t = row_timesteps(torch.tensor([0.0, 0.5, 1.0]), 0.8)
    assert torch.allclose(t, torch.tensor([0.999, 0.6, 0.2]))
    a = audio_row_mask(5, 3, "keep")
    assert a.tolist() == [0, 0, 0, 1, 1] * 2  # channel-major; no source sound past latent 3 -> regenerated
    assert audio_row_mask(4, 4, "blend", 0.5).tolist() == [0.5] * 8
    assert audio_row_mask(2, 2, "regenerate").tolist() == [1.0] * 4
    with pytest.raises(RequestError, match="audio_mode"):
        audio_row_mask(2, 2, "mute")


def test_prepare_source_grows_and_feathers_once_by_the_one_definition():
    # step 4 is media/mask_raster's grow_feather_invert (H3 Mask Draw's), applied once at the canvas size
    frames = np.zeros((124, 64, 96, 3), np.uint8)
    mask = np.zeros((124, 64, 96), np.float32)
    mask[60, 30, 40] = 1.0
    mask[10:20, 5:15, 70:80] = 0.6
    src = prepare_source(frames, mask, 24.0, 6, 4)
    assert torch.equal(src.mask, grow_feather_invert(torch.from_numpy(mask), 6, 4))
    one = prepare_source(frames, mask[60], 24.0, 6, 4)  # a single frame: shaped once, then held
    assert torch.equal(one.mask, grow_feather_invert(torch.from_numpy(mask[60:61]), 6, 4).expand(124, -1, -1))
    with pytest.raises(RequestError, match="grow and feather"):
        prepare_source(frames, mask, 24.0, -1, 0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_keep_the_mask_fully_regenerated_with_the_soft_edge_around_it(name):
    p = PRESETS[name]
    lone = torch.zeros(1, 121, 121)
    lone[0, 60, 60] = 1.0  # a lone pixel: the hardest mask to keep whole
    blobs = (torch.rand((2, 121, 121), generator=torch.Generator().manual_seed(1)) > 0.995).float()
    for mask in (lone, blobs):
        out = grow_feather_invert(mask, p.grow, p.feather)
        assert out[mask == 1].eq(1).all(), name  # everything the mask regenerates stays fully regenerated
    row = grow_feather_invert(lone, p.grow, p.feather)[0, 60, 60:]  # outward: 1, the soft edge, then 0
    assert (row[:-1] >= row[1:]).all() and row[0] == 1 and row[-1] == 0
    assert 0 < row[p.grow] < 1  # the edge straddles the grown border ...
    reach = 3 * math.ceil(p.feather / 3)  # ... and ends where three box blurs of radius ceil(f / 3) stop reaching
    assert row[p.grow + reach] > 0 and row[p.grow + reach + 1:].eq(0).all()


def test_prepare_source_odd_size_and_rate():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (160, 70, 101, 3), dtype=np.uint8)  # 30 fps -> 128 frames at 24 -> cut to 124
    mask = np.zeros((160, 70, 101), np.float32)
    mask[100, 3 + 17, 2 + 40] = 1.0  # survives the centre crop (top 3, left 2) at (17, 40)
    src = prepare_source(frames, mask, 30.0, 0, 0)
    assert src.frames.shape == (124, 64, 96, 3) and src.mask.shape == (124, 64, 96)
    slot = int(np.floor(100 * 24 / 30 + 0.5))  # source frame 100 is held at 24-fps slot 80
    assert torch.nonzero(src.mask).tolist() == [[slot, 17, 40]]
    held = np.repeat(frames, np.diff(np.floor(np.arange(161) * 0.8 + 0.5).astype(int)), axis=0)
    assert np.array_equal(src.frames, held[:124, 3:67, 2:98])  # crop, never resample
    one = prepare_source(frames[:130], mask[100], 24.0, 0, 0)  # a single mask frame applies to every frame
    assert one.mask.shape == (124, 64, 96) and one.mask[:, 17, 40].eq(1).all()


@pytest.mark.parametrize("frames,mask,message", [
    ((124, 64, 96, 3), (124, 64, 90), "differs from the video"),
    ((124, 64, 96, 3), (100, 64, 96), "shorter than the video"),
    ((124, 64, 96, 3), (130, 64, 96), "longer than the video"),
    ((100, 64, 96, 3), (100, 64, 96), "at least 124 frames"),
])
def test_prepare_source_errors(frames, mask, message):
    with pytest.raises(RequestError, match=message):
        prepare_source(np.zeros(frames, np.uint8), np.zeros(mask, np.float32), 24.0, 0, 0)


def test_a_soundtrack_too_short_to_resample_is_an_empty_one():
    # 1 sample at 96 kHz is less than one at 32 kHz: the resampler gives nothing (it crashed on that); the edit's
    # source soundtrack is then missing, its rows regenerated
    from comfyui_h3.backend.pipelines.h3.editing import prepare_audio

    wave, valid = prepare_audio(torch.ones(2, 1), 96000, 32000, 1600)
    assert valid == 0 and torch.equal(wave, torch.zeros(2, 1600))


def test_request_validation():
    fr, m = np.zeros((124, 64, 96, 3), np.uint8), np.zeros((124, 64, 96), np.float32)
    assert H3Request(prompt="x", source_frames=fr, mask=m).task == "edit"
    with pytest.raises(RequestError, match="differs from the video"):
        H3Request(prompt="x", source_frames=fr, mask=m[:, :32]).validate()
    with pytest.raises(RequestError, match="both a source video and a mask"):
        H3Request(prompt="x", source_frames=fr).validate()
    with pytest.raises(RequestError, match="preset"):
        H3Request(prompt="x", source_frames=fr, mask=m, preset="erase").validate()


# -- the pipeline on the tiny model --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)


@pytest.fixture(scope="module")
def source():
    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:64, 0:96]
    base = np.stack([x * 2, y * 3, (x + y)], -1).astype(np.int64)
    frames = np.stack([(base + 3 * t + rng.integers(0, 20, base.shape)) % 256 for t in range(124)]).astype(np.uint8)
    wave = torch.from_numpy(rng.standard_normal((2, 32000 * 4)).astype(np.float32) * 0.1)  # shorter than the video
    mask = np.zeros((124, 64, 96), np.float32)
    mask[40:80, 20:40, 30:60] = 1.0
    return frames, wave, mask


def edit(pipeline, source, **kw):
    frames, wave, mask = source
    args = dict(prompt="a calm lake", steps=2, seed=3, source_frames=frames, source_audio=wave,
                source_sample_rate=32000, mask=mask, preset="inpaint", mask_grow=0, mask_feather=0)
    args.update(kw)
    return pipeline.run(H3Request(**args))


@pytest.mark.slow
def test_edit_keeps_the_source_outside_and_changes_inside(pipeline, source):
    from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
    from comfyui_h3.backend.pipelines.h3.decode import decode_frames_to_host

    r = edit(pipeline, source, mask_grow=6, mask_feather=4, audio_mode="keep")
    info = r.edit
    src_v, src_a = info["source_video_latents"], info["source_audio_latents"]
    assert torch.equal(src_v, pipeline.c.cond.encode_video(source[0]))
    keep = (info["restore_mask"] == 0)[None, None].expand_as(r.video_latents)
    assert 0.5 < keep.float().mean() < 1.0
    assert torch.equal(r.video_latents[keep], src_v[keep])  # bit for bit
    assert (r.video_latents[~keep] - src_v[~keep]).abs().mean() > 0.1
    # audio "keep": every row with source sound is the source; the 4-s source's missing tail is regenerated
    valid = 4 * 40
    assert torch.equal(r.audio_latents[:, :, :valid], src_a[:, :, :valid])
    assert not torch.equal(r.audio_latents[:, :, valid:], src_a[:, :, valid:])
    # pixels: outside the grown + feathered mask exactly the source's encode-decode; inside they change
    pmask = grow_feather_invert(torch.from_numpy(source[2]), 6, 4)
    geo = resolve_geometry(124, 64, 96)
    recon = decode_frames_to_host(pipeline.c.vae, src_v, pipeline.c.device, geo)
    out = pmask == 0
    assert torch.equal(r.frames[out], recon[out])
    inside = pmask == 1
    assert (r.frames[inside].float() - recon[inside].float()).abs().mean() > 2
    assert r.audio.shape == (2, round(124 / 24 * 40) * 800)  # 207 audio latents, hop 800


@pytest.mark.slow
def test_mask_draw_to_edit_shapes_the_mask_once(pipeline, source):
    """H3 Mask Draw -> H3 Edit: the restore mask is ONE application of the definition, whichever node applies it."""
    from comfyui_h3.nodes.edit import edit_request
    from comfyui_h3.nodes.mask_draw import H3MaskDraw
    from comfyui_h3.video_types import H3Video

    frames, wave, _ = source
    video = H3Video(torch.from_numpy(frames), 24, wave, 32000)
    state = json.dumps({"width": 96, "height": 64, "keyframes": [{"frame": 0, "shapes": [
        {"id": "r", "type": "rect", "x": 40, "y": 24, "w": 8, "h": 8}]}]})
    p, c = PRESETS["inpaint"], pipeline.c

    def restore(mask, **widgets):
        request = edit_request(video, mask, "inpaint", "a calm lake", 2, 3, **widgets)
        request.decode = False
        return pipeline.run(request).edit["restore_mask"]

    def grid(pixels):
        return mask_to_latent_grid(pixels, c.spatial_ratio, c.patch_size[1:], c.frames_per_chunk).restore

    drawn, = H3MaskDraw().draw(video, state)  # grow / feather 0, as the shipped workflows leave them
    once = grid(grow_feather_invert(drawn, p.grow, p.feather))
    twice = grid(grow_feather_invert(grow_feather_invert(drawn, p.grow, p.feather), p.grow, p.feather))
    assert not torch.equal(once, twice)  # the latent grid tells one application from two
    assert torch.equal(restore(drawn), once)  # the preset shapes the drawing, once
    shaped, = H3MaskDraw().draw(video, state, grow=p.grow, feather=p.feather)
    assert torch.equal(restore(shaped), once)  # shaped in Mask Draw: the preset adds nothing
    assert torch.equal(restore(shaped, mask_grow=p.grow, mask_feather=p.feather), twice)  # asked for twice: twice


def test_shipped_edit_workflows_let_the_preset_shape_the_mask():
    """Every shipped H3 Mask Draw / H3 Track Mask -> H3 Edit leaves the mask node's grow / feather at 0 and H3 Edit's
    at the preset's (-1): the mask is shaped once, by the preset the workflow names."""
    from comfyui_h3.templates import workflows_dir

    edits = 0
    for path in sorted(workflows_dir().glob("*.api.json")):
        api = json.loads(path.read_text())
        for node in api.values():
            if node["class_type"] != "H3_Edit":
                continue
            edits += 1
            source = api[node["inputs"]["mask"][0]]
            assert source["class_type"] in ("H3_MaskDraw", "H3_TrackMask"), path.name
            assert (source["inputs"]["grow"], source["inputs"]["feather"]) == (0, 0), path.name
            assert (node["inputs"]["mask_grow"], node["inputs"]["mask_feather"]) == (-1, -1), path.name
    assert edits == 7  # removal, replacement, inpainting, and the four Track Mask removals / replacements


@pytest.mark.slow
def test_fractional_mask_blends_monotonically(pipeline, source):
    frames, wave, mask = source
    dist, adist = [], []
    for level in (0.0, 0.25, 0.5, 1.0):
        r = edit(pipeline, source, mask=mask * level, decode=False, audio_mode="blend", audio_level=level)
        src = r.edit["source_video_latents"]
        region = (r.edit["restore_mask"] > 0)[None, None].expand_as(src) if level else None
        if level == 0.0:
            assert torch.equal(r.video_latents, src)  # nothing to regenerate: the source itself
            dist.append(0.0)
        else:
            dist.append((r.video_latents[region] - src[region]).norm().item())
        a_src = r.edit["source_audio_latents"][:, :, :160]
        adist.append((r.audio_latents[:, :, :160] - a_src).norm().item())
    assert dist == sorted(dist) and dist[1] > 0 and dist[-1] > dist[1]
    assert adist == sorted(adist) and adist[0] == 0.0 and adist[-1] > adist[1] > 0


@pytest.mark.slow
def test_all_ones_mask_is_t2va(pipeline, source):
    frames, wave, mask = source
    a = edit(pipeline, source, mask=np.ones_like(mask), audio_mode="regenerate", decode=False)
    b = pipeline.run(H3Request(prompt="a calm lake", steps=2, seed=3, num_frames=124, height=64, width=96,
                               decode=False))
    assert torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


@pytest.mark.slow
def test_an_edit_at_a_strength_starts_from_its_source(pipeline, source):
    """denoise < 1: the masked region is re-made from the noised source. With an all-ones mask that is a start from
    the source's latents at the same strength (strength.py) bit for bit; kept cells stay the source's."""
    frames, wave, mask = source
    whole = edit(pipeline, source, mask=np.ones_like(mask), audio_mode="regenerate", decode=False, denoise=0.5)
    src_v, src_a = whole.edit["source_video_latents"], whole.edit["source_audio_latents"]
    direct = pipeline.run(H3Request(prompt="a calm lake", steps=2, seed=3, num_frames=124, height=64, width=96,
                                    decode=False, init_video=src_v, init_audio=src_a, denoise=0.5))
    assert torch.equal(whole.video_latents, direct.video_latents)
    assert torch.equal(whole.audio_latents, direct.audio_latents)
    partial = edit(pipeline, source, decode=False, denoise=0.5, steps=4)
    full = edit(pipeline, source, decode=False, steps=4)
    keep = (partial.edit["restore_mask"] == 0)[None, None].expand_as(partial.video_latents)
    assert torch.equal(partial.video_latents[keep], src_v[keep])
    assert not torch.equal(partial.video_latents[~keep], full.video_latents[~keep])
    # nearer the source inside the mask than the edit from noise is
    assert (partial.video_latents[~keep] - src_v[~keep]).abs().mean() < (full.video_latents[~keep]
                                                                         - src_v[~keep]).abs().mean()


# -- node + CLI through the engine (the request is pickled to a worker) -------------------------------------------
@pytest.mark.slow
def test_node_and_cli_edit(tmp_path, tiny_h3_dir, source):
    import av

    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.cli import main
    from comfyui_h3.nodes.edit import H3Edit
    from comfyui_h3.types import H3EngineHandle
    from comfyui_h3.video_types import H3Video
    from PIL import Image

    frames, wave, mask = source
    handle = H3EngineHandle(h3_config(model_dir=str(tiny_h3_dir), device="cpu", dtype="float32"))
    out = H3Edit().edit(handle, H3Video(torch.from_numpy(frames), 24, wave, 32000), torch.from_numpy(mask[60]),
                        "replace", "a red boat", 2, 0)
    video, audio, latents = out["result"]
    assert video.get_dimensions() == (96, 64) and video.get_frame_count() == 124
    assert audio["waveform"].shape[:2] == (1, 2) and "preset replace" in out["ui"]["text"][0]

    src = write_mp4(str(tmp_path / "in.mp4"), torch.from_numpy(frames), 24, wave, 32000)
    Image.fromarray((mask[60] * 255).astype(np.uint8)).save(tmp_path / "mask.png")
    dst = tmp_path / "edited.mp4"
    rc = main(["edit", "--model", str(tiny_h3_dir), "--video", src, "--mask", str(tmp_path / "mask.png"),
               "--mode", "removal", "--prompt", "an empty lake", "--steps", "2", "--seed", "1", "--dtype", "float32",
               "--out", str(dst), "--save-latents", str(tmp_path / "lat.safetensors")])
    assert rc == 0 and dst.is_file() and os.path.isfile(tmp_path / "lat.safetensors")
    with av.open(str(dst)) as f:
        kinds = sorted(s.type for s in f.streams)
        vs = f.streams.video[0]
        assert (vs.width, vs.height) == (96, 64)
    assert kinds == ["audio", "video"]
    np.savez(tmp_path / "bad.npz", mask=np.zeros((10, 64, 96), np.float32))
    rc = main(["edit", "--model", str(tiny_h3_dir), "--video", src, "--mask", str(tmp_path / "bad.npz"),
               "--prompt", "x", "--steps", "2", "--out", str(tmp_path / "bad.mp4")])
    assert rc == 2 and not (tmp_path / "bad.mp4").exists()
