"""H3 Preview Video (nodes/preview_video.py): any VIDEO (+ AUDIO) written into the temp folder only, returned as the ui
entry ComfyUI's frontend plays in the node. The real ComfyUI lane (served from /view?type=temp):
tests/lane/test_comfyui_previews.py."""

from __future__ import annotations

import os

import av
import numpy as np
import pytest
import torch

from comfyui_h3.nodes.preview_video import H3PreviewVideo
from comfyui_h3.video_types import H3Video


@pytest.fixture
def folders(tmp_path, monkeypatch):
    for name in ("temp", "output"):
        monkeypatch.setenv(f"COMFYUI_H3_{name.upper()}", str(tmp_path / name))
    monkeypatch.setenv("COMFYUI_H3_COMFY", "off")
    return tmp_path / "temp", tmp_path / "output"


def _clip(frames=30, height=48, width=64, audio=True):
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8))
    wave = torch.sin(torch.arange(int(32000 * frames / 24)) / 20.0)[None].repeat(2, 1) * 0.3 if audio else None
    return H3Video(pixels, 24, wave, 32000 if audio else None)


def _probe(path):
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0)), len(container.streams.audio)


def _everything_under(folder):
    return sorted(os.path.relpath(os.path.join(root, f), folder) for root, _, files in os.walk(folder) for f in files)


def test_writes_only_under_temp_and_returns_the_ui_entry(folders):
    temp, output = folders
    ui = H3PreviewVideo().preview(_clip())["ui"]
    assert ui["animated"] == (True,) and len(ui["images"]) == 1
    entry = ui["images"][0]
    assert entry["type"] == "temp" and entry["subfolder"] == "h3_preview"
    assert entry["filename"].startswith("preview_") and entry["filename"].endswith(".mp4")
    assert _everything_under(temp) == [os.path.join("h3_preview", entry["filename"])]  # no leftover temporaries
    assert not output.exists() or _everything_under(output) == []  # nothing in the output folder
    assert _probe(temp / entry["subfolder"] / entry["filename"]) == (30, 1)
    again = H3PreviewVideo().preview(_clip())["ui"]["images"][0]
    assert again["filename"] != entry["filename"]  # a second preview never replaces the first


def test_audio_input_replaces_the_soundtrack(folders):
    temp, _ = folders
    audio = {"waveform": torch.zeros(1, 2, 32000), "sample_rate": 32000}
    entry = H3PreviewVideo().preview(_clip(audio=False), audio=audio)["ui"]["images"][0]
    assert _probe(temp / entry["subfolder"] / entry["filename"]) == (30, 1)
    silent = H3PreviewVideo().preview(_clip(audio=False))["ui"]["images"][0]
    assert _probe(temp / silent["subfolder"] / silent["filename"]) == (30, 0)


def test_a_pack_written_mp4_is_copied_not_reencoded(folders, tmp_path):
    """A file H3 Extend streamed (h264 at Save Video's defaults, tagged) is copied packet for packet."""
    from comfyui_h3.backend.media.save import ENCODING_TAG, encoding_tag, write_mp4

    temp, _ = folders
    clip = _clip()
    source = str(tmp_path / "extend_00001.mp4")
    write_mp4(source, clip.frames, 24, clip.audio, 32000, crf=18, preset="veryfast",
              metadata={ENCODING_TAG: encoding_tag("h264", 18, "veryfast")})
    entry = H3PreviewVideo().preview(H3Video.from_file(source))["ui"]["images"][0]

    def packets(path):
        with av.open(str(path)) as container:
            return [bytes(p) for p in container.demux(container.streams.video[0]) if p.size]

    assert packets(temp / entry["subfolder"] / entry["filename"]) == packets(source)


def test_registered_as_an_output_node():
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    assert NODE_CLASS_MAPPINGS["H3_PreviewVideo"] is H3PreviewVideo
    assert NODE_DISPLAY_NAME_MAPPINGS["H3_PreviewVideo"] == "H3 Preview Video"
    assert H3PreviewVideo.OUTPUT_NODE and H3PreviewVideo.RETURN_TYPES == ()
