"""Engine: one per loaded model configuration; owns the worker processes, persists across prompts.

`generate()` is the single entry the nodes and the CLI use. The same path serves 1 CPU, 1 GPU and (later) N GPUs.
Failures come back as EngineError subclasses with a one-line message fit for a node error (a worker's traceback goes
to the `comfyui_h3.worker` log: ComfyUI's console, or the CLI's stderr with COMFYUI_H3_DEBUG=1); a dead or frozen
worker is detected and the engine starts fresh on the next call.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections import OrderedDict
from typing import Callable

from .engine_config import EngineConfig
from .executor.liveness import StopForced, WorkerHung
from .executor.mp_executor import MpExecutor, WorkerDied, WorkerFailed
from .errors import RequestError

log = logging.getLogger("comfyui_h3.worker")
CAUSE_CHARS = 500  # a node error's cause is one line; the whole report is in the log


class EngineError(RuntimeError):
    """A generation that failed; the message says why. The engine stays usable."""


class EngineOutOfMemory(EngineError):
    pass


class EngineCancelled(EngineError):
    """Stopped by the caller. `extra`: what the job kept (an extension's finished windows: path, frames)."""

    def __init__(self, message: str, extra: dict | None = None):
        super().__init__(message)
        self.extra = dict(extra or {})


class Engine:
    def __init__(self, config: EngineConfig):
        config.validate()
        self.config = config
        self._executor = None  # MpExecutor | RayExecutor
        self._request = None  # the request running now (its stream temporaries go if the workers are killed)
        self._lock = threading.RLock()

    @property
    def started(self) -> bool:
        return self._executor is not None and self._executor.alive

    def start(self, should_cancel: Callable[[], bool] | None = None, config: EngineConfig | None = None) -> None:
        """Start the workers if they are not running; `config`: the one they load (default: the engine's; the
        reload after a refused live switch loads the job's own, which differs at most in live options)."""
        with self._lock:
            if self.started:
                return
            if self._executor is not None:  # died since last use
                self._executor.shutdown()
            try:
                executor = make_executor(config or self.config)
            except (ImportError, ValueError) as exc:  # an optional executor's package is missing: say what to
                raise EngineError(str(exc)) from None  # install; a liveness bound in the environment is not a number

            def check_stop():  # Stop during a (minutes-long) model load ends the load too
                if should_cancel is not None and should_cancel():
                    raise EngineCancelled("Stopped while the model was loading.")

            try:
                executor.start(on_wait=check_stop)
            except (KeyboardInterrupt, SystemExit):  # the host is quitting mid-load: no rank may go on loading
                _kill(executor)
                raise
            except EngineCancelled:
                executor.shutdown(timeout=2.0)
                raise
            except StopForced as exc:
                raise EngineCancelled(str(exc)) from None
            except WorkerFailed as exc:
                raise EngineError(worker_cause(exc.failure)) from None
            except (WorkerDied, WorkerHung) as exc:
                raise EngineError(str(exc)) from None
            except OSError as exc:  # no process could be started (fork/spawn refused, out of file descriptors)
                _kill(executor)
                raise EngineError(f"Could not start the worker processes: {exc}") from None
            self._executor = executor

    def generate(self, request, progress: Callable[[int, int], None] | None = None,
                 should_cancel: Callable[[], bool] | None = None, config: EngineConfig | None = None):
        """Run one request. `progress(done, total)` after every step; steps carrying a live preview (a request with
        preview_every set) call `progress(done, total, preview=uint8 [H, W, 3])`. `config`: the config the caller
        got this engine for (default: the engine's own): its live options are what the job runs with, even when
        another caller has retargeted the engine since (get_engine)."""
        request.validate()  # fail fast on the driver: bad input never reaches (or starts) a worker
        _touch(self.config)  # before our own lock: eviction takes the registry's lock, then an engine's
        with self._lock, _job_running():
            config = config or self.config
            if config.identity() != self.config.identity():
                raise ValueError("generate's config is another model than this engine's")
            was_started = self.started
            self.start(should_cancel)
            load_s = None if was_started else _load_seconds(self._executor)  # this request started the engine
            try:
                return self._run(config, request, progress, should_cancel, load_s)
            except _Reload as reload:  # the workers could not take the live options in place: start with them
                log.info("Live options not taken in place (%s): starting the workers again", reload.message)
                self._executor.shutdown(timeout=10.0)
                self._executor = None
                self.start(should_cancel, config)
                return self._run(config, request, progress, should_cancel, _load_seconds(self._executor),
                                 reload.message)

    def retarget(self, config: EngineConfig) -> None:
        """Serve `config` from now on: one differing from this engine's only in live options (families.py). The
        next job carries them to the workers, which switch in place (a job running now keeps its own)."""
        if config.identity() != self.config.identity():
            raise ValueError("an engine can only be retargeted to a config that differs in live options")
        self.config = config

    def _run(self, config: EngineConfig, request, progress, should_cancel, load_s, reloaded: str | None = None):
        """One job on the started workers (generate's body, under the engine's lock)."""
        runner = self._executor.run(config.family, request, should_cancel, live=config.live_state())
        self._request = request
        try:
            while True:
                event = next(runner)
                if progress is not None:
                    if event.preview is None:
                        progress(event.done, event.total)
                    else:  # only requests that ask for previews get them (H3's preview_every)
                        progress(event.done, event.total, preview=event.preview)
        except StopIteration as stop:
            result = _with_engine_manifest(stop.value, config, load_s)
            if reloaded is not None:
                _note_reload(result, reloaded)
            return result
        except WorkerFailed as exc:
            failure = exc.failure
            if failure.kind == "request":
                raise RequestError(failure.message) from None
            if failure.kind == "reload" and reloaded is None:
                raise _Reload(failure.message) from None
            if failure.kind == "cancelled":
                raise EngineCancelled(failure.message, failure.extra) from None
            if self.config.world_size > 1:
                # One rank failed mid-step: the others are blocked in a collective. Restart the group.
                self._executor.shutdown(timeout=2.0)
                self._executor = None
            if failure.kind == "oom":
                raise EngineOutOfMemory(worker_cause(failure)) from None
            raise EngineError(worker_cause(failure)) from None
        except StopForced as exc:  # the workers did not stop in time and were killed: still a Stop
            self._executor = None
            _discard_stream_temporaries(request)
            raise EngineCancelled(str(exc)) from None
        except (WorkerDied, WorkerHung) as exc:
            self._executor = None
            _discard_stream_temporaries(request)
            raise EngineError(str(exc)) from None
        except BaseException:  # KeyboardInterrupt / SystemExit mid-job (a CLI's second Ctrl-C): the ranks are
            if self._executor is not None:  # inside a step and would not read a Shutdown until the job ends
                _kill(self._executor)
            self._executor = None
            _discard_stream_temporaries(request)
            raise
        finally:
            self._request = None

    def shutdown(self, wait_s: float | None = None, timeout: float = 10.0) -> None:
        """Stop the workers (`timeout`: how long they get to leave by themselves). `wait_s`: wait at most this long
        for a job in another thread to let go of the engine, then kill the workers outright (at interpreter exit:
        workers ignore the terminal's Ctrl-C, so a running job would otherwise hold the exit up until it ends)."""
        if wait_s is not None and not self._lock.acquire(timeout=wait_s):
            self.kill()
            return
        if wait_s is None:
            self._lock.acquire()
        try:
            if self._executor is not None:
                self._executor.shutdown(timeout=timeout)
                self._executor = None
        finally:
            self._lock.release()

    def kill(self) -> None:
        """SIGKILL the workers now, without the engine's lock (a job in another thread sees WorkerDied), and remove
        the running request's stream temporaries (the killed worker cannot)."""
        executor, request = self._executor, self._request
        if executor is not None:
            _kill(executor)
        if request is not None:
            _discard_stream_temporaries(request)


class _Reload(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _note_reload(result, why: str) -> None:
    """The manifest says the live options were taken by starting the workers again, and why."""
    manifest = getattr(result, "manifest", None)
    if isinstance(manifest, dict):
        manifest["engine"]["live_switch"] = {"in_place": False, "why": why}


def _kill(executor) -> None:
    """End an executor's workers now: the mp executor SIGKILLs them; Ray's kills its actors (its shutdown)."""
    kill = getattr(executor, "kill", None)
    if kill is not None:
        kill()
    else:
        executor.shutdown(timeout=0.0)


def _load_seconds(executor) -> float | None:
    """The slowest rank's load time (the engine was ready when the last rank was)."""
    ready = getattr(executor, "ready", None) or []
    return max((float(r.load_s) for r in ready), default=None)


def _with_engine_manifest(result, config: EngineConfig, load_s: float | None):
    """A family's result with a stage manifest (a dict attribute `manifest`) gets the engine's fields."""
    manifest = getattr(result, "manifest", None)
    if isinstance(manifest, dict):
        from .manifest import engine_part

        engine_part(manifest, config, load_s)
    return result


def worker_cause(failure) -> str:
    """A worker's failure as the node / CLI shows it: its cause on one line. The whole report (a multi-line message,
    the worker's traceback) goes to the log, where a developer looks."""
    if failure.traceback or "\n" in failure.message.strip():
        log.error("MiniMax-H3 worker failed: %s\n%s", failure.message, failure.traceback.rstrip())
    cause = " ".join(line.strip() for line in failure.message.splitlines() if line.strip())
    if len(cause) > CAUSE_CHARS:
        cause = cause[:CAUSE_CHARS].rstrip() + " ... (the whole report is in the log)"
    return cause


_JOBS = [0]  # requests inside Engine.generate (loading or running), all engines together
_JOBS_LOCK = threading.Lock()


@contextlib.contextmanager
def _job_running():
    with _JOBS_LOCK:
        _JOBS[0] += 1
    try:
        yield
    finally:
        with _JOBS_LOCK:
            _JOBS[0] -= 1


def jobs_running() -> int:
    """How many requests are in an engine now (loading or running): while one is, a Stop asked through
    `should_cancel` is honoured at the next step boundary, and a host can keep what the job finished. The CLI's
    signal handler asks this to choose between that Stop and quitting at once."""
    return _JOBS[0]


def _discard_stream_temporaries(request) -> None:
    """A worker killed while streaming a request's output file (an extension) leaves the encoder's hidden temporary
    beside it (media.encode: `.<name>.<random>.tmp`, never published): remove it. The final name is reserved by the
    caller, so only that worker wrote such files."""
    path = getattr(request, "output_path", None)
    if not path:
        return
    folder, name = os.path.split(os.path.abspath(path))
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for entry in names:
        if entry.startswith(f".{name}.") and entry.endswith(".tmp"):
            try:
                os.unlink(os.path.join(folder, entry))
            except OSError:
                pass


def make_executor(config: EngineConfig):
    """The executor config.executor names: "mp" (processes on this machine) or "ray" (actors on a Ray cluster; an
    optional extra, imported only when chosen). Both have one interface: start / alive / run / shutdown."""
    if config.executor == "ray":
        from .executor.ray_executor import RayExecutor

        return RayExecutor(config)
    return MpExecutor(config)


_ENGINES: "OrderedDict[EngineConfig, Engine]" = OrderedDict()  # least recently used first
_REGISTRY_LOCK = threading.Lock()
EXIT_WAIT_S = 0.2  # at interpreter exit, how long a job in another thread may hold an engine before it is killed
EXIT_SHUTDOWN_S = 1.0  # how long idle workers get to leave by themselves before they are killed


def _shutdown_at_exit() -> None:
    """Workers never outlive the process that started them, and never hold its exit up (a clean exit in well under
    2 s): idle workers are asked to leave, and a job still running in another thread (ComfyUI's prompt thread on
    Ctrl-C) has its workers killed at once (they ignore the terminal's Ctrl-C)."""
    got = _REGISTRY_LOCK.acquire(timeout=EXIT_WAIT_S)
    try:
        engines = list(_ENGINES.values())
    finally:
        if got:
            _REGISTRY_LOCK.release()
    for engine in engines:
        engine.shutdown(wait_s=EXIT_WAIT_S, timeout=EXIT_SHUTDOWN_S)


def kill_all() -> None:
    """SIGKILL every engine's workers now, taking no lock (a signal handler's last act before its process ends: a
    job in another thread fails with WorkerDied, if it runs at all). The stream temporaries of running jobs are
    removed, and the queues are dropped, so their semaphores are released rather than reported as leaked."""
    for engine in list(_ENGINES.values()):
        engine.kill()


atexit.register(_shutdown_at_exit)


def get_engine(config: EngineConfig) -> Engine:
    """The engine for this configuration. Engines of several configurations stay resident together (an H3 engine and
    an upscaler on the same or other GPUs: a workflow moving between them never restarts workers); when a new one
    would not fit beside them in a device's budget (memory_budget_bytes), the least recently used engines sharing a
    device with it are shut down first."""
    with _REGISTRY_LOCK:
        engine = _ENGINES.get(config)
        if engine is not None:
            _ENGINES.move_to_end(config)
            return engine
        engine = _live_match(config)
        if engine is not None:  # the same model with other live options (H3's LoRAs): switched, not reloaded
            config.validate()  # what Engine() would check (a LoRA file that does not fit is refused here)
            del _ENGINES[engine.config]
            engine.retarget(config)
            _ENGINES[config] = engine
            return engine
        engine = Engine(config)  # validates: a bad config evicts nothing
        for other in _to_evict(config, list(_ENGINES.values())):
            other.shutdown()
            del _ENGINES[other.config]
        _ENGINES[config] = engine
        return engine


def _live_match(config: EngineConfig) -> Engine | None:
    """A resident engine whose config differs from `config` only in live options (the most recently used), under
    the registry's lock."""
    try:
        identity = config.identity()
    except Exception:  # noqa: BLE001 - an unknown family: Engine() says so
        return None
    if identity is config:
        return None
    for other in reversed(list(_ENGINES.values())):
        if other.config.family == config.family and other.config.identity() == identity:
            return other
    return None


def _touch(config: EngineConfig) -> None:
    """Mark an engine as the most recently used (a generate counts as a use)."""
    with _REGISTRY_LOCK:
        if config in _ENGINES:
            _ENGINES.move_to_end(config)


def _to_evict(config: EngineConfig, resident: list[Engine]) -> list[Engine]:
    """Least recently used first, the engines to shut down so `config` fits every device it uses."""
    need = engine_bytes(config)
    evict: list[Engine] = []
    for device in set(config.devices()):
        budget = memory_budget_bytes(device)
        sharing = [e for e in resident if device in e.config.devices() and e not in evict]
        held = sum(engine_bytes(e.config) for e in sharing)
        for other in sharing:  # oldest first
            if held + need <= budget:
                break
            evict.append(other)
            held -= engine_bytes(other.config)
    return evict


def engine_bytes(config: EngineConfig) -> int:
    try:
        return int(config.family_impl().memory_bytes(config))
    except Exception:  # noqa: BLE001 - an unknown size never blocks a load; it just counts as nothing
        return 0


def memory_budget_bytes(device: str) -> int:
    """What engines may hold on `device`: COMFYUI_H3_ENGINE_BUDGET_GB when set, else 90% of the GPU's memory, or
    80% of the host's memory for the CPU."""
    override = os.environ.get("COMFYUI_H3_ENGINE_BUDGET_GB")
    if override:
        return int(float(override) * 2**30)
    if device.startswith("cuda"):
        try:
            import torch

            index = int(device.split(":", 1)[1]) if ":" in device else 0
            return int(0.9 * torch.cuda.get_device_properties(index).total_memory)
        except Exception:  # noqa: BLE001
            pass
    try:
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def resident_engines() -> list[EngineConfig]:
    """The configurations with an engine in the registry, least recently used first."""
    with _REGISTRY_LOCK:
        return list(_ENGINES)


def shutdown_all() -> int:
    """Stop every engine's workers (ComfyUI's "free memory"); returns how many were running."""
    with _REGISTRY_LOCK:
        running = sum(1 for e in _ENGINES.values() if e.started)
        for engine in _ENGINES.values():
            engine.shutdown()
        return running
