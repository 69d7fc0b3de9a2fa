"""The video VAE's clips replayed from a CUDA graph (backend/pipelines/h3/clip_graph.py).

On the CPU a stand-in graph models what matters about CUDA graphs: a capture records the work without producing
values, a replay reruns it on the captured input buffer and writes the captured output buffer. Those tests pin the
wrapper's contract: every result equals the eager decode of its own input, earlier results are not overwritten by
later replays, a new shape is captured again, and a failed capture falls back to eager. The GPU test checks the real
graph bit for bit against the eager decode of the tiny VAE."""

import warnings

import pytest
import torch

from comfyui_h3.backend.pipelines.h3 import clip_graph
from comfyui_h3.backend.pipelines.h3.clip_graph import GraphedClipDecode, clip_decoder
from comfyui_h3.backend.pipelines.h3.tile_batch import decode_clip_tiles_batched


class FakeGraph:
    capturing = None  # the graph being captured: decode() registers its work there instead of computing

    def __init__(self):
        self.work = []

    def replay(self):
        for step in self.work:
            step()


def fake_capture(fn, static_in):
    graph = FakeGraph()
    FakeGraph.capturing = graph
    try:
        return graph, fn(static_in)
    finally:
        FakeGraph.capturing = None


def stand_in_decode(z):
    """A clip decoder: eager it computes; under capture it returns an unset buffer and records how to fill it."""
    if FakeGraph.capturing is None:
        return torch.cat([z * 2 + 1, z.square()], dim=1)
    out = torch.full((z.shape[0], 2 * z.shape[1], *z.shape[2:]), float("nan"))
    FakeGraph.capturing.work.append(lambda: out.copy_(torch.cat([z * 2 + 1, z.square()], dim=1)))
    return out


@pytest.fixture
def fake_graphs(monkeypatch):
    monkeypatch.setattr(clip_graph, "capture_graph", fake_capture)


def test_every_clip_equals_its_eager_decode_and_earlier_results_stay(fake_graphs):
    decode = GraphedClipDecode(stand_in_decode)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 3, 5, 4, 6, generator=gen) for _ in range(6)]
    outputs = [decode(z) for z in inputs]
    for z, out in zip(inputs, outputs):  # compared after all calls: a replay must not overwrite an earlier result
        assert torch.equal(out, stand_in_decode(z))
    assert (decode.captures, decode.replays) == (1, 5)  # clip 1 eager; clip 2 captured, then replayed like 3-6


def test_a_new_shape_runs_eagerly_once_then_is_captured_again(fake_graphs):
    decode = GraphedClipDecode(stand_in_decode)
    a, b = torch.randn(1, 3, 5, 4, 6), torch.randn(1, 3, 2, 4, 6)
    for z in (a, a, b, b, b, a):
        assert torch.equal(decode(z), stand_in_decode(z))
    assert decode.captures == 2 and decode.replays == 3  # a: captured, b: eager then captured, a again: eager
    decode.release()
    assert torch.equal(decode(a), stand_in_decode(a)) and decode.replays == 3  # released: eager again first


def test_a_failed_capture_falls_back_to_eager_with_a_warning(monkeypatch):
    def refusing(fn, static_in):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(clip_graph, "capture_graph", refusing)
    decode = GraphedClipDecode(stand_in_decode)
    z = torch.randn(1, 3, 5, 4, 6)
    assert torch.equal(decode(z), stand_in_decode(z))
    with pytest.warns(RuntimeWarning, match="decoding eagerly"):
        assert torch.equal(decode(z), stand_in_decode(z))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once; eager from then on
        assert torch.equal(decode(z), stand_in_decode(z))
    assert decode.failed and decode.captures == 0


def test_clip_decoder_graphs_on_request_and_on_cuda_devices_only(tiny_h3_dir):
    from diffusers import AutoencoderKLMiniMaxH3

    vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").eval()
    assert clip_decoder(vae, "cpu", cuda_graphs=True) == vae._decode_clip
    graphed = clip_decoder(vae, "cuda:0", cuda_graphs=True)
    assert isinstance(graphed, GraphedClipDecode) and graphed.decode.func is decode_clip_tiles_batched
    assert not isinstance(clip_decoder(vae, "cuda:0"), GraphedClipDecode)  # off by default


def test_the_decode_uses_the_graphed_clips_and_frees_them(tiny_h3_dir, fake_graphs, monkeypatch):
    """iter_decode_video with graphs on (forced on the CPU here: the stand-in graph replays the real tiny VAE's clips
    by rerunning the decode on the captured input): the frames equal the whole decode bit for bit, and the graph is
    released at the end."""
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3 import decode as decode_module
    from comfyui_h3.backend.pipelines.h3.decode import decode_video, iter_decode_video

    vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").eval()
    inner = vae._decode_clip
    monkeypatch.setattr(decode_module, "clip_decoder",  # graphs on the CPU: the stand-in's
                        lambda vae, device, cuda_graphs, batch_tiles: GraphedClipDecode(vae._decode_clip) if cuda_graphs
                        else vae._decode_clip)

    def recordable(z):  # the real clip decode, recorded as a graph records it
        if FakeGraph.capturing is None:
            return inner(z)
        out = torch.full_like(inner(z), float("nan"))
        FakeGraph.capturing.work.append(lambda: out.copy_(inner(z)))
        return out

    vae._decode_clip = recordable
    releases, release = [], GraphedClipDecode.release
    monkeypatch.setattr(GraphedClipDecode, "release",
                        lambda self: releases.append((self.captures, self.replays, self._graph)) or release(self))
    z = torch.randn(1, vae.config.latent_channels, 17, 4, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        chunks = list(iter_decode_video(vae, z, "cpu", cuda_graphs=True))
        vae._decode_clip = inner
        assert torch.equal(torch.cat(chunks), decode_video(vae, z, "cpu"))
    captures, replays, graph = releases[-1]  # the release when the decode ended (the first: before the capture)
    assert captures == 1 and replays >= 2 and isinstance(graph, FakeGraph)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the real graph capture)")
def test_cuda_graph_decode_equals_eager_bit_for_bit(tiny_h3_dir):
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.decode import iter_decode_video

    vae = AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae").to("cuda", torch.bfloat16).eval()
    for latent_frames in (9, 17):
        z = torch.randn(1, vae.config.latent_channels, latent_frames, 4, 6,
                        generator=torch.Generator().manual_seed(latent_frames)).cuda()
        eager = torch.cat(list(iter_decode_video(vae, z, "cuda", cuda_graphs=False)))
        graphed = torch.cat(list(iter_decode_video(vae, z, "cuda", cuda_graphs=True)))
        assert torch.equal(graphed, eager)
