"""Measurement helpers of bench/seedvr2.py's pipeline stage (the capped-card runs, issue 31): per-stage time and
memory peaks, a memory cap as a smaller card would hold it, forced VAE tiles, and frame comparisons."""

import math
import time

import torch


STAGE_PEAKS: dict = {}  # stage -> (the most allocated during any call of it, held when one started), GiB
RUN_PEAK = [0]  # bytes: the most allocated in the run (the per-stage resets hide it from max_memory_allocated)


def _announce(owner, name: str, stage: str | None = None) -> None:
    """Wrap `owner.name` to print and record (as `stage`, default `name`) its time and memory peak per call."""
    inner = getattr(owner, name)
    stage = stage or name

    def timed_call(*a, **k):
        torch.cuda.synchronize()
        RUN_PEAK[0] = max(RUN_PEAK[0], torch.cuda.max_memory_allocated())
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = inner(*a, **k)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        RUN_PEAK[0] = max(RUN_PEAK[0], peak)
        prev = STAGE_PEAKS.get(stage, (0.0, 0.0))
        STAGE_PEAKS[stage] = (max(prev[0], round(peak / 2**30, 2)), max(prev[1], round(held / 2**30, 2)))
        print(f"  {stage}: {time.perf_counter() - t0:.2f} s, peak {peak / 2**30:.1f} GiB (held at start "
              f"{held / 2**30:.1f})", flush=True)
        return out

    setattr(owner, name, timed_call)


def _cap_memory(dev, gib: float) -> dict:
    """Cap this process at `gib` of device memory in all, as a card of that size would hold it: the allocator's
    share is what remains after what lives outside it (the CUDA context, cuBLAS and cuDNN handles), measured now."""
    torch.ones(64, 64, device=dev) @ torch.ones(64, 64, device=dev)  # the handles exist before the measurement
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    outside = (total - free) - torch.cuda.memory_reserved(dev)
    allocator = gib * 2**30 - outside
    index = dev.index if dev.index is not None else torch.cuda.current_device()  # the cap wants an index
    torch.cuda.set_per_process_memory_fraction(allocator / total, index)
    return {"memory_cap_gib": gib, "outside_allocator_gib": round(outside / 2**30, 2),
            "allocator_cap_gib": round(allocator / 2**30, 2)}


def _forced_tiles(tiles: tuple[int, int]):
    """plan_memory that checks and plans the given (encode, decode) tiles, as auto would have chosen them."""
    from comfyui_h3.backend.pipelines.seedvr2.memory import MemoryPlan, check_fits

    def plan_memory(*args, auto_tiles=True, **model):
        return MemoryPlan(check_fits(*args[:-1], tiles, **model), tiles)

    return plan_memory


def _compare_frames(ref_path: str, frames: torch.Tensor) -> dict:
    ref = torch.load(ref_path)
    if ref.shape != frames.shape:
        return {"compare": ref_path, "shapes_differ": [list(ref.shape), list(frames.shape)]}
    diff = (ref.to(torch.int16) - frames.to(torch.int16)).abs()
    mse = diff.double().pow(2).mean().item()
    return {"compare": ref_path, "bitwise_equal": bool(torch.equal(ref, frames)), "max_abs_diff": int(diff.max()),
            "mean_abs_diff": round(diff.double().mean().item(), 4),
            "psnr_db": round(10 * math.log10(255 ** 2 / mse), 2) if mse else None,
            "frames_differing": int((diff.flatten(1).amax(1) > 0).sum())}


def _estimates(pipe, geometry, plan, memory) -> dict:
    """The memory check's per-stage activation estimate for the planned batch (weights not included), GiB."""
    from comfyui_h3.backend.pipelines.seedvr2.memory import batch_memory, vae_scale

    c = pipe.c
    need = batch_memory(c.config, plan.batch, *geometry.model, *geometry.source, torch.finfo(c.dtype).bits // 8,
                        torch.finfo(c.vae_dtype).bits // 8, 1, memory.vae_tiles, vae_scale=vae_scale(c.vae.config))
    return {k: round(getattr(need, k) / 2**30, 2) for k in ("dit", "encode", "decode")}
