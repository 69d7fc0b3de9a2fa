"""Latent mask editing (task "edit"): the mask -> latent grid rules against hand-computed grids, source
normalisation and its errors, the invariants on the tiny model (kept latents are the source bit for bit, pixels
outside the grown mask are the source's encode-decode, inside changes, fractional masks blend monotonically, an
all-ones mask is t2va), and the node + CLI end to end."""

import os

import numpy as np
import pytest
import torch

from comfyui_h3.backend.pipelines.h3.editing import (audio_row_mask, frame_to_latent, grow_and_feather,
                                                     latent_frame_count, mask_to_latent_grid, prepare_source,
                                                     quantize_up, row_timesteps)
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


def test_grow_and_feather():
    m = torch.zeros(1, 21, 21)
    m[0, 10, 10] = 1
    g = grow_and_feather(m, 2, 0)
    assert g[0, 8:13, 8:13].eq(1).all() and g.sum() == 25
    f = grow_and_feather(m, 2, 4)
    assert f[0, 8:13, 8:13].eq(1).all()  # the grown area stays fully regenerated
    assert 0 < f[0, 10, 14] < 1 and f[0, 10, 0] == 0 and f[0, 10, 13] >= f[0, 10, 14]


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


def test_edit_keeps_the_source_outside_and_changes_inside(pipeline, source):
    from comfyui_h3.backend.pipelines.h3.editing import grow_and_feather as gf
    from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
    from comfyui_h3.backend.pipelines.h3.pipeline import decode_frames_to_host

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
    pmask = gf(torch.from_numpy(source[2]), 6, 4)
    geo = resolve_geometry(124, 64, 96)
    recon = decode_frames_to_host(pipeline.c.vae, src_v, pipeline.c.device, geo)
    out = pmask == 0
    assert torch.equal(r.frames[out], recon[out])
    inside = pmask == 1
    assert (r.frames[inside].float() - recon[inside].float()).abs().mean() > 2
    assert r.audio.shape == (2, round(124 / 24 * 40) * 800)  # 207 audio latents, hop 800


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


def test_all_ones_mask_is_t2va(pipeline, source):
    frames, wave, mask = source
    a = edit(pipeline, source, mask=np.ones_like(mask), audio_mode="regenerate", decode=False)
    b = pipeline.run(H3Request(prompt="a calm lake", steps=2, seed=3, num_frames=124, height=64, width=96,
                               decode=False))
    assert torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


# -- node + CLI through the engine (the request is pickled to a worker) -------------------------------------------
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
