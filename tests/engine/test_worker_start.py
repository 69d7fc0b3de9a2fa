"""Workers fork from a forkserver that imported the heavy libraries once (mp_executor.prewarm / worker_preload.py);
COMFYUI_H3_WORKER_START=spawn spawns them as before. Both start equal engines."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from comfyui_h3.backend.engine import Engine
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.executor import mp_executor
from comfyui_h3.backend.pipelines.h3.request import H3Request

pytestmark = pytest.mark.slow  # every test here takes seconds on two cores (docs/TESTING.md)

REQUEST = dict(prompt="rain on a tin roof", num_frames=124, steps=1, seed=5, width=64, height=64)
needs_forkserver = pytest.mark.skipif(
    "forkserver" not in __import__("multiprocessing").get_all_start_methods(),
    reason="this platform has no forkserver (workers are spawned; the spawn test covers them)")


def _run(tiny_h3_dir, monkeypatch, start: str):
    monkeypatch.setenv("COMFYUI_H3_WORKER_START", start)
    engine = Engine(h3_config(str(tiny_h3_dir), device="cpu", dtype="float32", world_size=2))
    try:
        result = engine.generate(H3Request(**REQUEST))
        return [r.preloaded for r in engine._executor.ready], result
    finally:
        engine.shutdown()


@needs_forkserver
def test_forked_workers_are_preloaded_and_equal_spawned_ones(tiny_h3_dir, monkeypatch):
    assert mp_executor.prewarm()
    forked, a = _run(tiny_h3_dir, monkeypatch, "forkserver")
    spawned, b = _run(tiny_h3_dir, monkeypatch, "spawn")
    assert forked == [True, True] and spawned == [False, False]
    assert torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


def test_preload_takes_its_path_back_out_of_the_environment(tmp_path):
    """The forkserver gets the package folder on PYTHONPATH only to find the preload; workers must not inherit it."""
    import comfyui_h3

    root = os.path.dirname(os.path.dirname(os.path.abspath(comfyui_h3.__file__)))
    before = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root] + ["/elsewhere"]
    env = dict(os.environ, COMFYUI_H3_PRELOAD_PATH=root, PYTHONPATH=os.pathsep.join(before + [root]))
    code = ("import os, comfyui_h3.backend.executor.worker_preload as p; "
            "print(repr((os.environ.get('PYTHONPATH'), os.environ.get('COMFYUI_H3_PRELOAD_PATH'), p.loaded[0])))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(tmp_path),
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == repr((os.pathsep.join(before), None, "torch"))


# A host process: prewarm, run one job on a forked worker, then wait to be killed. It prints the pids it started.
_HOST = """
import os, sys, time
from comfyui_h3.backend.engine import get_engine
from comfyui_h3.backend.executor import mp_executor
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.request import H3Request
from comfyui_h3.host_shutdown import install_sigterm_hook
from multiprocessing import forkserver

mp_executor.prewarm()
server = forkserver._forkserver._forkserver_pid
if sys.argv[2] == 'preloading':
    print('pids', server, flush=True)
    time.sleep(120)
engine = get_engine(h3_config(sys.argv[1], device='cpu', dtype='float32'))
engine.generate(H3Request(prompt='rain', num_frames=124, steps=1, seed=5, width=64, height=64))
assert install_sigterm_hook()
print('pids', server, *[p.pid for p in engine._executor._procs], flush=True)
time.sleep(120)
"""


def _start_host(tiny_h3_dir, stage: str):
    env = dict(os.environ, COMFYUI_H3_WORKER_START="forkserver")
    proc = subprocess.Popen([sys.executable, "-c", _HOST, str(tiny_h3_dir), stage], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("pids"):
        proc.kill()
        pytest.fail(f"the host did not start: {line}{proc.communicate(timeout=60)[1][-3000:]}")
    return proc, [int(p) for p in line.split()[1:]]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


def _kill_all(proc, pids):
    for pid in [proc.pid, *pids]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)


@needs_forkserver
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_sigkilled_host_takes_its_preloading_forkserver_with_it(tiny_h3_dir):
    """Issue 28 #10/#18: the forkserver dies with its host even while it still imports torch & co. (it used to finish
    its ~5-20 s of imports first), so a host killed outright leaves nothing behind."""
    proc, pids = _start_host(tiny_h3_dir, "preloading")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert _gone_within(pids, 2.0) == [], "the forkserver outlived its SIGKILLed host by 2 s"
    finally:
        _kill_all(proc, pids)


@needs_forkserver
def test_sigterm_ends_host_workers_and_forkserver_within_2_s_and_leaks_no_semaphore(tiny_h3_dir):
    """Issue 28 #10, without ComfyUI: a host whose SIGTERM is the default (as ComfyUI's) with the pack's hook ends by
    SIGTERM at once; its worker and forkserver are gone within 2 s and the resource tracker reports nothing leaked."""
    proc, pids = _start_host(tiny_h3_dir, "loaded")
    try:
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
        assert proc.returncode == -signal.SIGTERM
        assert _gone_within(pids, max(0.1, 2.0 - (time.monotonic() - sent))) == [], \
            f"still running 2 s after SIGTERM: {[p for p in pids if _running(p)]}"
        stderr = proc.communicate(timeout=30)[1]
        assert "leaked semaphore" not in stderr, stderr[-3000:]
    finally:
        _kill_all(proc, pids)
