"""`python -m comfyui_h3 refine` as users run it: from generate's saved latents (the soundtrack kept bit for bit) and
from a video file, to a larger size; sizes that shrink and strengths out of range are refused and write nothing."""

import pytest
import torch

from cli_helpers import cli, streams


@pytest.mark.slow
def test_refine_from_latents_and_from_a_video(tmp_path, tiny_h3_dir):
    from safetensors.torch import load_file

    base = ("--model", tiny_h3_dir, "--device", "cpu", "--prompt", "rain on a tin roof", "--steps", 4)
    out = cli("generate", *base, "--width", 128, "--height", 64, "--out", tmp_path / "a.mp4", "--save-latents",
              tmp_path / "a.safetensors", cwd=tmp_path, cache=tiny_h3_dir.parent)
    assert out.returncode == 0, out.stderr
    out = cli("refine", *base, "--latents", tmp_path / "a.safetensors", "--size", "256x128", "--denoise", 0.5,
              "--out", tmp_path / "b.mp4", "--save-latents", tmp_path / "b.safetensors", cwd=tmp_path,
              cache=tiny_h3_dir.parent)
    assert out.returncode == 0, out.stderr
    source, refined = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    assert tuple(refined["video"].shape) == (1, 24, 37, 8, 16)
    assert torch.equal(refined["audio"], source["audio"])  # --source-audio keep (the default)
    assert streams(tmp_path / "b.mp4") == (124, 24.0, 32000, 2)
    out = cli("refine", *base, "--video", tmp_path / "a.mp4", "--scale", 1.5, "--out", tmp_path / "c.mp4",
              cwd=tmp_path, cache=tiny_h3_dir.parent)
    assert out.returncode == 0, out.stderr
    assert streams(tmp_path / "c.mp4") == (124, 24.0, 32000, 2)
    import av

    with av.open(str(tmp_path / "c.mp4")) as container:  # 128x64 x 1.5 onto 32s
        assert (container.streams.video[0].width, container.streams.video[0].height) == (192, 96)
    for args, message in ((("--size", "64x64"), "smaller than the source"), (("--size", "1920x1080"), "multiples"),
                          (("--denoise", "0"), "strength above 0"), (("--size", "big"), "WIDTHxHEIGHT")):
        out = cli("refine", *base, "--latents", tmp_path / "a.safetensors", *args, "--out", tmp_path / "d.mp4",
                  cwd=tmp_path, cache=tiny_h3_dir.parent)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert not (tmp_path / "d.mp4").exists()
