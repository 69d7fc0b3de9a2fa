"""H3 Sample from a source at a strength, and H3 Refine, as ComfyUI calls them: the size and length follow the
source, the soundtrack is kept when asked, a clip is encoded by the workers, and wrong combinations are refused before
any engine is made."""

import os

import pytest
import torch

from comfyui_h3.types import H3Latents


class _NoEngine:
    def engine(self):
        raise AssertionError("an engine was asked for a request that should have been refused")


def _latents(t=37, h=4, w=8):
    return H3Latents(torch.zeros(1, 24, t, h, w), torch.zeros(2, 32, 207))


@pytest.mark.parametrize("kw,message", [
    ({"denoise": 0.5}, "needs a source to start from"),
    ({"denoise": 0.5, "source_latents": _latents(), "source_video": object()}, "Connect one source"),
    ({"denoise": 0.5, "source_latents": _latents(t=6)}, "6 latent frames"),
    ({"denoise": 0.0, "source_latents": _latents()}, "strength above 0"),
])
def test_sample_refuses_bad_starts_before_any_engine_work(kw, message):
    from comfyui_h3.nodes.sample import H3Sample

    with pytest.raises(ValueError, match=message):
        H3Sample().sample(_NoEngine(), "waves", 5.0, 0, 0, 2, 12.0, 3.0, 0, **kw)


@pytest.mark.parametrize("kw,message", [
    ({}, "Connect the clip to refine"),
    ({"latents": _latents(), "width": 96, "height": 64}, "smaller than the source"),
    ({"latents": _latents(), "width": 256, "height": 256}, "changes the source's aspect"),
    ({"latents": _latents(), "denoise": 1.5}, "strength above 0"),
])
def test_refine_refuses_bad_inputs_before_any_engine_work(kw, message):
    from comfyui_h3.nodes.refine import H3Refine

    args = {"target": "size", "short_side": 1088, "scale": 1.43, "width": 256, "height": 128, "denoise": 0.2, **kw}
    with pytest.raises(ValueError, match=message):
        H3Refine().refine(_NoEngine(), "waves", steps=2, video_shift=12.0, audio_shift=3.0, seed=0, **args)


def test_the_new_inputs_come_after_every_saved_widget():
    from comfyui_h3.nodes.refine import H3Refine
    from comfyui_h3.nodes.sample import H3Sample

    optional = list(H3Sample.INPUT_TYPES()["optional"])
    # the sampling options declared later (step_cache) come after them
    assert optional[-5:] == ["source_latents", "source_video", "denoise", "source_audio", "step_cache"]
    spec = H3Refine.INPUT_TYPES()
    assert spec["required"]["denoise"][1]["default"] == 0.2
    assert list(spec["required"])[2:8] == ["target", "short_side", "scale", "width", "height", "denoise"]
    assert spec["required"]["target"][1]["default"] == "short_side"
    assert spec["required"]["short_side"][1]["default"] == 1088
    assert spec["optional"]["source_audio"][1]["default"] == "keep"


@pytest.mark.slow
def test_sample_from_a_source_and_refine_end_to_end(tmp_path, monkeypatch, tiny_h3_dir):
    from comfyui_h3.backend.engine import shutdown_all
    from comfyui_h3.nodes.loader import H3ModelLoader
    from comfyui_h3.nodes.refine import H3Refine
    from comfyui_h3.nodes.sample import H3Sample

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    (handle,) = H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa")
    sampling = dict(steps=2, video_shift=12.0, audio_shift=3.0)
    try:
        video, _, latents = H3Sample().sample(handle, "waves", 5.0, 128, 64, seed=3, **sampling)["result"][:3]
        # a restyle from the latents: the size and length follow them (seconds / width / height left as they are)
        kept = H3Sample().sample(handle, "storm", 10.0, 0, 0, seed=4, source_latents=latents, denoise=0.5,
                                 source_audio="keep", **sampling)["result"][2]
        assert kept.video.shape == latents.video.shape and torch.equal(kept.audio, latents.audio)
        assert not torch.equal(kept.video, latents.video)
        # video-to-video: the decoded clip through the workers' VAE
        clip = H3Sample().sample(handle, "storm", 5.0, 0, 0, seed=4, source_video=video, denoise=0.5, **sampling)
        assert clip["result"][0].get_dimensions() == (128, 64) and clip["result"][0].get_frame_count() == 124
        # the latent route: twice the size, the soundtrack kept
        out = H3Refine().refine(handle, "waves", "scale", 1088, 2.0, 1920, 1088, 0.5, seed=3, latents=latents,
                                **sampling)
    finally:
        shutdown_all()
    refined, audio, refined_latents = out["result"][:3]
    assert refined.get_dimensions() == (256, 128) and refined.get_frame_count() == 124
    assert tuple(refined_latents.video.shape) == (1, 24, 37, 8, 16)
    assert torch.equal(refined_latents.audio, latents.audio)
    assert "refined 128x64 -> 256x128 at denoise 0.5" in out["ui"]["text"][0]
