"""How much more device (and host) memory this process may take: what every memory plan (batch sizes, resident
blocks, VAE tiles, the host copies kept for switching LoRAs) starts from."""

from __future__ import annotations

import os

import torch


def cuda_free_bytes(device: torch.device | str | int) -> int:
    """Bytes this process can still allocate on a CUDA device: the driver's free memory once the allocator's cache is
    returned, and no more than a cap set with torch.cuda.set_per_process_memory_fraction leaves (the driver does not
    know that cap; the allocator refuses past it, counting the memory it has reserved)."""
    device = torch.device(device)
    if device.index is None:  # the cap functions want an index; "cuda" means the current device
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.8
    if fraction is not None:
        capped = int(fraction(device) * total) - torch.cuda.memory_reserved(device)
        free = min(free, max(0, capped))
    return int(free)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text.isdigit() else None  # "max": no limit
    except (OSError, ValueError):
        return None


def host_free_bytes() -> int | None:
    """Memory this process can still take on its host: the kernel's MemAvailable, or less where a cgroup (a
    container) limits it; None where neither is known (then no host check is made)."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            free = None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:
            room = max(0, limit - usage + _cgroup_reclaimable())
            free = room if free is None else min(free, room)
            break
    return free


def _cgroup_reclaimable() -> int:
    """The cgroup's inactive page cache (counted in its usage, yet given back on demand)."""
    for path, key in (("/sys/fs/cgroup/memory.stat", "inactive_file"),
                      ("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0
