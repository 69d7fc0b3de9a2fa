"""Workers fork from a forkserver that imported the heavy libraries once (mp_executor.prewarm / worker_preload.py);
COMFYUI_H3_WORKER_START=spawn spawns them as before. Both start equal engines."""

import os
import subprocess
import sys

import pytest
import torch

from comfyui_h3.backend.engine import Engine
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.executor import mp_executor
from comfyui_h3.backend.pipelines.h3.request import H3Request

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
