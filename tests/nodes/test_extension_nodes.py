"""H3 Extend (node) and `python -m comfyui_h3 extend` end to end on the tiny model through the engine's worker: the
result is streamed into a file, chains through latents, saves, per-window prompts, progress text, and Stop keeps the
finished windows as a partial file."""

import os

import av
import numpy as np
import pytest
import torch

from comfyui_h3 import comfy_services as services
from comfyui_h3.extend_job import partial_prefix_for, split_prompts, window_status


def _clip(frames=130):
    rng = np.random.default_rng(2)
    y, x = np.mgrid[0:64, 0:96]
    base = np.stack([x * 2, y * 3, x + y], -1).astype(np.int64)
    video = np.stack([(base + 5 * t + rng.integers(0, 12, base.shape)) % 256 for t in range(frames)]).astype(np.uint8)
    wave = torch.from_numpy(np.sin(np.arange(32000 * 6) * 2 * np.pi * 330 / 32000)[None].repeat(2, 0) * 0.2).float()
    return torch.from_numpy(video), wave


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("COMFYUI_H3_TEMP", str(tmp_path / "temp"))
    services.clear_interrupt()
    yield tmp_path
    services.clear_interrupt()


@pytest.fixture(scope="module")
def handle(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.types import H3EngineHandle

    h = H3EngineHandle(h3_config(model_dir=str(tiny_h3_dir), device="cpu", dtype="float32"))
    yield h
    h.engine().shutdown()


def _extend(handle, **kw):
    from comfyui_h3.nodes.extend import H3Extend

    args = dict(prompt="a kite over the sea", seconds=2.0, windows=0, window_frames=56, overlap_frames=22,
                audio_mode="continue", steps=1, video_shift=12.0, audio_shift=3.0, seed=0)
    args.update(kw)
    return H3Extend().extend(handle, **args)


def test_prompt_split_and_status_text():
    assert split_prompts("a kite\n---\nthe kite lands\n  ---  \n") == ["a kite", "the kite lands"]
    assert split_prompts("one prompt\nover two lines") == ["one prompt\nover two lines"]
    status = window_status(4)
    assert [status(d, 12) for d in (1, 4, 5, 12)] == ["window 1/3, step 1/4", "window 1/3, step 4/4",
                                                      "window 2/3, step 1/4", "window 3/3, step 4/4"]
    assert partial_prefix_for("/a/b/clip.mp4") == ("/a/b", "clip_partial")


@pytest.mark.slow
def test_node_streams_to_a_file_chains_and_saves(folders, handle):
    from comfyui_h3.nodes.extend import H3Extend
    from comfyui_h3.nodes.save_video import H3SaveVideo
    from comfyui_h3.video_types import H3Video

    frames, wave = _clip()
    # 2 s -> 51 frames: windows of 56 add 34, then 17 (2 windows, one prompt each)
    out = _extend(handle, prompt="a kite over the sea\n---\nthe kite lands on the sand",
                  video=H3Video(frames, 24, wave, 32000))
    clip, latents = out["result"]
    assert clip.get_frame_count() == 124 + 51 and clip.get_dimensions() == (96, 64)
    assert clip.path.startswith(str(folders / "temp")) and "2 windows" in out["ui"]["text"][0]
    assert "source cut from 130 to 124" in out["ui"]["text"][0]
    assert clip.audio is not None and abs(clip.audio.shape[1] / 32000 - 175 / 24) < 0.05
    assert latents.video.shape[2] == (175 - 5) // 17 * 5 + 2
    # chained through latents: nothing re-encoded, one full window more
    more, more_latents = _extend(handle, prompt="it flies away", windows=1, latents=latents)["result"]
    assert more.get_frame_count() == 175 + 34
    assert torch.equal(more_latents.video[:, :, :latents.video.shape[2]], latents.video)
    # saving with the settings it was streamed with copies the file's packets; other settings re-encode it chunk by
    # chunk from the file (never decoded whole)
    saved = H3SaveVideo().save(video=more, filename_prefix="H3/ext", prompt={"1": {}})["ui"]["images"][0]
    path = folders / "out" / saved["subfolder"] / saved["filename"]
    with av.open(str(path)) as f, av.open(more.path) as g:
        assert f.streams.video[0].frames == 209 and sorted(s.type for s in f.streams) == ["audio", "video"]
        assert [bytes(p) for p in f.demux(f.streams.video[0])] == [bytes(p) for p in g.demux(g.streams.video[0])]
        assert "prompt" in f.metadata
    resaved = H3SaveVideo().save(video=more, filename_prefix="H3/ext", crf=30)["ui"]["images"][0]
    with av.open(str(folders / "out" / resaved["subfolder"] / resaved["filename"])) as f:
        assert f.streams.video[0].frames == 209
    assert not more.decoded
    with pytest.raises(ValueError, match="one source"):
        H3Extend().extend(handle, "x", 1.0, 0, 56, 22, "continue", 1, 12.0, 3.0, 0)
    assert H3Extend.VALIDATE_INPUTS(prompt=" \n---\n ") != True  # noqa: E712
    with pytest.raises(ValueError, match="at least 17 new frames"):  # checked first when the node runs
        H3Extend().extend(handle, "x", 1.0, 2, 39, 39, "continue", 1, 12.0, 3.0, 0)


@pytest.mark.slow
def test_node_stop_keeps_the_finished_windows(folders, handle, monkeypatch):
    import comfyui_h3.nodes.extend as extend_node
    from comfyui_h3.video_types import H3Video

    def stop_after_two_windows(steps):
        text = window_status(steps)

        def status(done, total):
            if done >= 2:
                services.request_interrupt()
            return text(done, total)

        return status

    monkeypatch.setattr(extend_node, "window_status", stop_after_two_windows)
    frames, wave = _clip()
    with pytest.raises(services.interrupt_exception_types()[-1]) as stopped:
        _extend(handle, seconds=4.0, video=H3Video(frames, 24, wave, 32000))  # 102 frames: 3 windows
    message = str(stopped.value)
    assert "after 2 of 3 windows" in message and "extend_partial_00001.mp4" in message
    kept = folders / "out" / "H3" / "extend_partial_00001.mp4"
    with av.open(str(kept)) as f:
        assert f.streams.video[0].frames == 124 + 68
    assert not [n for n in os.listdir(folders / "temp" / "h3_extend") if n.endswith(".mp4")]  # nothing left behind
    services.clear_interrupt()
    # the engine is fine afterwards
    out = _extend(handle, seconds=0.5, video=H3Video(frames, 24, wave, 32000))
    assert out["result"][0].get_frame_count() == 124 + 17


@pytest.mark.slow
def test_cli_extend(tmp_path, tiny_h3_dir):
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.cli import main

    frames, wave = _clip()
    src = write_mp4(str(tmp_path / "in.mp4"), frames, 24, wave, 32000)
    dst = tmp_path / "long.mp4"
    args = ["extend", "--model", str(tiny_h3_dir), "--video", src, "--seconds", "1.5", "--window-frames", "56",
            "--prompt", "waves", "--steps", "1", "--dtype", "float32", "--out", str(dst)]
    assert main(args) == 0
    with av.open(str(dst)) as f:
        assert f.streams.video[0].frames == 124 + 51
        assert abs(float(f.streams.audio[0].duration * f.streams.audio[0].time_base) - 175 / 24) < 0.1
    assert main(args) == 2  # never overwrites
    bad = ["extend", "--model", str(tiny_h3_dir), "--video", src, "--seconds", "1", "--overlap-frames", "20",
           "--prompt", "x", "--steps", "1", "--out", str(tmp_path / "bad.mp4")]
    assert main(bad) == 2 and not (tmp_path / "bad.mp4").exists()
