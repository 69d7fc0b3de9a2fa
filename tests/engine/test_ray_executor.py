"""The `ray` executor: worker ranks as Ray actors (here a local Ray, 2 CPU actors, gloo) behave like the `mp` ones.

Two actor ranks equal the single-rank pipeline (final latents <= 1e-4); progress arrives; Stop ends every rank at the
same step and the next prompt runs; a killed actor becomes an EngineError and the next prompt restarts the group; a
frozen (SIGSTOPped) actor is an error within the heartbeat bound, and Stop returns within seconds even then; a local
Ray the executor started itself is shut down with it; without Ray, choosing it says what to install.
Ray starts once for the module (a local Ray takes seconds to start)."""

import importlib.util
import sys

import pytest

from comfyui_h3.backend.engine import Engine, EngineCancelled, EngineError
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.request import H3Request

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason='Ray is not installed (pip install "comfyui-h3[ray]")')


def small(**kw):
    base = dict(prompt="thunder over hills", num_frames=124, steps=3, seed=9, width=64, height=64)
    base.update(kw)
    return H3Request(**base)


def config(tiny_h3_dir, **kw):
    base = dict(dtype="float32", cpu_threads=1, executor="ray")
    base.update(kw)
    return h3_config(str(tiny_h3_dir), **base)


def test_without_ray_the_error_says_what_to_install(tiny_h3_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    eng = Engine(config(tiny_h3_dir))
    with pytest.raises(EngineError, match=r'pip install "comfyui-h3\[ray\]"'):
        eng.generate(small(steps=1))
    assert not eng.started


def test_config_checks(tiny_h3_dir):
    with pytest.raises(ValueError, match="available: 'mp', 'ray'"):
        h3_config(str(tiny_h3_dir), executor="slurm").validate()
    with pytest.raises(ValueError, match="ray executor device is 'cpu' or 'cuda'"):
        h3_config(str(tiny_h3_dir), executor="ray", device="cuda:1").validate()
    assert h3_config(str(tiny_h3_dir)).executor == "mp"


@pytest.mark.slow
@needs_ray
def test_local_ray_is_started_and_stopped_by_the_executor(tiny_h3_dir):
    """Runs before the module's shared Ray exists: an empty address starts a local Ray, shutdown stops it."""
    import ray

    assert not ray.is_initialized()
    eng = Engine(config(tiny_h3_dir, ray_address="local"))
    try:
        assert eng.generate(small(steps=1, decode=False)).video_latents is not None
        assert ray.is_initialized() and eng.started
    finally:
        eng.shutdown()
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_cluster():
    if not HAVE_RAY:
        pytest.skip('Ray is not installed (pip install "comfyui-h3[ray]")')
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def engine(ray_cluster, tiny_h3_dir):
    eng = Engine(config(tiny_h3_dir, world_size=2))
    yield eng
    eng.shutdown()
    assert ray_cluster.is_initialized()  # a Ray the host started stays up


@pytest.fixture(scope="module")
def single(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0).run(small())


@pytest.mark.slow
def test_two_actor_ranks_equal_one_rank(engine, single):
    seen = []
    got = engine.generate(small(), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert sorted(r.rank for r in engine._executor.ready) == [0, 1]
    for key in ("video_latents", "audio_latents"):
        a, b = getattr(got, key), getattr(single, key)
        assert ((a - b).norm() / b.norm()).item() <= 1e-4
    assert (got.frames.int() - single.frames.int()).abs().max() <= 1


def test_stop_on_every_rank_then_next_prompt(engine):
    seen = []
    with pytest.raises(EngineCancelled):
        engine.generate(small(steps=20), progress=lambda d, t: seen.append(d), should_cancel=lambda: bool(seen))
    assert 1 <= len(seen) < 20
    actors = list(engine._executor._actors)
    assert engine.generate(small(steps=1, decode=False)).video_latents is not None  # both ranks still in step
    assert engine._executor._actors == actors  # the same actors, the model stayed loaded


@pytest.mark.slow
def test_killed_actor_is_an_error_and_the_group_restarts(engine, ray_cluster):
    engine.start()
    victim = engine._executor._actors[1]
    with pytest.raises(EngineError, match="died"):
        engine.generate(small(steps=40), progress=lambda d, t: ray_cluster.kill(victim, no_restart=True))
    assert engine.generate(small(steps=1, decode=False)).video_latents is not None  # a fresh group
    assert victim not in engine._executor._actors


def _freeze_on_first_step(pid, stamp):
    import os
    import signal
    import time

    def progress(done, total):
        if not stamp:
            stamp.append(time.monotonic())
            os.kill(pid, signal.SIGSTOP)
    return progress


def _gone(pid, within_s=20.0):
    import os
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_frozen_actor_is_an_error_within_the_bound_and_the_group_restarts(engine, ray_cluster, monkeypatch):
    """A SIGSTOPped actor is not dead to Ray: its missing heartbeats are what tell (the bound shortened here)."""
    import time

    from comfyui_h3.backend.executor.liveness import ENV_WORKER

    monkeypatch.setenv(ENV_WORKER, "4")
    engine.shutdown()  # the next start reads the bound
    engine.start()
    victim = engine._executor._actors[1]
    pid = ray_cluster.get(victim.ping.remote())
    frozen = []
    with pytest.raises(EngineError, match=rf"rank 1 sent no heartbeat for 4 s \({ENV_WORKER}\)") as info:
        engine.generate(small(steps=40, decode=False), progress=_freeze_on_first_step(pid, frozen))
    assert "\n" not in str(info.value)
    assert time.monotonic() - frozen[0] < 4 + 12
    assert _gone(pid), "the frozen actor is still there"
    assert engine.generate(small(steps=1, decode=False)).video_latents is not None  # a fresh group
    assert victim not in engine._executor._actors


@pytest.mark.slow
def test_stop_with_a_frozen_actor_returns_within_seconds(engine, ray_cluster, monkeypatch):
    import time

    from comfyui_h3.backend.executor.liveness import ENV_WORKER

    monkeypatch.delenv(ENV_WORKER, raising=False)  # the default 60 s bound: it is Stop that must end the wait
    engine.shutdown()
    engine.start()
    pid = ray_cluster.get(engine._executor._actors[0].ping.remote())
    frozen = []
    with pytest.raises(EngineCancelled, match="did not answer the Stop"):
        engine.generate(small(steps=40, decode=False), progress=_freeze_on_first_step(pid, frozen),
                        should_cancel=lambda: bool(frozen))
    assert time.monotonic() - frozen[0] < 15
    assert _gone(pid)
    assert engine.generate(small(steps=1, decode=False)).video_latents is not None
