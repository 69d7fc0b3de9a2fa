"""Spatial tiling of the SeedVR2 VAE (backend/models/seedvr2/vae_tiling.py): the tile plan and blend weights, one
tile equal to the plain pass bit for bit, the stated tolerance of tiled vs whole on the tiny VAE, and the wiring
(request validation, memory model and refusal naming the tile, the pipeline on the tiny files)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from repo_paths import FIXTURES, REPO
from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.models.seedvr2 import vae_tiling as vt
from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig
from comfyui_h3.backend.pipelines.seedvr2 import memory
from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

FIXTURE = FIXTURES / "seedvr2_vae.safetensors"

# The stated tolerance (rel = ||tiled - whole|| / ||whole||, fp32) on the tiny VAE with the official module's random
# init (the golden fixture's weights), 5 frames of 96x160, 64 px tiles sharing 32 px (6 tiles, smaller than the
# VAE's reach: a hard case). Measured: frame statistics (the default) encode mean 5.7e-2, decode 2.4e-2; the tiles'
# own statistics encode 8.6e-2, decode 1.0e-1. Bounds with margin:
ENCODE_TOL = 0.10
DECODE_TOL = 0.05


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module")
def vae():
    model = SeedVR2VAE(VAEConfig.tiny()).eval()
    model.load_state_dict({k[2:]: v.float() for k, v in load_file(str(FIXTURE)).items() if k.startswith("w.")})
    return model


def smooth_video(frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """[1, 3, F, H, W] in [-1, 1]: moving colour waves about the frame's size, plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(frames, dtype=torch.float32)[:, None, None]
    y = torch.linspace(0, 1, height)[None, :, None]
    x = torch.linspace(0, 1, width)[None, None, :]
    waves = [torch.sin(6.28 * (x * (1 + c) * 2 + y * (2 - c) * 1.5 + t * 0.05 * (c + 1))) for c in range(3)]
    video = torch.stack(waves, 0) * 0.8 + 0.1 * torch.randn(3, frames, height, width, generator=g)
    return video.clamp(-1, 1)[None]


# ---- plan and weights ----------------------------------------------------------------------------------------------

def test_tile_spans_cover_the_axis_with_the_overlap():
    for length in range(1, 50):
        for tile in range(2, 18):
            for overlap in range(tile):
                spans = vt.tile_spans(length, tile, overlap)
                assert spans[0][0] == 0 and spans[-1][1] == length
                sizes = {b - a for a, b in spans}
                assert len(sizes) == 1 and sizes.pop() <= tile
                for (a0, b0), (a1, b1) in zip(spans, spans[1:]):
                    assert a0 < a1 and b1 - b0 > 0 and b0 - a1 >= overlap
                n = len(spans)  # the fewest: n - 1 tiles of `tile` could not cover the axis
                assert n == 1 or (n - 1) * tile - (n - 2) * overlap < length


@pytest.mark.parametrize("scale", [1, 8])
def test_blend_weights_sum_to_one(scale):
    for length, tile, overlap in [(13, 8, 2), (17, 8, 4), (20, 8, 2), (7, 8, 2), (31, 6, 1), (40, 12, 11)]:
        spans = vt.tile_spans(length, tile, overlap)
        weights = vt.axis_weights(spans, scale)
        total = torch.zeros(length * scale, dtype=torch.float64)
        for (a, b), wt in zip(spans, weights):
            assert wt.shape == ((b - a) * scale,) and wt.dtype == torch.float32
            assert wt.min() >= 0 and wt.max() <= 1
            total[a * scale:b * scale] += wt.double()
        assert torch.allclose(total, torch.ones_like(total), rtol=0, atol=1e-6), (length, tile, overlap)
        for i in range(len(spans) - 1):  # the outer quarter of each side of an overlap gets weight 0
            lo, hi = spans[i + 1][0] * scale, spans[i][1] * scale
            quarter = int((hi - lo) * (1 - vt.RAMP) / 2)
            assert torch.all(weights[i][(hi - spans[i][0] * scale) - quarter:] == 0)
            assert torch.all(weights[i + 1][:quarter] == 0)


def test_row_blender_rebuilds_a_tensor_from_its_tiles():
    """2D: every tile's crop of a tensor, weighted and blended through the band (rows carried between tile rows),
    gives the tensor back; odd sizes, several rows and columns of tiles, tiles at the edges."""
    g = torch.Generator().manual_seed(0)
    for (h, w), tile, overlap, scale in [((13, 19), 6, 2, 1), ((9, 11), 4, 1, 8), ((5, 30), 7, 3, 2)]:
        rows, cols = vt.tile_spans(h, tile, overlap), vt.tile_spans(w, tile, overlap)
        x = torch.randn(1, 2, 3, h * scale, w * scale, generator=g)
        out = torch.full_like(x, float("nan"))
        blend = vt._RowBlender(out, rows, cols, scale, vt.RAMP)
        for i, (r0, r1) in enumerate(rows):
            for j, (c0, c1) in enumerate(cols):
                crop = x[..., r0 * scale:r1 * scale, c0 * scale:c1 * scale]
                blend.add(i, j, 0, crop[:, :, :2], blend.weight(i, j))  # frames in two pieces, as time slices
                blend.add(i, j, 2, crop[:, :, 2:], blend.weight(i, j))
            blend.row_done(i)
        torch.testing.assert_close(out, x, rtol=0, atol=1e-6)


# ---- tiled vs whole ------------------------------------------------------------------------------------------------

def test_one_tile_is_the_plain_pass_bitwise(vae):
    x = smooth_video(5, 32, 48)
    mean, logvar = vae.encode(x)
    out = vae.decode(mean)
    for tile in (48, 1024):  # a tile covering the frame: the plain pass itself
        m, lv = vt.tiled_encode(vae, x, tile)
        assert torch.equal(m, mean) and torch.equal(lv, logvar)
        assert torch.equal(vt.tiled_decode(vae, mean, tile), out)
    # the tiled path forced with one tile replays the VAE's own forward (split at the latent grid): bit for bit
    m, lv = vt.tiled_encode(vae, x, 1024, force=True, frame_stats=False)
    assert torch.equal(m, mean) and torch.equal(lv, logvar)
    assert torch.equal(vt.tiled_decode(vae, mean, 1024, force=True, frame_stats=False), out)
    # with frame statistics (fp64 sums of the one tile): the same up to rounding
    m, lv = vt.tiled_encode(vae, x, 1024, force=True)
    assert rel(m, mean) <= 1e-5 and rel(lv, logvar) <= 1e-5
    assert rel(vt.tiled_decode(vae, mean, 1024, force=True), out) <= 1e-5


@pytest.mark.slow
def test_tiled_vs_whole_within_the_stated_tolerance(vae):
    x = smooth_video(5, 96, 160)
    mean, logvar = vae.encode(x)
    out = vae.decode(mean)
    m, lv = vt.tiled_encode(vae, x, 64, overlap=32)
    dec = vt.tiled_decode(vae, mean, 64, overlap=32)
    assert m.shape == mean.shape and lv.shape == logvar.shape and dec.shape == out.shape
    assert rel(m, mean) <= ENCODE_TOL and rel(lv, logvar) <= ENCODE_TOL
    assert rel(dec, out) <= DECODE_TOL
    # the tiles' own GroupNorm statistics are what tiling gets most wrong: frame statistics are much closer
    own = vt.tiled_decode(vae, mean, 64, overlap=32, frame_stats=False)
    assert rel(own, out) >= 2 * rel(dec, out)


@pytest.mark.slow
def test_odd_latent_sizes_and_edge_tiles(vae):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, 16, 2, 13, 19, generator=g) * 0.5  # odd latent grid: 104 x 152 output pixels
    rows, cols = vt._plan(13, 19, 64, None, 8)
    assert len(rows) == 2 and len(cols) == 3 and rows[-1][1] == 13 and cols[-1][1] == 19
    whole = vae.decode(z)
    tiled = vt.tiled_decode(vae, z, 64)
    assert tiled.shape == whole.shape == (1, 3, 5, 104, 152) and torch.isfinite(tiled).all()
    assert rel(tiled, whole) <= 2 * DECODE_TOL  # the default 16 px overlap at 64 px tiles: a looser bound
    x = smooth_video(1, 104, 152)  # one frame, sides multiples of 8 but not of 16
    mean, _ = vae.encode(x)
    m, _ = vt.tiled_encode(vae, x, 64)
    assert m.shape == mean.shape == (1, 16, 1, 13, 19) and rel(m, mean) <= 2 * ENCODE_TOL


def test_bad_tiles_are_refused(vae):
    x = smooth_video(1, 32, 48)
    with pytest.raises(ValueError, match="multiples of 8"):
        vt.tiled_encode(vae, x, 20)
    with pytest.raises(ValueError, match="overlap smaller than the tile"):
        vt.tiled_decode(vae, torch.zeros(1, 16, 1, 4, 6), 16, overlap=16)
    with pytest.raises(ValueError, match="H and W multiples of 8"):
        vt.tiled_encode(vae, smooth_video(1, 36, 48), 16)
    with pytest.raises(ValueError, match=r"4n\+1 frames"):
        vt.tiled_encode(vae, smooth_video(2, 32, 48), 16)


# ---- request, memory, pipeline -------------------------------------------------------------------------------------

def _frames(n=5, h=32, w=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, 3), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("tile", [100, 64, -8, 8200])
def test_request_refuses_bad_vae_tiles(tile):
    with pytest.raises(RequestError, match=f"VAE tile {tile} must be 0"):
        UpscaleRequest(_frames(), vae_tile=tile).validate()


def test_memory_counts_the_tile_and_the_refusal_names_it():
    from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig

    config = DiTConfig.released("3b")
    size = (2160, 3840, 1080, 1920, 2, 2)  # a 1080p clip at x2 -> 4K, bf16
    whole = memory.batch_memory(config, 21, *size)
    tiled = memory.batch_memory(config, 21, *size, vae_tile=1024)
    assert tiled.dit == whole.dit and tiled.decode < whole.decode / 3 and tiled.encode < whole.encode / 2
    assert memory.batch_memory(config, 21, *size, vae_tile=4096) == whole  # a tile covering the frame: no tiling
    free = 139 * 1024**3  # one H200
    budget = free * memory.HEADROOM
    assert whole.decode > budget and tiled.peak < budget
    tile = memory.largest_vae_tile(21, 2160, 3840, 2, budget)
    assert tile % memory.VAE_TILE_STEP == 0
    UpscaleRequest(_frames(), vae_tile=tile).validate()  # what the message suggests is a valid request
    assert memory.largest_vae_tile(21, 2160, 3840, 2, 4 * 1024**3) == 0  # the whole-frame tensors alone: none fits
    assert memory.batch_memory(config, 21, *size, vae_tile=tile).peak <= budget
    assert memory.batch_memory(config, 21, *size, vae_tile=tile + memory.VAE_TILE_STEP).peak > budget
    with pytest.raises(RequestError, match=f"5 frames, the smallest batch \\(the VAE decode\\).*largest VAE tile that "
                                           f"fits a batch of 21 frames is vae_tile {tile}"):
        memory.check_fits(config, 21, 241, *size, free)
    with pytest.raises(RequestError, match="more GPUs do not help the VAE stage.*on one GPU \\(sp_degree 1\\)"):
        memory.check_fits(config, 0, 241, *size, free, world=2)
    assert memory.check_fits(config, 21, 241, *size, free, vae_tile=1024) == 21
    # a batch too large for the VAE: the message names the largest batch and the largest tile for the asked batch
    args = (1536, 2688, 768, 1344, 2, 2)
    best = memory.largest_batch(config, 241, *args, 80 * 1024**3)
    with pytest.raises(RequestError, match=f"largest batch that fits is {best} frames.*fits a batch of 241 frames "
                                           "is vae_tile"):
        memory.check_fits(config, 241, 241, *args, 80 * 1024**3)


@pytest.mark.slow
def test_pipeline_with_a_vae_tile_on_the_tiny_files(pipe):
    video = _frames(5, 32, 48)  # x4 -> 128 x 192
    plain = pipe.run(UpscaleRequest(video, scale=4.0, seed=1)).frames
    assert torch.equal(pipe.run(UpscaleRequest(video, scale=4.0, seed=1, vae_tile=192)).frames, plain)  # one tile
    tiled = pipe.run(UpscaleRequest(video, scale=4.0, seed=1, vae_tile=128)).frames  # 1 x 2 tiles
    assert tiled.shape == plain.shape == (5, 128, 192, 3)
    diff = (tiled.float() - plain.float()).abs()
    assert 0 < diff.mean() <= 2  # tiled, close (uint8 levels; measured 0.45)
    # each tile's own statistics: the one-pass tiled VAE (vae_tiling with frame_stats=False), another result
    own = pipe.run(UpscaleRequest(video, scale=4.0, seed=1, vae_tile=128, vae_tile_stats="tile"))
    assert not torch.equal(own.frames, tiled) and own.manifest["request"]["shapes"]["vae_tiles"]["stats"] == "tile"
    with pytest.raises(RequestError, match="VAE tile statistics 'rows' is not"):
        UpscaleRequest(video, vae_tile=128, vae_tile_stats="rows").validate()


def test_pipeline_refuses_a_vae_tile_on_several_ranks(pipe):
    from comfyui_h3.backend.pipelines.seedvr2.pipeline import SeedVR2Pipeline

    class Parallel:
        is_parallel, world, is_driver = True, 2, True

    class Runtime:
        parallel, attention = Parallel(), None

    with pytest.raises(RequestError, match="A VAE tile runs on one GPU; this engine has 2"):
        SeedVR2Pipeline(pipe.c, Runtime()).plan(UpscaleRequest(_frames(), vae_tile=128))


def test_node_and_cli_pass_the_vae_tile_and_refuse_bad_ones_before_any_work(tmp_path, capsys):
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.cli import _parser, main
    from comfyui_h3.cli_upscale import build_request
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    optional = H3SeedVR2Upscale.INPUT_TYPES()["optional"]
    assert list(optional)[-3:] == ["vae_tile", "scene_cuts", "vae_tile_stats"]  # appended in turn: saved workflows
    # keep their order
    kind, spec = optional["vae_tile"]
    assert kind == "INT" and spec["default"] == 0 and spec["step"] == 8 and "tooltip" in spec

    class Handle:
        class config:
            family = "seedvr2"

        def engine(self):
            pytest.fail("the engine was touched before the request was checked")

    with pytest.raises(ValueError, match="VAE tile 100 must be 0"):
        H3SeedVR2Upscale().upscale(Handle(), "scale", 2.0, 1080, 1920, 1080, 0, 8, "wavelet", 0, "pad",
                                   images=torch.rand(1, 32, 32, 3), vae_tile=100)
    src = write_mp4(str(tmp_path / "in.mp4"), _frames(5, 32, 48), 24)
    args = _parser().parse_args(["upscale", "--video", src, "--vae-tile", "512", "--out", str(tmp_path / "o.mp4")])
    assert build_request(args).vae_tile == 512
    assert main(["upscale", "--video", src, "--vae-tile", "100", "--out", str(tmp_path / "o.mp4")]) != 0
    assert "VAE tile 100 must be 0" in capsys.readouterr().err and not (tmp_path / "o.mp4").exists()


@pytest.mark.slow
def test_bench_stage_runs_tiny_on_the_cpu():
    """bench/seedvr2.py vae_tiling --tiny (the H200 run's code on the tiny VAE): a whole pass, then each tile with
    frame and with tile statistics, errors measured against the whole pass."""
    import json
    import os
    import subprocess
    import sys

    script = REPO / "bench" / "seedvr2.py"
    done = subprocess.run([sys.executable, str(script), "vae_tiling", "--tiny", "--height", "24", "--width", "40",
                           "--scale", "2", "--tiles", "32", "--overlap", "16", "--vae-frames", "5"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["tile"], r.get("frame_stats")) for r in lines] == [(0, None), (32, True), (32, False)]
    assert lines[0]["size"] == [48, 80] and lines[1]["tiles"] == [2, 4]
    for r in lines[1:]:
        assert 0 < r["mean_rel"] < 1 and 0 < r["video_rel"] < 1 and r["video_u8_max"] <= 255
