"""StreamingVideoSaver with the writer in a child process (backend/media/encoder_process.py): same file as the
in-process writer, audio, errors from the child, no clobbering, abort, and no encoder left behind by a dead parent."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import av
import numpy as np
import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.media import encoder_process
from comfyui_h3.backend.media.encode import next_free_path
from comfyui_h3.backend.media.stream_writer import StreamingVideoSaver

pytestmark = pytest.mark.skipif(not encoder_process.supported(), reason="child encoders are POSIX-only")


def _frames(t=9, h=48, w=64):
    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    video = torch.stack([torch.stack([0.5 + 0.4 * torch.sin(4 * xx + 3 * yy + i * 0.2 + c) for c in range(3)], -1)
                         for i in range(t)])
    return (video * 255).round().to(torch.uint8)


def _decode(path):
    with av.open(path) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    with av.open(path) as container:
        audio = [f.to_ndarray() for f in container.decode(audio=0)] if container.streams.audio else []
    return frames, audio


def _leftover_buffers():
    return glob.glob(os.path.join(encoder_process._buffer_folder(), f"h3-encoder-{os.getpid()}-*"))


def test_child_writes_the_same_video_as_the_thread(tmp_path):
    frames = _frames()
    wave = torch.sin(torch.linspace(0, 400, 32000 * 9 // 24)).repeat(2, 1) * 0.3
    paths = {}
    for mode in ("thread", "process"):
        paths[mode] = str(tmp_path / f"{mode}.mp4")
        with StreamingVideoSaver(paths[mode], 64, 48, 24, chunk_frames=4, encoder=mode, crf=0,
                                 audio_sample_rate=32000) as saver:
            saver.write(frames[:5])  # the buffers (and the child) come with the first write's device
            assert (saver._child is not None) == (mode == "process")
            saver.write(frames[5:])
            saver.write_audio(wave, 32000)
        assert saver.frames_written == 9
    (a, audio_a), (b, audio_b) = _decode(paths["thread"]), _decode(paths["process"])
    assert a.shape == b.shape == (9, 48, 64, 3)
    assert np.array_equal(a, b)  # the same encoder settings and input: the same decoded pixels (crf 0)
    assert len(audio_a) == len(audio_b) > 0
    assert not _leftover_buffers()


def test_child_refuses_to_clobber_and_honours_reservations(tmp_path):
    target = tmp_path / "taken.mp4"
    target.write_bytes(b"user's file")
    with pytest.raises(FileExistsError):
        StreamingVideoSaver(str(target), 64, 48, 24, encoder="process")
    assert target.read_bytes() == b"user's file"
    reserved = next_free_path(str(tmp_path), "clip", ".mp4")
    with StreamingVideoSaver(reserved, 64, 48, 24, encoder="process", reserved=True) as saver:
        saver.write(_frames(3))
    assert os.path.getsize(reserved) > 0


def test_an_error_in_the_child_reaches_the_caller_and_nothing_is_published(tmp_path):
    path = str(tmp_path / "bad.mp4")
    saver = StreamingVideoSaver(path, 64, 48, 24, encoder="process", audio_sample_rate=32000)
    saver.write(_frames(2))
    saver.write_audio(np.zeros((3, 100), np.float32), 32000)  # three channels: the writer refuses them
    with pytest.raises(RuntimeError, match="encoder failed"):
        saver.close()
    assert not os.path.exists(path)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert not _leftover_buffers()


def test_abort_leaves_no_file_and_ends_the_child(tmp_path):
    path = str(tmp_path / "aborted.mp4")
    saver = StreamingVideoSaver(path, 64, 48, 24, encoder="process")
    saver.write(_frames(4))
    child = saver._child._proc
    saver.abort()
    assert child.wait(timeout=10) is not None
    assert not os.listdir(tmp_path)
    assert not _leftover_buffers()


_PARENT = textwrap.dedent("""
    import sys, time, torch
    from comfyui_h3.backend.media.stream_writer import StreamingVideoSaver
    saver = StreamingVideoSaver(sys.argv[1], 64, 48, 24, encoder="process")
    saver.write(torch.zeros(3, 48, 64, 3, dtype=torch.uint8))
    while saver._free.qsize() < 2 or saver.stats["encode_s"] == 0:  # the child has taken the frames
        time.sleep(0.05)
    print(saver._child._proc.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_a_dead_parent_leaves_no_encoder_and_no_file(tmp_path):
    path = str(tmp_path / "orphan.mp4")
    env = dict(os.environ, PYTHONPATH=REPO_DIR, OMP_NUM_THREADS="1")
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, path], env=env, stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())  # (a parent that fails prints nothing: int('') fails the test)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the encoder child outlived its parent")
    assert not os.path.exists(path)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_auto_picks_the_child_only_for_a_gpu_source(tmp_path):
    with StreamingVideoSaver(str(tmp_path / "a.mp4"), 64, 48, 24) as saver:
        saver.write(_frames(1))
        assert saver._child is None
    with StreamingVideoSaver(str(tmp_path / "b.mp4"), 64, 48, 24, device="cpu") as saver:
        assert saver._child is None
        saver.write(_frames(1))
    with pytest.raises(ValueError, match="encoder must be"):
        StreamingVideoSaver(str(tmp_path / "c.mp4"), 64, 48, 24, encoder="fork")


def test_buffers_go_where_there_is_room_and_the_thread_takes_over_when_nowhere_is(tmp_path, monkeypatch):
    """A container's /dev/shm is often 64 MB, and a mapped file past a full tmpfs dies with SIGBUS on write: room is
    checked first (temp folder next), and with room nowhere the in-process writer encodes instead."""
    room = {"/dev/shm": 10 * 2**20}
    monkeypatch.setattr(encoder_process, "_free_bytes", lambda folder: room.get(folder, 2**40))
    assert encoder_process._buffer_folder(2 * 2**20) == "/dev/shm"
    assert encoder_process._buffer_folder(6 * 2**20) != "/dev/shm"  # 2x 6 MiB does not fit 10 MiB
    monkeypatch.setattr(encoder_process, "_free_bytes", lambda folder: 0)
    path = str(tmp_path / "fallback.mp4")
    with StreamingVideoSaver(path, 64, 48, 24, encoder="process") as saver:
        saver.write(_frames(3))
        assert saver._child is None and saver._writer is not None
    assert _decode(path)[0].shape == (3, 48, 64, 3)
