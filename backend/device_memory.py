"""How much more device memory this process may take: what every memory plan (batch sizes, resident blocks, VAE
tiles) starts from."""

from __future__ import annotations

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
