"""The "offload" weight placement for SeedVR2 (GPUs smaller than the model and its activations): which weights hold
device memory at each stage of a batch, and how many DiT blocks stay resident.

- DiT: its small parts (patch in / out, text and time embedders, output norm) and the text embedding stay on the
  device; its blocks live in pinned host memory (models/block_offload.py, the same streamer H3 uses) and the first
  K are made resident for each DiT stage, the others streamed through two device slots while earlier blocks compute.
  K is the policy's number, or auto: as many as fit beside the batch's DiT activations (memory.py's estimate) in the
  memory free when the stage starts.
- VAE: lives in host memory and comes to the device for the encode and decode stages. It stays there while memory
  allows; a VAE stage that needs room takes it from the DiT's resident blocks (cheap to bring back); the DiT stage
  sends the VAE back to the host only when the DiT's minimum (two block slots + activations) does not fit beside it.
A batch runs encode -> DiT -> decode, so on a small GPU each batch moves the VAE (~0.5 GB at release size) in twice
and the resident blocks once; the output equals the resident placement's bit for bit (the same weights, the same
kernels, only their addresses differ).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ...device_memory import cuda_free_bytes
from ...models.block_offload import BlockStreamer, ModuleHome, resident_blocks_for


def _fp8_on(device: torch.device, emulate: bool):
    def quantise(block):  # on the device (fast), one block at a time: only one block is ever expanded there
        block.to(device)
        block.use_fp8_gemms(emulate=emulate)
    return quantise


class SeedVR2Placement:
    """One rank's DiT and VAE under the offload placement (module docstring). `resident`: DiT blocks kept on the
    device (None: auto); `storage` "fp8"/"fp8_emulated": the blocks' GEMM weights quantised before their homes are
    made; `free_bytes`: the device memory free now (default: the CUDA driver's figure after returning the
    allocator's cache; unlimited on the CPU, where the same moves are plain copies)."""

    def __init__(self, dit: nn.Module, vae: nn.Module, device: torch.device | str, resident: int | None,
                 storage: str = "compute", free_bytes: Callable[[], int] | None = None):
        self.device = torch.device(device)
        self.resident = resident
        self.free_bytes = free_bytes or self._device_free
        fp8 = storage in ("fp8", "fp8_emulated")
        prepare = _fp8_on(self.device, storage == "fp8_emulated") if fp8 else None
        self.dit = BlockStreamer(dit.blocks, self.device, resident=0, prepare=prepare)
        self.dit.offload_all()
        for name, child in dit.named_children():
            if name != "blocks":
                child.to(self.device)
        dit.block_offload = self.dit
        self.vae = ModuleHome(vae, self.device)
        self.activation = {"dit": 0, "vae": 0}  # bytes the planned batch needs beside the weights, per stage
        self.last_plan: dict = {}
        self.moves = {"vae_in": 0, "vae_out": 0, "dit_offloads": 0}

    def _device_free(self) -> int:
        if self.device.type != "cuda":
            return 1 << 62
        return cuda_free_bytes(self.device)

    # ---- what the memory check counts ------------------------------------------------------------------------------
    def releasable_bytes(self) -> int:
        """Device bytes these weights hold now that a stage could take back (the check counts them as free)."""
        return self.dit.device_bytes() + (self.vae.nbytes if self.vae.on_device else 0)

    def stage_weights(self) -> tuple[int, int]:
        """(DiT stage, VAE stage) weight bytes that must be on the device beside the activations: the DiT's resident
        blocks of a fixed count, or with auto its minimum (the streaming slots); the VAE's whole weights."""
        return self.dit.device_bytes_for(self.resident or 0), self.vae.nbytes

    def plan_request(self, dit_bytes: int, vae_bytes: int) -> None:
        """The activations of the request's batches (memory.py's estimate), for the stages' room and auto's K."""
        self.activation = {"dit": int(dit_bytes), "vae": int(vae_bytes)}
        self.moves = dict.fromkeys(self.moves, 0)

    # ---- the stages ------------------------------------------------------------------------------------------------
    def enter_vae(self) -> None:
        """An encode or decode starts: the VAE on the device, the DiT's blocks off first if the stage needs their
        room. Checked also when the VAE stayed on the device through the DiT stage: auto's resident blocks filled
        the room beside the DiT's activations, which a VAE stage (tiles sized to the budget) may need."""
        need = self.activation["vae"] + (0 if self.vae.on_device else self.vae.nbytes)
        if self.dit.device_bytes() and self.free_bytes() < need:
            self.dit.offload_all()
            self.moves["dit_offloads"] += 1
        if not self.vae.on_device:
            self.vae.to_device()
            self.moves["vae_in"] += 1

    def enter_dit(self) -> dict:
        """The DiT stage starts: plan its resident blocks, sending the VAE to the host when the DiT's minimum does not
        fit beside it. Returns the plan (also kept in `last_plan`)."""
        activation = self.activation["dit"]
        want = self.dit.device_bytes_for(self.resident or 0) + activation
        available = self.free_bytes() + self.dit.device_bytes()
        if available < want and self.vae.on_device:
            self.vae.to_host()
            self.moves["vae_out"] += 1
            available = self.free_bytes() + self.dit.device_bytes()
        k = resident_blocks_for(self.dit, available, activation) if self.resident is None else self.resident
        if self.dit.device_bytes() != self.dit.device_bytes_for(k) or self.dit.resident_count != k:
            self.dit.set_resident(k)
        self.last_plan = {"resident_blocks": self.dit.resident_count, "streamed_blocks": len(self.dit.streamed),
                          "block_bytes": self.dit.block_bytes, "mode": "auto" if self.resident is None else "fixed",
                          "activation_estimate_bytes": activation, "available_bytes": available,
                          "vae_on_device": self.vae.on_device}
        return self.last_plan

    def report(self) -> dict:
        """For the manifest: the last DiT plan and how often the weights moved."""
        return {**self.last_plan, **self.moves}
