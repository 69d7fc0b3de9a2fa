"""Worker process main: load the model once, then serve jobs until told to stop.

A job's failure never kills the worker: it is reported (OOM as its own kind, with the cache emptied) and the loop
goes on. Cancellation is a shared event the driver sets; the pipeline checks it at every denoise-step boundary.
"""

from __future__ import annotations

import os
import time
import traceback


PARENT_POLL_S = 1.0


def worker_main(rank: int, world_size: int, engine_config, commands, events, cancel_event, parent_pid: int,
                master_port: int = 0) -> None:
    import queue

    import torch

    from ..pipelines.h3.geometry import RequestError
    from ..pipelines.h3.pipeline import Cancelled
    from .messages import Done, Failed, Job, Progress, Ready, Shutdown

    torch.set_grad_enabled(False)
    if engine_config.cpu_threads:
        torch.set_num_threads(engine_config.cpu_threads)
    try:
        t0 = time.perf_counter()
        if world_size > 1:
            _init_process_group(rank, world_size, engine_config, master_port)
        pipeline = engine_config.build_pipeline(rank)
        events.put(Ready(rank, time.perf_counter() - t0, str(engine_config.device)))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the driver as a message
        events.put(Failed(None, "error", f"Loading the model failed: {type(exc).__name__}: {exc}",
                          traceback.format_exc()))
        return

    def orphaned() -> bool:
        # A host killed without running its exit hooks (SIGKILL, a container stop) must not leave a 60 GB model
        # resident: the worker notices its parent is gone and exits.
        return os.getppid() != parent_pid

    def should_stop() -> bool:
        return cancel_event.is_set() or orphaned()

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
        try:
            result = pipeline.run(
                msg.request,
                on_step=(lambda done, total, job=msg.job_id: events.put(Progress(job, done, total)))
                if rank == 0 else None,
                should_stop=should_stop,
            )
            if rank == 0:
                events.put(Done(msg.job_id, result))
        except Cancelled as exc:
            events.put(Failed(msg.job_id, "cancelled", str(exc)))
        except RequestError as exc:
            events.put(Failed(msg.job_id, "request", str(exc)))
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            events.put(Failed(msg.job_id, "oom", f"Out of GPU memory: {exc}", traceback.format_exc()))
        except BaseException as exc:  # noqa: BLE001
            events.put(Failed(msg.job_id, "error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    if world_size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _init_process_group(rank: int, world_size: int, cfg, master_port: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    device = cfg.device_for(rank)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(device))
    # A rank that dies leaves the others blocked in a collective; the driver notices the death within a poll and
    # kills the group, and the timeout bounds any hang the driver cannot see.
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{master_port or cfg.master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(minutes=10))
