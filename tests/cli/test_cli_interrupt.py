"""Ctrl-C in a terminal sends SIGINT to the whole foreground process group. During `python -m comfyui_h3 extend` the
workers must ignore it and the CLI must turn it into the agreed Stop: exit 130, one line on stderr (no worker
traceback), the finished windows kept as OUT_partial_NNNNN.mp4 (a valid MP4), and no worker left behind. `run` (nodes,
as in ComfyUI) takes the same Stop."""

import os
import re
import signal
import sys

import av
import numpy as np
import pytest
import torch

from cli_helpers import assert_no_worker_left, lines_after_sigint, run_and_interrupt
from repo_paths import REPO_DIR

WINDOW, OVERLAP, SOURCE = 56, 22, 124

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds worker processes through /proc")


def source_clip(path):
    from comfyui_h3.backend.media.save import write_mp4

    rng = np.random.default_rng(4)
    video = torch.from_numpy(rng.integers(0, 256, (SOURCE, 64, 96, 3), dtype=np.uint8))
    wave = torch.from_numpy(np.sin(np.arange(32000 * 6) * 2 * np.pi * 220 / 32000)[None].repeat(2, 0) * 0.2).float()
    return write_mp4(str(path), video, 24, wave, 32000)


def env_for(tiny_h3_dir):
    return dict(os.environ, PYTHONPATH=REPO_DIR, COMFYUI_H3_CACHE=str(tiny_h3_dir.parent))


@pytest.mark.slow
def test_ctrl_c_during_extend_stops_keeps_the_finished_windows_and_exits_130(tmp_path, tiny_h3_dir):
    src = source_clip(tmp_path / "in.mp4")
    out = tmp_path / "long.mp4"
    cmd = [sys.executable, "-m", "comfyui_h3", "extend", "--model", str(tiny_h3_dir), "--video", src, "--windows", "6",
           "--window-frames", str(WINDOW), "--overlap-frames", str(OVERLAP), "--prompt", "surf", "--steps", "10",
           "--dtype", "float32", "--out", str(out)]

    def window_finished(line):
        m = re.search(r"window (\d+)/", line)
        return bool(m) and int(m.group(1)) >= 2

    rc, stdout, stderr, workers = run_and_interrupt(cmd, tmp_path, env_for(tiny_h3_dir), window_finished)
    assert rc == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    after = lines_after_sigint(stderr)
    assert len(after) == 1 and after[0].startswith("Stopped after "), stderr  # one line, no worker output
    done = int(re.match(r"Stopped after (\d+) of 6 windows", after[0]).group(1))
    assert 1 <= done < 6
    kept = tmp_path / "long_partial_00001.mp4"
    assert stdout.split() == [str(kept)]
    with av.open(str(kept)) as container:  # a complete, playable file: every frame decodes
        frames = sum(1 for _ in container.decode(video=0))
        assert container.streams.audio
    assert frames == SOURCE + done * (WINDOW - OVERLAP)
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert_no_worker_left(workers)


@pytest.mark.slow
def test_ctrl_c_during_run_is_the_nodes_stop(tmp_path, tiny_h3_dir):
    from comfyui_h3.templates import workflows_dir

    workflow = workflows_dir() / "h3_text_to_video.api.json"
    cmd = [sys.executable, "-m", "comfyui_h3", "run", str(workflow), "--set", "2.steps=40", "--set", '1.dtype="float32"',
           "--out-dir", str(tmp_path / "out")]
    rc, stdout, stderr, workers = run_and_interrupt(cmd, tmp_path, env_for(tiny_h3_dir),
                                                    lambda line: re.search(r"\b\d+/40\b", line) is not None)
    assert rc == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert lines_after_sigint(stderr) == ["Stopped by the user."], stderr
    assert stdout.strip() == "" and not list((tmp_path / "out").rglob("*.mp4"))
    assert_no_worker_left(workers)


# Issue 28 #17 / #18: one rule for Ctrl-C and SIGTERM, at every stage.

def test_the_stop_rule_first_signal_stops_a_job_or_quits_outside_one_second_quits(monkeypatch):
    """Inside an engine job the first Ctrl-C / SIGTERM is the Stop (the nodes' flag too); outside one (reading,
    encoding, saving, between workflows) it quits at once; a second quits at once; later ones leave the clean-up be."""
    from comfyui_h3 import cli_signals
    from comfyui_h3 import comfy_services as services
    from comfyui_h3.backend import engine

    try:
        monkeypatch.setattr(engine, "jobs_running", lambda: 1)
        during_a_job = cli_signals.StopSignals()
        during_a_job.handle(signal.SIGTERM, None)
        assert during_a_job.requested and services.interrupt_requested() and during_a_job.exit_code == 143
        with pytest.raises(KeyboardInterrupt):
            during_a_job.handle(signal.SIGINT, None)
        during_a_job.handle(signal.SIGINT, None)  # a third while the command cleans up: ignored
        services.clear_interrupt()

        monkeypatch.setattr(engine, "jobs_running", lambda: 0)
        between = cli_signals.StopSignals()
        with pytest.raises(KeyboardInterrupt):
            between.handle(signal.SIGINT, None)
        assert between.exit_code == 130
    finally:
        services.clear_interrupt()


def test_a_node_that_finished_despite_a_stop_runs_no_node_after_it():
    """`run` of seedvr2_upscale_video saved the whole result with exit 0 when Ctrl-C came during its one batch: the
    runner now checks the Stop before every node (and after the last), so the Save never runs."""
    from comfyui_h3.comfy_services.errors import H3Interrupted
    from comfyui_h3.workflow_runner import execute

    asked, saved = [], []

    class Upscale:  # Ctrl-C arrives while it runs, and it finishes anyway
        RETURN_TYPES, FUNCTION = ("INT",), "run"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        def run(self):
            asked.append(True)
            return (7,)

    class Save:
        RETURN_TYPES, FUNCTION, OUTPUT_NODE = (), "run", True

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"value": ("INT", {})}}

        def run(self, value):
            saved.append(value)
            return {}

    prompt = {"1": {"class_type": "Upscale", "inputs": {}}, "2": {"class_type": "Save", "inputs": {"value": ["1", 0]}}}
    with pytest.raises(H3Interrupted, match="Stopped by the user"):
        execute(prompt, {"Upscale": Upscale, "Save": Save}, should_stop=lambda: bool(asked))
    assert asked and not saved
    assert execute(prompt, {"Upscale": Upscale, "Save": Save}, should_stop=lambda: False) == {"2": {}}
    assert saved == [7]


@pytest.fixture(scope="module")
def seedvr2_cache(tmp_path_factory):
    from comfyui_h3.tiny_model import ensure_tiny_seedvr2

    folder = tmp_path_factory.mktemp("cache")
    ensure_tiny_seedvr2(folder / "tiny-seedvr2-3b")
    return folder


@pytest.mark.slow
def test_sigterm_during_upscale_is_a_stop_that_leaves_no_temporary_and_no_worker(tmp_path, seedvr2_cache):
    """SIGTERM (`timeout`) of `upscale` used to end the CLI on the spot: its worker ran on for 30-120 s and the hidden
    `.up.mp4.*.part` (and the worker's `..up.mp4.*.part.*.tmp`) stayed. It is now Ctrl-C's Stop: exit 143, the
    finished batches kept as the partial, nothing hidden left, the worker gone."""
    from comfyui_h3.backend.media.save import write_mp4

    rng = np.random.default_rng(3)
    src = write_mp4(str(tmp_path / "in.mp4"), torch.from_numpy(rng.integers(0, 256, (41, 64, 96, 3), dtype=np.uint8)),
                    24)
    out = tmp_path / "up.mp4"
    cmd = [sys.executable, "-m", "comfyui_h3", "upscale", "--video", src, "--batch-frames", "5", "--overlap", "1",
           "--device", "cpu", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=REPO_DIR, COMFYUI_H3_CACHE=str(seedvr2_cache), COMFYUI_H3_MODELS="")
    rc, stdout, stderr, workers = run_and_interrupt(cmd, tmp_path, env,
                                                    lambda line: re.search(r"batch 1/10", line) is not None,
                                                    sig=signal.SIGTERM)
    assert rc == 143, stderr
    assert "Traceback" not in stderr, stderr
    assert lines_after_sigint(stderr)[-1].startswith("Stopped after "), stderr
    assert not out.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == [], os.listdir(tmp_path)
    assert stdout.split() == [str(tmp_path / "up_partial_00001.mp4")]
    assert_no_worker_left(workers)
