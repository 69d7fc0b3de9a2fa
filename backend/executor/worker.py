"""Worker rank: load the model once, then serve jobs until told to stop.

The per-job part (`run_job`: run the pipeline with progress and Stop, map every exception to a `Failed` kind) and the
start-up part (`setup_rank`: threads, process group, pipeline) are shared by both executors: `worker_main` is the
`mp` process loop, `ray_executor._RankActor` the Ray actor. A job's failure never kills the worker: it is reported
(OOM as its own kind, with the cache emptied) and the worker goes on. Cancellation is a flag the driver sets; the
pipeline checks it at every denoise-step boundary, and with several ranks all-reduces it so every rank stops at the
same boundary. A heartbeat thread and the step boundaries report the rank's liveness to the driver (liveness.py).
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Callable

PARENT_POLL_S = 1.0
ORPHAN_GRACE_S = 3.0  # a host gone: time for the main thread to leave at a step boundary before the heartbeat exits


def setup_rank(rank: int, world_size: int, engine_config, master_addr: str = "127.0.0.1", master_port: int = 0,
               device: str | None = None):
    """Threads, the process group (world > 1) and the pipeline of one rank. `device` overrides the config's
    placement (a Ray actor sees only its own GPU, as cuda:0). Returns (pipeline, Ready)."""
    import torch

    from .messages import Ready

    torch.set_grad_enabled(False)
    if engine_config.cpu_threads:
        torch.set_num_threads(engine_config.cpu_threads)
    device = device or engine_config.device_for(rank)
    t0 = time.perf_counter()
    if world_size > 1:
        _init_process_group(rank, world_size, device, master_addr, master_port or engine_config.master_port)
    pipeline = engine_config.build_pipeline(rank, device=device)
    return pipeline, Ready(rank, time.perf_counter() - t0, device, preloaded=_preloaded())


def _preloaded() -> bool:
    import sys

    preload = sys.modules.get(__package__ + ".worker_preload")
    return preload is not None and not preload.failed


def load_failure(exc: BaseException):
    from .messages import Failed

    return Failed(None, "error", f"Loading the model failed: {type(exc).__name__}: {exc}", traceback.format_exc())


def run_job(pipeline, rank: int, job, emit: Callable[[object], None] | None, should_stop: Callable[[], bool],
            family: str | None = None):
    """One job on one rank -> Done (rank 0 carries the result; other ranks Done(None)) or Failed (naming its rank).
    Never raises. `emit` receives rank 0's Progress messages. `family`: the model family this rank's pipeline belongs
    to; a job for another family is refused."""
    outcome = _run_job(pipeline, rank, job, emit, should_stop, family)
    if hasattr(outcome, "rank"):
        outcome.rank = rank
    return outcome


def _run_job(pipeline, rank: int, job, emit: Callable[[object], None] | None, should_stop: Callable[[], bool],
             family: str | None = None):
    import torch

    from ..errors import Cancelled, ReloadNeeded, RequestError
    from .messages import Done, Failed, Progress

    if family is not None and job.kind != family:
        return Failed(job.job_id, "error", f"This worker runs the {family!r} model family, not {job.kind!r}.")

    on_step = None
    if rank == 0 and emit is not None:
        def on_step(done: int, total: int, preview=None, job_id=job.job_id) -> None:
            emit(Progress(job_id, done, total, preview))

    try:
        with torch.no_grad():
            if job.live is not None:  # the engine's live options (families.py): switched in place, or ReloadNeeded
                pipeline.set_live_options(job.live)
            result = pipeline.run(job.request, on_step=on_step, should_stop=should_stop)
        return Done(job.job_id, result if rank == 0 else None)
    except Cancelled as exc:
        return Failed(job.job_id, "cancelled", str(exc), extra=dict(getattr(exc, "extra", None) or {}))
    except RequestError as exc:
        return Failed(job.job_id, "request", str(exc))
    except ReloadNeeded as exc:
        return Failed(job.job_id, "reload", str(exc))
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        return Failed(job.job_id, "oom", f"Out of GPU memory: {exc}", traceback.format_exc())
    except BaseException as exc:  # noqa: BLE001 - everything must reach the driver as a message
        return Failed(job.job_id, "error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def leave_terminal_signals() -> None:
    """First thing in a worker: a terminal's Ctrl-C (SIGINT to the whole foreground process group) is the host's to
    turn into Stop, never a KeyboardInterrupt here. The worker ignores SIGINT, then unblocks it (the host spawned it
    blocked, so one sent meanwhile was held and is now discarded), and moves to its own process group: the
    terminal's other job-control signals reach only the host too, and the host can kill a worker with whatever it
    started. It still exits with its host (the parent-death signal, the parent poll in worker_main, the heartbeat)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(0, 0)
        except OSError:  # already a group or session leader: nothing to leave
            pass


def worker_main(rank: int, world_size: int, engine_config, commands, events, shared, master_port: int = 0,
                heartbeat_s: float = 60.0, die_with_parent: bool = False) -> None:
    """The `mp` executor's process: beat, load, report Ready (or Failed), then serve Jobs from `commands`.
    `shared`: mp_executor.SharedCounters (this rank's heartbeat, step marks and Stop acknowledgement; the Stop token).
    `die_with_parent`: the parent's forking thread lasts as long as it does (parent_death.py): ask the kernel to kill
    this rank with it."""
    import multiprocessing
    import queue

    from .liveness import Heartbeat
    from .messages import Failed, Job, Shutdown

    if die_with_parent:
        from .parent_death import die_with_parent as arm

        arm()
    leave_terminal_signals()
    _thread_lock_for_progress_bars()
    host = multiprocessing.parent_process()  # the process that started us (its sentinel, not our parent pid: a
    # forkserver, not the host, is the parent of a forked worker)

    def orphaned() -> bool:
        # A host killed without running its exit hooks (SIGKILL, a container stop) must not leave a 60 GB model
        # resident: the worker notices its host is gone and exits (at a step boundary, or through the heartbeat
        # thread when the main thread is stuck).
        return host is not None and not host.is_alive()

    def beat() -> None:
        shared.beats[rank] += 1

    def ack(token: int) -> None:
        shared.acks[rank] = token

    if orphaned():  # the host died before the parent-death signal was armed
        os._exit(3)
    # No one reads a dead host's results: a rank whose main thread does not leave at a step boundary soon after
    # (one long batch, a stuck call) is ended by its heartbeat thread.
    Heartbeat(beat, ack, lambda: shared.stop.value, orphaned, orphan_grace_s=min(heartbeat_s, ORPHAN_GRACE_S)).start()

    try:
        pipeline, ready = setup_rank(rank, world_size, engine_config, "127.0.0.1", master_port)
        events.put(ready)
    except BaseException as exc:  # noqa: BLE001
        events.put(load_failure(exc))
        return

    def should_stop() -> bool:  # called at every step boundary: also this rank's progress mark
        shared.marks[rank] += 1
        return shared.stop.value != 0 or orphaned()

    while True:
        try:
            msg = commands.get(timeout=PARENT_POLL_S)
        except queue.Empty:
            if orphaned():
                break
            continue
        if isinstance(msg, Shutdown):
            break
        if not isinstance(msg, Job):
            continue
        shared.marks[rank] += 1
        outcome = run_job(pipeline, rank, msg, events.put, should_stop, engine_config.family)
        if rank == 0 or isinstance(outcome, Failed):  # other ranks' results are rank 0's
            events.put(outcome)
    close_process_group()


def _thread_lock_for_progress_bars() -> None:
    """tqdm (the libraries' loading bars) otherwise makes a multiprocessing lock, a named semaphore owned by the
    host's resource tracker: a rank killed by SIGKILL (a Stop not honoured in time, the host's shutdown) never
    unlinks it, and the tracker reports it as leaked when the host exits. A thread lock serves one process's bars."""
    import threading

    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def close_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _init_process_group(rank: int, world_size: int, device: str, master_addr: str, master_port: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        # NCCL for the CUDA tensors (the all-to-alls, the gathers); gloo for the few CPU ones (the Stop flag's
        # all-reduce in SequenceShard.any), which NCCL alone refuses.
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    # A rank that dies leaves the others blocked in a collective; the driver notices the death within a poll and
    # kills the group, and the timeout bounds any hang the driver cannot see.
    dist.init_process_group(backend, init_method=f"tcp://{_url_host(master_addr)}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(minutes=10))


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
