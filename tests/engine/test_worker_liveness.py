"""A frozen worker (SIGSTOP: what a hung driver call or a deadlocked collective looks like from outside) never blocks
the engine: the call fails within the heartbeat bound naming the rank and the bound, no process is left behind and the
next job works; Stop returns within seconds even when a worker cannot answer it. The watchdog's decisions are also
checked on their own with a fake clock."""

import os
import signal
import time

import pytest

from comfyui_h3.backend.engine import Engine, EngineCancelled, EngineError
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.executor.liveness import (ENV_PROGRESS, ENV_STOP, ENV_WORKER, Bounds, StopForced, Watchdog,
                                                  WorkerHung)
from comfyui_h3.backend.pipelines.h3.request import H3Request

BOUND_S = 4  # the test's heartbeat bound: a tiny CPU job's heartbeat thread never waits that long for the GIL


def small(**kw):
    base = dict(prompt="a frozen lake", num_frames=124, steps=40, seed=3, width=64, height=64, decode=False)
    base.update(kw)
    return H3Request(**base)


def gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def freeze_at_first_step(pid: int, stamp: list):
    def progress(done, total):
        if not stamp:
            stamp.append(time.monotonic())
            os.kill(pid, signal.SIGSTOP)
    return progress


def engine_for(tiny_h3_dir, world=1):
    return Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=world, cpu_threads=1))


@pytest.mark.slow
@pytest.mark.parametrize("world,victim", [(1, 0), (2, 1)])
def test_frozen_worker_is_an_error_within_the_bound_and_the_next_job_runs(tiny_h3_dir, monkeypatch, world, victim):
    monkeypatch.setenv(ENV_WORKER, str(BOUND_S))
    eng = engine_for(tiny_h3_dir, world)
    try:
        eng.start()
        pids = [p.pid for p in eng._executor._procs]
        frozen = []
        with pytest.raises(EngineError) as info:
            eng.generate(small(), progress=freeze_at_first_step(pids[victim], frozen))
        waited = time.monotonic() - frozen[0]
        message = str(info.value)
        assert f"rank {victim} " in message and f"{BOUND_S} s" in message and ENV_WORKER in message, message
        assert "\n" not in message
        assert BOUND_S - 1 < waited < BOUND_S + 10, waited
        assert all(gone(pid) for pid in pids), "a killed worker is still there"
        assert eng.generate(small(steps=1)).video_latents is not None  # a fresh group
        assert not set(pids) & {p.pid for p in eng._executor._procs}
    finally:
        eng.shutdown()


@pytest.mark.slow
def test_stop_with_a_frozen_worker_returns_within_seconds(tiny_h3_dir, monkeypatch):
    monkeypatch.delenv(ENV_WORKER, raising=False)  # the default (60 s) bound: it is Stop that must end the wait
    eng = engine_for(tiny_h3_dir)
    try:
        eng.start()
        pid = eng._executor._procs[0].pid
        frozen = []
        with pytest.raises(EngineCancelled, match="did not answer the Stop") as info:
            eng.generate(small(), progress=freeze_at_first_step(pid, frozen), should_cancel=lambda: bool(frozen))
        assert time.monotonic() - frozen[0] < 15
        assert "\n" not in str(info.value)
        assert gone(pid)
        assert eng.generate(small(steps=1)).video_latents is not None
    finally:
        eng.shutdown()


@pytest.mark.slow
def test_deadlocked_collective_is_caught_by_the_progress_bound(tiny_h3_dir, monkeypatch):
    """Rank 1 frozen, rank 0 blocked in the step's all-to-all: rank 0's heartbeat thread still beats (as it does in
    a hung device call), so only the absence of step progress tells."""
    monkeypatch.delenv(ENV_WORKER, raising=False)
    monkeypatch.setenv(ENV_PROGRESS, "6")
    eng = engine_for(tiny_h3_dir, world=2)
    try:
        eng.start()
        pids = [p.pid for p in eng._executor._procs]
        frozen = []
        # Both ranks stop marking steps, but their last marks may be seen a poll apart, so the first check past the
        # bound can name one rank or both.
        with pytest.raises(EngineError, match=rf"(rank [01]|ranks \[0, 1\]) made no step progress for 6 s "
                                              rf"\({ENV_PROGRESS}"):
            eng.generate(small(), progress=freeze_at_first_step(pids[1], frozen))
        assert time.monotonic() - frozen[0] < 6 + 10
        assert all(gone(pid) for pid in pids)
    finally:
        eng.shutdown()


def test_bad_bound_in_the_environment_is_a_clear_error(tiny_h3_dir, monkeypatch):
    monkeypatch.setenv(ENV_STOP, "soon")
    with pytest.raises(EngineError, match=f"{ENV_STOP}='soon' is not a number of seconds"):
        engine_for(tiny_h3_dir).generate(small(steps=1))


# -- the watchdog's decisions, on a fake clock -------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def watch(world=2, **bounds):
    clock = Clock()
    return Watchdog(world, Bounds(**{"heartbeat_s": 10, "progress_s": 30, "stop_s": 20, **bounds}), clock), clock


def loaded(world=2, **bounds):
    dog, clock = watch(world, **bounds)
    dog.loaded()
    return dog, clock


def test_watchdog_gives_starting_workers_the_startup_bound_then_the_heartbeat_bound():
    dog, clock = watch()
    dog.observe([0, 0], [0, 0], [0, 0])
    clock.t += 200  # importing torch, loading weights on a busy machine: no beat for a while, still fine
    dog.observe([1, 0], [0, 0], [0, 0])
    assert dog.check() is None
    clock.t += 101  # rank 1 silent for 301 s while loading
    dog.observe([2, 0], [0, 0], [0, 0])
    kind, message = dog.check()
    assert kind is WorkerHung and "rank 1 sent no heartbeat for 300 s" in message
    dog, clock = watch()
    dog.observe([1, 1], [0, 0], [0, 0])
    dog.loaded()
    clock.t += 9
    dog.observe([2, 1], [0, 0], [0, 0])
    assert dog.check() is None
    clock.t += 2  # rank 1 silent 11 s > 10 s
    kind, message = dog.check()
    assert kind is WorkerHung and "rank 1 sent no heartbeat for 10 s" in message and ENV_WORKER in message
    assert "\n" not in message


def test_watchdog_progress_bound_applies_to_jobs_only():
    dog, clock = loaded()
    for t in range(40):  # beating, idle between jobs: fine however long
        clock.t += 1
        dog.observe([t + 1, t + 1], [0, 0], [0, 0])
    assert dog.check() is None
    dog.job_started()
    for t in range(40, 71):
        clock.t += 1
        dog.observe([t + 1, t + 1], [t, 0], [0, 0])  # rank 0 steps, rank 1 never does
    kind, message = dog.check()
    assert kind is WorkerHung and "rank 1 made no step progress for 30 s" in message
    dog.job_ended()
    assert dog.check() is None
    off, clock = loaded(progress_s=0)
    off.job_started()
    for t in range(100):
        clock.t += 1
        off.observe([t + 1, t + 1], [0, 0], [0, 0])
    assert off.check() is None


def test_watchdog_stop_needs_an_acknowledgement_then_a_boundary():
    dog, clock = loaded()
    dog.observe([1, 1], [1, 1], [0, 0])
    dog.job_started()
    dog.stop_requested(7)
    clock.t += 3
    dog.observe([2, 2], [1, 1], [7, 0])
    assert dog.check() is None
    clock.t += 2.5  # 5.5 s: rank 1 never acknowledged (min(5 s, heartbeat bound))
    dog.observe([3, 2], [1, 1], [7, 0])
    kind, message = dog.check()
    assert kind is StopForced and "rank 1 did not answer the Stop within 5 s" in message
    dog, clock = loaded()
    dog.job_started()
    dog.stop_requested(7)
    for _ in range(20):  # both acknowledge and keep beating, but the step never ends
        clock.t += 1
        dog.observe([int(clock.t)] * 2, [1, 1], [7, 7])
        assert dog.check() is None
    clock.t += 1
    dog.observe([int(clock.t)] * 2, [1, 1], [7, 7])
    kind, message = dog.check()
    assert kind is StopForced and "within 20 s of the Stop" in message and ENV_STOP in message
    stale, clock = loaded()
    stale.job_started()
    stale.stop_requested(8)  # an acknowledgement of an earlier job's Stop does not count
    clock.t += 6
    stale.observe([5, 5], [1, 1], [7, 7])
    assert stale.check()[0] is StopForced
