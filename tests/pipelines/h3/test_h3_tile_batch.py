"""H3's clip decode with a clip's spatial tiles run as one batch (backend/pipelines/h3/tile_batch.py) against
diffusers' tile-by-tile `_decode_clip`: the tiny VAE with tiles small enough that a clip has 3 x 5 of them, in
float64 so that only summation order may differ; stitched in the right places, in passes of any size, and chosen by
default on CUDA devices only (the CPU keeps the reference's own decode, bit for bit)."""

import functools

import pytest
import torch

from comfyui_h3.backend.pipelines.h3.clip_graph import GraphedClipDecode, clip_decoder
from comfyui_h3.backend.pipelines.h3.stream_decode import StreamingVideoDecoder
from comfyui_h3.backend.pipelines.h3.tile_batch import decode_clip_tiles_batched, max_tiles_per_pass, tile_slices


@pytest.fixture
def vae(tiny_h3_dir):
    from diffusers import AutoencoderKLMiniMaxH3

    vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").to(torch.float64).eval()
    vae.enable_tiling(32, 32, 16, 16)  # 2x2-latent tiles overlapping by one latent: a 4x6-latent clip has 3x5
    return vae


def _clip(vae, seed, h=4, w=6):
    size = vae.tokens_chunk_size + vae.token_overlap
    return torch.randn(1, vae.config.latent_channels, size, h, w, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


def test_the_tiles_are_diffusers_layout(vae):
    rows, cols, y_overlaps, x_overlaps = tile_slices(vae, 4, 6)
    assert [(r.start, r.stop) for r in rows] == [(0, 2), (1, 3), (2, 4)]
    assert [(c.start, c.stop) for c in cols] == [(0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]
    assert y_overlaps == [16, 16] and x_overlaps == [16] * 4


@pytest.mark.parametrize("max_tiles", [None, 4, 1])
def test_batched_tiles_equal_the_tile_by_tile_decode(vae, max_tiles):
    z = _clip(vae, 1)
    with torch.no_grad():
        want = vae._decode_clip(z)
        got = decode_clip_tiles_batched(vae, z, max_tiles=max_tiles)
    assert got.shape == want.shape == (1, 3, got.shape[2], 64, 96)
    assert torch.allclose(got, want, rtol=0, atol=1e-12 * want.abs().max()), (got - want).abs().max()


def test_a_clip_of_one_tile_or_tiling_off_is_the_plain_decode(vae):
    z = _clip(vae, 2, h=2, w=2)
    with torch.no_grad():
        assert torch.equal(decode_clip_tiles_batched(vae, z), vae._decode_clip(z))
        vae.use_tiling = False
        z = _clip(vae, 3)
        assert torch.equal(decode_clip_tiles_batched(vae, z), vae._decode_clip(z))


def test_the_streamed_decode_with_batched_tiles_equals_the_whole_decode(vae):
    from comfyui_h3.backend.pipelines.h3.decode import decode_video, iter_decode_video

    z = torch.randn(1, vae.config.latent_channels, 17, 4, 6, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = decode_video(vae, z, "cpu")
        batched = torch.cat(list(iter_decode_video(vae, z, "cpu", batch_tiles=True)))
        plain = torch.cat(list(iter_decode_video(vae, z, "cpu")))
    assert torch.equal(plain, want)  # the CPU's default: the reference's own decode, bit for bit
    # uint8 frames: float64 summation order moves no level at this seed (a value on a rounding edge could move one)
    assert torch.equal(batched, want)


def test_batched_tiles_are_the_default_on_cuda_only(vae):
    assert clip_decoder(vae, "cpu") == vae._decode_clip
    assert clip_decoder(vae, "cpu", batch_tiles=True).func is decode_clip_tiles_batched
    cuda = clip_decoder(vae, "cuda:0")
    assert isinstance(cuda, functools.partial) and cuda.func is decode_clip_tiles_batched
    assert clip_decoder(vae, "cuda:0", batch_tiles=False) == vae._decode_clip
    graphed = clip_decoder(vae, "cuda:0", cuda_graphs=True)
    assert isinstance(graphed, GraphedClipDecode) and graphed.decode.func is decode_clip_tiles_batched
    assert StreamingVideoDecoder(vae, "cpu").decode_clip == vae._decode_clip


def test_passes_hold_what_they_are_given_and_the_cpu_all():
    z = torch.zeros(1)
    assert max_tiles_per_pass(z, 1797, limit=3) == 3 and max_tiles_per_pass(z, 1797, limit=0) == 1
    assert max_tiles_per_pass(z, 1797) >= 1 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (batched tiles vs tile by tile in bf16)")
def test_batched_tiles_on_the_gpu_stay_within_bf16_rounding(vae):
    vae = vae.to("cuda", torch.bfloat16)
    z = _clip(vae, 5).to("cuda", torch.bfloat16)
    with torch.no_grad():
        want, got = vae._decode_clip(z).float(), decode_clip_tiles_batched(vae, z).float()
    assert ((got - want).norm() / want.norm()) < 2e-2


def test_the_compiled_decoder_blocks_equal_eager(tiny_h3_dir):
    """The engine compiles the VAE's ViT blocks with the DiT's (components.compile_vae_decoder, on CUDA by default):
    the batched-tile decode through the compiled blocks computes what the eager one does (float32, Inductor on the
    CPU here)."""
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.components import compile_vae_decoder

    def load():
        vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").eval()
        vae.enable_tiling(32, 32, 16, 16)
        return vae

    eager, compiled = load(), load()
    compile_vae_decoder(compiled)
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in compiled.decoder.transformer_blocks)
    z = _clip(eager, 6).float()
    with torch.no_grad():
        want, got = decode_clip_tiles_batched(eager, z), decode_clip_tiles_batched(compiled, z)
    assert ((got - want).norm() / want.norm()) <= 1e-5
