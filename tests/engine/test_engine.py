"""The engine's worker process: persistence, progress, Stop at a step boundary, errors that leave it usable, a dead
worker replaced on next use, and ComfyUI's free-memory shutting it down."""

import os
import signal

import numpy as np
import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.engine import Engine, EngineCancelled, EngineError, get_engine, shutdown_all
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.geometry import RequestError
from comfyui_h3.backend.pipelines.h3.request import H3Request


def small(**kw):
    base = dict(prompt="a lighthouse in a storm", num_frames=124, steps=3, seed=5, width=64, height=64)
    base.update(kw)
    return H3Request(**base)


@pytest.fixture(scope="module")
def engine(tiny_h3_dir):
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", cpu_threads=1))
    yield eng
    eng.shutdown()


def worker_pid(eng):
    return eng._executor._procs[0].pid


@pytest.mark.slow
def test_generate_reports_progress_and_persists(engine):
    seen = []
    first = engine.generate(small(), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert first.frames.dtype == torch.uint8 and tuple(first.frames.shape) == (124, 64, 64, 3)
    assert tuple(first.audio.shape) == (2, 207 * 800)
    pid = worker_pid(engine)
    again = engine.generate(small())
    assert worker_pid(engine) == pid  # the model stayed loaded in the same worker
    assert torch.equal(first.video_latents, again.video_latents)  # same seed, same result


def test_bad_request_is_refused_before_the_worker(engine):
    with pytest.raises(RequestError, match="prompt is empty"):
        engine.generate(small(prompt="   "))
    with pytest.raises(RequestError, match="5 to 15 s"):
        engine.generate(small(num_frames=400))


def test_worker_side_error_leaves_engine_usable(engine):
    # A reference image outside 1:4..4:1 passes the driver's checks and fails inside the worker.
    from PIL import Image

    from comfyui_h3.backend.pipelines.h3.request import ReferenceInput

    engine.start()  # loaded by an earlier test, or now (the fast subset deselects that one)
    pid = worker_pid(engine)
    with pytest.raises(RequestError, match="1:4 and 4:1"):
        engine.generate(small(references=[ReferenceInput("image", image=Image.new("RGB", (200, 10)))]))
    assert engine.generate(small(steps=1)).frames is not None
    assert worker_pid(engine) == pid


def test_user_input_only_the_worker_can_check_is_a_request_error(engine):
    # A reference video shorter than the model's processor takes (its temporal patch at 2 fps: 13 frames at 24 fps)
    # is the user's to fix: a request error with the message as is, not an internal "MiniMax-H3 failed" with a
    # traceback; the worker stays.
    from comfyui_h3.backend.pipelines.h3.request import ReferenceInput

    engine.start()
    pid = worker_pid(engine)
    short = ReferenceInput("video", frames=np.zeros((12, 64, 64, 3), np.uint8), fps=24.0)
    with pytest.raises(RequestError, match="at least 13 frames .* got 12"):
        engine.generate(small(references=[short]))
    assert worker_pid(engine) == pid


@pytest.mark.parametrize("reference,message", [
    (dict(kind="image"), r"Reference 1 \(image\) needs an image, got NoneType"),
    (dict(kind="video"), r"Reference 1 \(video\) needs uint8 frames \[frames, height, width, 3\], got nothing"),
    (dict(kind="video", frames=np.zeros((20, 64, 64), np.uint8)), r"got uint8 \(20, 64, 64\)"),
    (dict(kind="video", frames=np.zeros((20, 64, 64, 3), np.float32)), r"got float32"),
    (dict(kind="audio"), r"Reference 2 \(audio\) needs a soundtrack"),
    (dict(kind="audio", audio=torch.zeros(2, 0), sample_rate=32000), r"0 samples at 32000 Hz: give at least 0.025 s"),
    (dict(kind="audio", audio=torch.zeros(2, 2399), sample_rate=96000), r"2399 samples at 96000 Hz"),
])
def test_malformed_references_are_refused_before_the_worker(reference, message):
    # each of these failed inside the worker as an internal error (AttributeError, IndexError, the processor's
    # ValueError, the audio VAE's RuntimeError, the resampler's ValueError)
    from PIL import Image

    from comfyui_h3.backend.pipelines.h3.request import ReferenceInput

    refs = [ReferenceInput(**reference)]
    if reference["kind"] == "audio":
        refs.insert(0, ReferenceInput("image", image=Image.new("RGB", (64, 64))))
    with pytest.raises(RequestError, match=message):
        small(references=refs).validate()


def test_worker_failure_is_one_line_and_its_traceback_is_logged(engine):
    """A failure inside the worker (not a request error): the node / CLI error is its cause on one line; the worker's
    traceback goes to the host's log (logger comfyui_h3.worker); the worker stays."""
    import logging

    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    engine.start()
    pid = worker_pid(engine)
    # Audio latents with 5 channels instead of 32 pass the request's checks and fail in the worker's arithmetic.
    request = H3ExtendRequest(prompts=["x"], added_frames=34, window_frames=56, steps=1,
                              source_video_latents=torch.zeros(1, 24, 27, 4, 6),
                              source_audio_latents=torch.zeros(2, 5, 180))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("comfyui_h3.worker")
    logger.addHandler(handler)
    try:
        with pytest.raises(EngineError) as info:
            engine.generate(request)
    finally:
        logger.removeHandler(handler)
    message = str(info.value)
    assert message.startswith("RuntimeError: The size of tensor a (5) must match"), message
    assert "\n" not in message and "Traceback" not in message
    (record,) = records
    assert record.levelno == logging.ERROR
    assert "Traceback (most recent call last)" in record.getMessage() and "run_job" in record.getMessage()
    assert worker_pid(engine) == pid


def test_cli_shows_a_worker_report_only_with_debug(capsys):
    import logging

    from comfyui_h3.backend.engine import worker_cause
    from comfyui_h3.backend.executor.messages import Failed
    from comfyui_h3.cli import _show_worker_reports

    failure = Failed(1, "error", "RuntimeError: Error(s) in loading:\n\tsize mismatch for w", 'File "w.py", line 1')
    logger = logging.getLogger("comfyui_h3.worker")
    try:
        _show_worker_reports(False)
        assert worker_cause(failure) == "RuntimeError: Error(s) in loading: size mismatch for w"
        assert capsys.readouterr().err == ""
        _show_worker_reports(True)
        worker_cause(failure)
        assert 'File "w.py", line 1' in capsys.readouterr().err
        assert worker_cause(Failed(1, "error", "x" * 900)).endswith("... (the whole report is in the log)")
    finally:
        for handler in [h for h in logger.handlers if getattr(h, "comfyui_h3_cli", False)]:
            logger.removeHandler(handler)
        logger.propagate = True


def test_stop_cancels_at_a_step_boundary(engine):
    done = []
    with pytest.raises(EngineCancelled):
        engine.generate(small(steps=20), progress=lambda d, t: done.append(d), should_cancel=lambda: bool(done))
    assert 1 <= len(done) < 20
    assert engine.generate(small(steps=1)).frames is not None  # the next prompt works


@pytest.mark.slow
def test_dead_worker_becomes_an_error_and_is_replaced(engine):
    engine.start()
    pid = worker_pid(engine)

    def kill_on_first_step(done, total):
        os.kill(pid, signal.SIGKILL)

    with pytest.raises(EngineError, match="died"):
        engine.generate(small(steps=30), progress=kill_on_first_step)
    result = engine.generate(small(steps=1))
    assert result.frames is not None and worker_pid(engine) != pid


@pytest.mark.slow
def test_free_memory_shuts_workers_down_and_next_use_restarts(tiny_h3_dir):
    shutdown_all()  # an engine an earlier test of this process left resident is not this test's to count
    cfg = h3_config(str(tiny_h3_dir), dtype="float32", cpu_threads=1, master_port=29601)
    eng = get_engine(cfg)
    assert get_engine(cfg) is eng
    eng.generate(small(steps=1, decode=False))
    assert eng.started
    assert shutdown_all() == 1
    assert not eng.started
    assert eng.generate(small(steps=1, decode=False)).frames is None
    eng.shutdown()


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Engine(h3_config(str(tmp_path / "nope")))
    empty = tmp_path / "empty"
    empty.mkdir()
    eng = Engine(h3_config(str(empty)))
    with pytest.raises(EngineError, match="not a MiniMax-H3 diffusers folder"):
        eng.generate(small())


@pytest.mark.slow
def test_worker_exits_when_its_host_dies(tmp_path, tiny_h3_dir):
    """A host killed with SIGKILL (no exit hooks) must not leave its worker and model behind."""
    import subprocess
    import sys
    import time

    script = (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from comfyui_h3.backend.engine import Engine\n"
        "from comfyui_h3.backend.pipelines.h3.family import h3_config\n"
        "e = Engine(h3_config(%r, dtype='float32', master_port=29611)); e.start()\n"
        "print(e._executor._procs[0].pid, flush=True); time.sleep(600)\n"
    ) % (REPO_DIR, str(tiny_h3_dir))
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(host.stdout.readline())
        host.kill()
        host.wait(10)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the worker outlived its killed host")
    finally:
        if host.poll() is None:
            host.kill()


@pytest.mark.slow
def test_stop_during_model_load(tiny_h3_dir):
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", master_port=29621))
    with pytest.raises(EngineCancelled, match="loading"):
        eng.generate(small(steps=1), should_cancel=lambda: True)
    assert not eng.started
    assert eng.generate(small(steps=1, decode=False)).video_latents is not None
    eng.shutdown()
