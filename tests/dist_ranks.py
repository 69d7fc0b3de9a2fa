"""Joining a process group in a spawned test rank (gloo on CPU; NCCL or gloo on CUDA tensors where GPUs exist)."""

from __future__ import annotations

import torch


def to_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def join_group(rank: int, world: int, port: int, backend: str = "gloo", device_type: str = "cpu"):
    """Initialise the default group for this rank; returns (its device, its ParallelContext)."""
    import torch.distributed as dist

    from comfyui_h3.backend.parallel.context import ParallelContext

    torch.set_num_threads(1)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return device, ParallelContext(rank, world)


def leave_group() -> None:
    """Tear the group down only once every rank is done with it: gloo aborts a peer (SIGABRT, "terminate called
    without an active exception") whose connection closes while it still reads from it."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
