"""`python -m comfyui_h3 upscale` as users run it, on the tiny SeedVR2 models on the CPU: the upscaled MP4 with the
input's frame count, rate and sound; one-line errors (exit 2) that leave nothing behind; never overwriting; Ctrl-C
keeps the finished frames as OUT_partial_NNNNN.mp4."""

import os
import re
import subprocess
import sys

import av
import pytest
import torch

from cli_helpers import assert_no_worker_left, lines_after_sigint, run_and_interrupt
from repo_paths import REPO_DIR

pytestmark = pytest.mark.slow  # every test here takes seconds on two cores (docs/TESTING.md)



@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder holding the tiny SeedVR2 set (built once here; the CLI finds it through COMFYUI_H3_CACHE)."""
    from comfyui_h3.tiny_model import ensure_tiny_seedvr2

    folder = tmp_path_factory.mktemp("cache")
    ensure_tiny_seedvr2(folder / "tiny-seedvr2-3b")
    return folder


def env_for(cache):
    return dict(os.environ, PYTHONPATH=REPO_DIR, COMFYUI_H3_CACHE=str(cache), COMFYUI_H3_MODELS="")


def cli(*args, cwd, cache, timeout=300):
    return subprocess.run([sys.executable, "-m", "comfyui_h3", "upscale", *map(str, args)], cwd=cwd,
                          env=env_for(cache), capture_output=True, text=True, timeout=timeout)


def source(path, frames=9, height=32, width=48):
    from comfyui_h3.backend.media.save import write_mp4

    g = torch.Generator().manual_seed(1)
    pictures = (torch.rand(frames, height, width, 3, generator=g) * 255).to(torch.uint8)
    wave = 0.2 * torch.sin(torch.arange(32000 * frames // 24) * 0.05).repeat(2, 1)
    return write_mp4(str(path), pictures, 24, wave, 32000)


def streams(path):
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        frames = sum(1 for _ in container.decode(video=0))
        audio = [(a.rate, a.channels) for a in container.streams.audio]
        return frames, (video.width, video.height), float(video.average_rate), audio


def test_upscale_writes_the_video_with_its_frames_rate_and_sound(tmp_path, cache):
    src = source(tmp_path / "in.mp4")
    out = cli("--video", src, "--scale", 2, "--batch-frames", 5, "--overlap", 2, "--device", "cpu",
              "--out", tmp_path / "out" / "up.mp4", cwd=tmp_path, cache=cache)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(tmp_path / "out" / "up.mp4")]
    assert "batch 3/3" in out.stderr and "9 frames 48x32 -> 96x64 in 3 batches" in out.stderr
    assert streams(tmp_path / "out" / "up.mp4") == (9, (96, 64), 24.0, [(32000, 2)])
    assert os.listdir(tmp_path / "out") == ["up.mp4"]  # no temporary left beside it
    short = cli("--video", src, "--short-side", 48, "--edge", "crop", "--color-fix", "lab", "--out",
                tmp_path / "short.mp4", cwd=tmp_path, cache=cache)
    assert short.returncode == 0, short.stderr
    assert streams(tmp_path / "short.mp4")[:2] == (9, (64, 48))  # 72x48, cropped to the model's 16-px grid


@pytest.mark.parametrize("args,message", [
    (["--video", "missing.mp4"], "Video not found: missing.mp4"),
    (["--batch-frames", "6"], "Batch frames must be 4n+1"),
    (["--size", "640by480"], "--size wants WIDTHxHEIGHT"),
    (["--scale", "20"], "Scale 20.0 is out of range"),
    (["--variant", "7b"], "holds a SeedVR2 3B DiT, but the 7B model was chosen"),
    (["--model", "no_such_model.safetensors"], "SeedVR2 DiT 'no_such_model.safetensors' not found"),
    (["--device", "cuda:0"], "no CUDA GPU is visible") if not torch.cuda.is_available() else
    (["--dtype", "float8"], "invalid choice"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, cache, args, message):
    src = source(tmp_path / "in.mp4")
    given = dict(zip(args[::2], args[1::2]))
    argv = [*args] + ([] if "--video" in given else ["--video", src])
    out = cli(*argv, "--out", tmp_path / "out" / "up.mp4", cwd=tmp_path, cache=cache, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_never_overwrites_an_existing_output(tmp_path, cache):
    src = source(tmp_path / "in.mp4")
    (tmp_path / "up.mp4").write_bytes(b"mine")
    out = cli("--video", src, "--out", tmp_path / "up.mp4", cwd=tmp_path, cache=cache)
    assert out.returncode == 2 and "exists; choose another name" in out.stderr
    assert (tmp_path / "up.mp4").read_bytes() == b"mine"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds worker processes through /proc")
def test_ctrl_c_stops_between_batches_and_keeps_the_finished_frames(tmp_path, cache):
    src = source(tmp_path / "in.mp4", frames=41, height=64, width=96)
    out = tmp_path / "up.mp4"
    cmd = [sys.executable, "-m", "comfyui_h3", "upscale", "--video", src, "--batch-frames", "5", "--overlap", "1",
           "--device", "cpu", "--out", str(out)]
    rc, stdout, stderr, workers = run_and_interrupt(cmd, tmp_path, env_for(cache),
                                                    lambda line: re.search(r"batch 1/10", line) is not None)
    assert rc == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    after = lines_after_sigint(stderr)
    assert len(after) == 1 and after[0].startswith("Stopped after "), stderr
    done, frames_kept = map(int, re.match(r"Stopped after (\d+) of 10 batches; kept (\d+) frames", after[0]).groups())
    assert 1 <= done < 10 and 4 * done <= frames_kept <= 4 * done + 1  # 4 new frames a batch (+ the overlap's)
    kept = tmp_path / "up_partial_00001.mp4"
    assert stdout.split() == [str(kept)]
    assert streams(kept) == (frames_kept, (192, 128), 24.0, [(32000, 2)])
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["in.mp4", "up_partial_00001.mp4"]
    assert_no_worker_left(workers)
