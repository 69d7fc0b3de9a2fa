"""The family seam: a second family (tests/toy_family.py, not shipped) runs through the same engine, executor and
worker as H3, on 1 and 2 gloo ranks, both engines resident at once; the registry evicts by memory budget, least
recently used first; the engine/executor/worker code names no family."""

import re

import pytest
import torch

from repo_paths import REPO
from comfyui_h3.backend.engine import get_engine, resident_engines
from comfyui_h3.backend.engine_config import EngineConfig
from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.request import H3Request

from toy_family import REFERENCE, ToyOptions, ToyRequest



def _pids(engine) -> list[int]:
    return [p.pid for p in engine._executor._procs]


@pytest.fixture(autouse=True)
def _clean_registry(empty_engine_registry):
    yield


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_toy_family_beside_h3_both_resident(tiny_h3_dir, world):
    h3 = get_engine(h3_config(str(tiny_h3_dir), device="cpu", dtype="float32", world_size=world))
    toy = get_engine(EngineConfig(REFERENCE, ToyOptions(scale=3.0), world_size=world, attention="math"))
    first = h3.generate(H3Request(prompt="surf", num_frames=124, steps=1, seed=2, width=64, height=64))
    steps = []
    result = toy.generate(ToyRequest([1.0, -2.0], steps=4), progress=lambda d, t: steps.append((d, t)))
    assert result.values == [81.0, -162.0] and result.world == world
    assert result.rank_sum == sum(range(world)) and result.attention == "math" and result.device == "cpu"
    assert steps == [(i, 4) for i in range(1, 5)]
    h3_pids, toy_pids = _pids(h3), _pids(toy)
    assert result.pids == toy_pids and not set(h3_pids) & set(toy_pids)  # its own worker processes
    again = h3.generate(H3Request(prompt="surf", num_frames=124, steps=1, seed=2, width=64, height=64))
    assert torch.equal(again.video_latents, first.video_latents)
    assert toy.generate(ToyRequest([0.5], steps=1)).values == [1.5]
    assert _pids(h3) == h3_pids and _pids(toy) == toy_pids  # nothing restarted between the two families
    assert resident_engines() == [h3.config, toy.config] and h3.started and toy.started  # toy used last


def test_toy_request_errors_and_stop_come_back_as_such():
    from comfyui_h3.backend.engine import EngineCancelled

    toy = get_engine(EngineConfig(REFERENCE, ToyOptions(), world_size=2))
    assert toy.generate(ToyRequest([1.0], steps=1)).values == [2.0]  # loaded: a Stop below lands at a step, not
    # during the model load (which a loaded machine can make last past the first Stop poll)
    with pytest.raises(RequestError):
        toy.generate(ToyRequest(steps=0))
    with pytest.raises(EngineCancelled, match="Stopped before step"):  # the driver polls Stop every 0.1 s
        toy.generate(ToyRequest(steps=1000, step_s=0.01), should_cancel=lambda: True)
    assert toy.generate(ToyRequest([1.0], steps=2)).values == [4.0]


def test_registry_evicts_least_recently_used_to_fit_the_budget(monkeypatch):
    monkeypatch.setenv("COMFYUI_H3_ENGINE_BUDGET_GB", str(5 / 1024))  # 5 MB per device
    a = get_engine(EngineConfig(REFERENCE, ToyOptions(scale=1.0, memory_mb=2)))
    b = get_engine(EngineConfig(REFERENCE, ToyOptions(scale=2.0, memory_mb=2)))
    a.generate(ToyRequest(steps=1))
    b.generate(ToyRequest(steps=1))
    assert get_engine(a.config) is a  # a is now the most recently used
    c = get_engine(EngineConfig(REFERENCE, ToyOptions(scale=3.0, memory_mb=2)))  # 6 MB > 5: the oldest (b) goes
    assert resident_engines() == [a.config, c.config]
    assert not b.started and a.started
    big = EngineConfig(REFERENCE, ToyOptions(scale=4.0, memory_mb=5))  # needs the whole budget: both go
    get_engine(big)
    assert resident_engines() == [big] and not a.started


def test_unknown_family_and_attention_are_refused_before_any_process():
    with pytest.raises(ValueError, match="Unknown model family"):
        get_engine(EngineConfig("nope", ToyOptions()))
    with pytest.raises(ValueError, match="Unknown attention backend"):
        get_engine(EngineConfig(REFERENCE, ToyOptions(), attention="flash9"))
    assert resident_engines() == []


def test_engine_executor_and_worker_name_no_family():
    """They dispatch on the config's family name: no import of, or string naming, a family."""
    files = [REPO / "backend" / "engine.py", REPO / "backend" / "engine_config.py", REPO / "backend" / "runtime.py",
             *sorted((REPO / "backend" / "executor").glob("*.py"))]
    for path in files:
        text = path.read_text()
        assert not re.search(r"pipelines\.(h3|seedvr2)|\bH3[A-Z]\w*\(|[\"']h3[\"']", text), path


@pytest.mark.slow
def test_interpreter_exit_does_not_wait_for_a_running_job():
    """Workers ignore the terminal's Ctrl-C, so at exit a job running in another thread (ComfyUI's prompt thread)
    must not hold the exit hook up: its workers are killed after 2 s and the job ends with an engine error."""
    import threading
    import time

    from comfyui_h3.backend.engine import EngineError, _shutdown_at_exit

    toy = get_engine(EngineConfig(REFERENCE, ToyOptions()))
    toy.start()
    ended = []

    def job():
        try:
            toy.generate(ToyRequest(steps=2000, step_s=0.05))
        except EngineError as exc:
            ended.append(exc)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    _shutdown_at_exit()
    assert time.monotonic() - started < 10
    thread.join(10)
    assert not thread.is_alive() and len(ended) == 1 and not toy.started
