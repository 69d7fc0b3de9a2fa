"""`mp` executor: one worker process per device (torch.multiprocessing), queues for jobs and events.

Where the platform has it (Linux, macOS) workers are forked from a forkserver that has already imported torch,
diffusers, transformers and our pipelines (worker_preload.py): a worker starts in well under a second instead of
re-importing ~7 s of libraries, and `prewarm()` starts that server when the pack loads, so the first prompt after a
ComfyUI start does not pay for the imports either. The server never touches CUDA (the forked workers initialise it
themselves). Elsewhere (Windows) workers are spawned.

The driver never blocks on device work: it waits on the event queue with a short timeout, so ComfyUI's Stop, a dead
worker or a progress update are noticed within ~0.1 s. A frozen worker (SIGSTOP, a hung driver call, a deadlocked
collective) is found by the liveness watchdog (liveness.py: heartbeats, step progress, Stop acknowledgements in
lock-free shared memory); it and a Stop the workers do not honour in time kill the whole group, which restarts on
next use.

Signals: workers start with SIGINT blocked (inherited from the spawning thread), then ignore it and leave the host's
process group (worker.leave_terminal_signals), so a terminal's Ctrl-C reaches only the host, which turns it into the
agreed Stop. A worker still ends with its host: on Linux the kernel kills the forkserver when the host dies and a
worker when its forkserver (or spawning host) dies (parent_death.py); elsewhere, and as a fallback, the heartbeat
thread sees the host's sentinel close and exits within ORPHAN_GRACE_S (liveness.py).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import sys
import threading
import time
import types
from typing import Callable, Iterator

from .liveness import Bounds, Watchdog
from .messages import Done, Failed, Job, Progress, Ready, Shutdown

POLL_S = 0.1
PRELOAD_MODULE = __package__ + ".worker_preload"  # what the forkserver imports once (comfyui_h3.backend.executor...)
PRELOAD_PATH_ENV = "COMFYUI_H3_PRELOAD_PATH"  # the PYTHONPATH entry the forkserver was given (worker_preload removes it)


class WorkerDied(RuntimeError):
    pass


class WorkerFailed(RuntimeError):
    def __init__(self, failure: Failed):
        super().__init__(failure.message)
        self.failure = failure


@contextlib.contextmanager
def _spawn_environment():
    """Make a spawned child able to import us and keep it from re-running the host's main script.

    Inside ComfyUI `__main__` is ComfyUI's main.py, which spawn would re-execute in the child; and `comfyui_h3` may
    be registered by path rather than installed. For the instant of `start()` we hide `__main__` and put the folder
    holding `comfyui_h3/` at the END of sys.path (the host's own `nodes` module stays first and already imported)."""
    main = sys.modules.get("__main__")
    root = _package_parent()
    added = root is not None and root not in sys.path
    sys.modules["__main__"] = types.ModuleType("__main__")
    if added:
        sys.path.append(root)
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(root)


@contextlib.contextmanager
def _sigint_blocked():
    """Spawn children with SIGINT blocked (a blocked mask survives fork and exec): a Ctrl-C that lands while a worker
    imports, before it can ignore SIGINT itself, stays pending and is then discarded. Per thread, so it works from
    ComfyUI's execution thread too. The resource tracker is started first: starting it unblocks SIGINT. Windows has
    neither signal masks nor the resource tracker (nor a terminal process group to leave): nothing to do there."""
    if os.name != "posix" or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class SharedCounters:
    """Per-rank liveness counters and the Stop token in shared memory without locks (liveness.py): a worker frozen
    while holding a lock must never block the driver. Each slot has one writer; int64 stores are atomic."""

    def __init__(self, ctx, world: int):
        self.beats = ctx.RawArray("q", world)
        self.marks = ctx.RawArray("q", world)
        self.acks = ctx.RawArray("q", world)
        self.stop = ctx.RawValue("q", 0)

    def snapshot(self) -> tuple[list, list, list]:
        return list(self.beats), list(self.marks), list(self.acks)


def _worker_context():
    """The multiprocessing context workers start from: forkserver (with the preload) where available, else spawn.
    COMFYUI_H3_WORKER_START=spawn forces spawning."""
    import multiprocessing

    import torch.multiprocessing as tmp

    # Linux only: macOS defaults to spawn because forking a process that loaded system frameworks is unsafe there.
    if os.environ.get("COMFYUI_H3_WORKER_START", "") != "spawn" and sys.platform.startswith("linux") \
            and "forkserver" in multiprocessing.get_all_start_methods():
        ctx = tmp.get_context("forkserver")
        ctx.set_forkserver_preload([PRELOAD_MODULE])
        return ctx
    return tmp.get_context("spawn")


@contextlib.contextmanager
def _forkserver_environment():
    """The forkserver inherits the environment at its start, and (Python < 3.13) not the host's sys.path: put the
    folder holding `comfyui_h3/` on its PYTHONPATH so it can import the preload (worker_preload.py takes the entry out
    again), and have torch answer `cuda.is_available()` from NVML there, so an import that asks never initialises
    the CUDA driver in the process the workers are forked from."""
    root = _package_parent()
    changes = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    if _forks_from_a_lasting_thread():  # the server dies with us (parent_death.py): never a lingering importer
        changes["COMFYUI_H3_DIE_WITH_PID"] = str(os.getpid())
    if root:
        changes[PRELOAD_PATH_ENV] = root
        changes["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), root]))
    old = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _forks_from_a_lasting_thread() -> bool:
    """Whether a child started from this thread may ask to die with its parent: the kernel's parent-death signal
    follows the forking thread, and only the main thread lives as long as the process."""
    return threading.current_thread() is threading.main_thread()


def prewarm() -> bool:
    """Start the workers' forkserver now (it imports the heavy libraries in the background); returns whether there
    is one. Cheap and idempotent; the pack calls it when ComfyUI loads it."""
    ctx = _worker_context()
    if ctx.get_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    with _spawn_environment(), _sigint_blocked(), _forkserver_environment():
        forkserver.ensure_running()
    return True


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _package_parent() -> str | None:
    import comfyui_h3

    return os.path.dirname(os.path.dirname(os.path.abspath(comfyui_h3.__file__)))


class MpExecutor:
    def __init__(self, config, bounds: Bounds | None = None):
        self.config = config
        self.bounds = bounds or Bounds.from_env()  # a bad bound in the environment fails here, before any spawn
        self._procs: list = []
        self._commands: list = []
        self._events = None
        self._shared: SharedCounters | None = None
        self._watchdog: Watchdog | None = None
        self._ids = itertools.count(1)
        self.ready: list[Ready] = []

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self, on_wait: Callable[[], None] | None = None) -> None:
        from .worker import worker_main

        bounds = self.bounds
        ctx = _worker_context()
        self._events = ctx.Queue()
        n = self.config.world_size
        self._shared = SharedCounters(ctx, n)
        self._watchdog = Watchdog(n, bounds)
        port = _free_port() if n > 1 else 0
        # A forked worker's parent is the forkserver's one thread; a spawned one's is this thread.
        die_with_parent = ctx.get_start_method() == "forkserver" or _forks_from_a_lasting_thread()
        with _spawn_environment(), _sigint_blocked(), _forkserver_environment():
            try:
                for rank in range(n):
                    commands = ctx.Queue()
                    proc = ctx.Process(target=worker_main, name=f"comfyui-h3-worker-{rank}", daemon=True,
                                       args=(rank, n, self.config, commands, self._events, self._shared, port,
                                             bounds.heartbeat_s, die_with_parent))
                    proc.start()
                    self._procs.append(proc)
                    self._commands.append(commands)
            except BaseException:  # a rank that cannot start (no forkserver, EMFILE): none of the others may
                self.kill()  # go on loading a model no one owns
                raise
        while len(self.ready) < n:
            msg = self._next_event(on_wait)
            if isinstance(msg, Ready):
                self.ready.append(msg)
            elif isinstance(msg, Failed):
                self.shutdown()
                raise WorkerFailed(msg)
        self._watchdog.loaded()

    def _next_event(self, on_wait: Callable[[], None] | None = None):
        while True:
            events = self._events
            if events is None:  # killed from another thread (interpreter exit)
                raise WorkerDied("The workers were stopped (the host is exiting); the engine restarts on next use.")
            try:
                return events.get(timeout=POLL_S)
            except queue.Empty:
                pass
            except (OSError, ValueError):  # the queue was closed under us by a kill from another thread
                if self._events is None:
                    continue
                raise
            if not all(p.is_alive() for p in self._procs):
                codes = [p.exitcode for p in self._procs]
                self.shutdown()
                raise WorkerDied(f"A worker process died (exit codes {codes}); the engine restarts on next use.")
            self._watch()
            if on_wait is not None:
                on_wait()

    def _watch(self) -> None:
        """Kill the group and raise (WorkerHung / StopForced) when the watchdog says a rank is frozen or a Stop
        went unanswered."""
        self._watchdog.observe(*self._shared.snapshot())
        verdict = self._watchdog.check()
        if verdict is not None:
            error, message = verdict
            self.kill()
            raise error(message)

    def run(self, kind: str, request, should_cancel: Callable[[], bool] | None = None,
            live: dict | None = None) -> Iterator:
        """Submit one job (`live`: the engine's live options); yield Progress events; return the result (via
        StopIteration value) or raise."""
        job = Job(next(self._ids), kind, request, live)
        self._shared.stop.value = 0
        self._watchdog.job_started()
        for commands in self._commands:
            commands.put(job)

        def check_cancel():
            if should_cancel is not None and should_cancel():
                self._shared.stop.value = job.job_id
                self._watchdog.stop_requested(job.job_id)

        try:
            while True:
                msg = self._next_event(check_cancel)
                if isinstance(msg, Progress) and msg.job_id == job.job_id:
                    check_cancel()
                    yield msg
                elif isinstance(msg, Done) and msg.job_id == job.job_id:
                    return msg.result
                elif isinstance(msg, Failed) and msg.job_id == job.job_id:
                    if msg.kind == "cancelled" and msg.rank != 0 and len(self._procs) > 1:
                        continue  # every rank stops at the same boundary; rank 0's report says what was kept
                        # (an extension's finished windows, published while the others have already reported)
                    self._raise_if_a_rank_died(msg)
                    raise WorkerFailed(msg)
        finally:
            if self._watchdog is not None:
                self._watchdog.job_ended()

    def _raise_if_a_rank_died(self, failure: Failed, grace_s: float = 1.0) -> None:
        """When one rank dies its peers fail in their next collective, often before the driver's next poll: name
        the dead rank rather than the peer's transport error."""
        if failure.kind != "error" or len(self._procs) < 2:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            dead = [(rank, p.exitcode) for rank, p in enumerate(self._procs) if not p.is_alive()]
            if dead:
                self.shutdown(timeout=2.0)
                raise WorkerDied(f"Worker rank(s) {[r for r, _ in dead]} died (exit codes {[c for _, c in dead]}); "
                                 "the engine restarts on next use.")
            time.sleep(0.05)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask every rank to exit, give them `timeout` seconds together, then kill what is left."""
        for commands in self._commands:
            with contextlib.suppress(Exception):
                commands.put(Shutdown())
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank (it works on a stopped process too) with anything it started in its process group, and
        drop the queues without waiting on a pipe no one reads."""
        for proc in self._procs:
            _kill_process_group(proc)
        for proc in self._procs:
            proc.join(5)
        queues = [q for q in [*self._commands, self._events] if q is not None]
        for q in queues:
            with contextlib.suppress(Exception):
                q.cancel_join_thread()  # a Job still in a dead worker's pipe must not hang our exit
                q.close()
        # Each queue's feeder thread holds two of its semaphores until it has seen the close: let it go (briefly;
        # never on a pipe no one reads), so they are released with the queue, not reported as leaked at exit.
        deadline = time.monotonic() + 0.5
        for q in queues:
            feeder = getattr(q, "_thread", None)
            if feeder is not None:
                feeder.join(max(0.0, deadline - time.monotonic()))
        self._procs, self._commands, self.ready = [], [], []
        self._events = None


def _kill_process_group(proc) -> None:
    """SIGKILL a worker and, when it leads its own process group (it moves there at start), the whole group."""
    if proc.pid is None or proc.exitcode is not None:
        return
    if hasattr(os, "killpg"):  # POSIX; on Windows proc.kill() below ends the worker
        with contextlib.suppress(OSError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()
