"""The "offload" weight placement for H3 (GPUs smaller than the model): which of a rank's big models hold device
memory at each stage of a request, and how many DiT blocks stay resident.

- DiT: its small parts (embedders, text refiner, output norm and heads, ~1.7 GB at release size) stay on the device;
  its blocks live in pinned host memory and the first K are made resident for each denoise, the rest streamed
  (models/block_offload.py). K is the policy's number, or "auto": as many as fit beside the activations of the
  request's shape (estimate below) in the memory free when the DiT stage starts.
- Text encoder, video VAE, audio VAE: each lives in host memory and moves to the device when one of its modules is
  called (its stage), if it is not there already. They stay on the device while memory allows; a stage that needs
  room takes it from the DiT's resident blocks first (cheap to bring back: ~24 ms per 1.29 GB block at 53 GB/s),
  then from the other models, least recently used first. The DiT stage moves the text encoder and VAEs off only when
  its minimum (two block slots + activations) does not fit beside them. A text encoder larger than the free memory
  (the release's 50-layer Qwen3-VL is ~50 GB in bf16) streams its decoder layers the same way as the DiT's blocks.

Activation estimate of one DiT forward (bytes; measured on an H200 in bf16 at 1344x768, docs/BENCHMARKS.md: peak minus
weights at 5/10/15 s on one rank 166-175 KB per packed row, at SP degree 2 and 4 a little more per local row for the
gathered full-sequence pieces): DIT_BYTES_PER_ROW per row this rank computes + DIT_BYTES_PER_OTHER_ROW per row of the
rest of the sequence + DIT_RESERVE (allocator slack, cuBLAS/cuDNN workspaces). bench/block_offload.py prints the
measured figure next to this estimate.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ...device_memory import cuda_free_bytes
from ...models.block_offload import BlockStreamer, ModuleHome, on_call, resident_blocks_for

GIB = 1 << 30
DIT_BYTES_PER_ROW = 176 << 10
DIT_BYTES_PER_OTHER_ROW = 24 << 10
DIT_RESERVE = 1 * GIB
# Activations of the other stages, beside their weights: text encoding (a prompt and a few images), a VAE clip
# (decode peak 7.9 GiB at 1344x768, measured), the audio VAE.
STAGE_RESERVE = {"text": 2 * GIB, "vae": 8 * GIB, "audio_vae": 1 * GIB}
TEXT_LAYERS = "model.language_model.layers"  # Qwen3-VL's decoder layers, streamed when the encoder does not fit


def dit_activation_bytes(local_rows: int, total_rows: int) -> int:
    """Estimated device bytes one DiT forward needs beyond its weights (module docstring)."""
    return local_rows * DIT_BYTES_PER_ROW + max(total_rows - local_rows, 0) * DIT_BYTES_PER_OTHER_ROW + DIT_RESERVE


def attach_block_offload(dit: nn.Module, device: torch.device | str, storage: str = "compute",
                         exclude: tuple[str, ...] = ()) -> BlockStreamer:
    """Move a DiT loaded on the host (in its stored precision) into the offload placement: blocks into pinned host
    homes with nothing on the device yet (enter_dit plans them per request), everything else onto `device`.
    `storage` "fp8"/"fp8_emulated" quantises each block's GEMM weights first, on the device, one block at a time;
    `exclude`: block tensors another policy holds (the AdaLN cache's projection weights)."""
    device = torch.device(device)

    def quantise(block):  # the GEMM weights to FP8 on the device (fast), one block at a time
        block.attn.to(device)
        block.ff.to(device)
        block.use_fp8_gemms(emulate=storage == "fp8_emulated")

    prepare = quantise if storage in ("fp8", "fp8_emulated") else None
    streamer = BlockStreamer(dit.transformer_blocks, device, resident=0, exclude=exclude, prepare=prepare)
    streamer.offload_all()
    for name, child in dit.named_children():
        if name != "transformer_blocks":
            child.to(device)
    for name, tensor in list(dit.named_buffers(recurse=False)):
        if tensor is not None:
            setattr(dit, name, tensor.to(device))
    for param in dit.parameters(recurse=False):
        param.data = param.data.to(device)
    dit.block_offload = streamer
    return streamer


class _Part:
    """A stage model in the offload placement: a host home for the whole module, or for all but its decoder layers
    when `layers` names a ModuleList to stream."""

    def __init__(self, name: str, module: nn.Module, device: torch.device, layers: str | None):
        self.name = name
        stack = _submodule(module, layers) if layers else None
        self.home = ModuleHome(module, device, exclude=(layers + ".",) if stack is not None else ())
        self.layers = None
        if stack is not None:
            self.layers = BlockStreamer(stack, device, resident=0)
            self.layers.offload_all()
            self.layers.attach_hooks()

    @property
    def full_bytes(self) -> int:
        extra = 0 if self.layers is None else self.layers.device_bytes_for(len(self.layers.blocks))
        return self.home.nbytes + extra

    @property
    def min_bytes(self) -> int:
        return self.home.nbytes + (0 if self.layers is None else self.layers.device_bytes_for(0))

    @property
    def device_bytes(self) -> int:
        own = self.home.nbytes if self.home.on_device else 0
        return own + (0 if self.layers is None else self.layers.device_bytes())

    @property
    def on_device(self) -> bool:
        return self.home.on_device

    def load(self, available: int, reserve: int) -> None:
        self.home.to_device()
        if self.layers is not None:
            self.layers.set_resident(resident_blocks_for(self.layers, available - self.home.nbytes, reserve))

    def unload(self) -> None:
        self.home.to_host()
        if self.layers is not None:
            self.layers.offload_all()


def _submodule(module: nn.Module, path: str) -> nn.ModuleList | None:
    try:
        found = module.get_submodule(path)
    except AttributeError:
        return None
    return found if isinstance(found, nn.ModuleList) and len(found) > 0 else None


class StageResidency:
    """One rank's device memory across stages under the offload placement (module docstring). `free_bytes`: the
    device memory free now (default: the CUDA driver's figure after returning the allocator's cache; unlimited on
    the CPU, where the same moves are plain copies)."""

    def __init__(self, device: torch.device | str, free_bytes: Callable[[], int] | None = None):
        self.device = torch.device(device)
        self.free_bytes = free_bytes or self._device_free
        self.parts: dict[str, _Part] = {}
        self.dits: list[BlockStreamer] = []  # the loaded DiT partitions' block streamers
        self.stage: str | None = None
        self._recent: list[str] = []  # parts, least recently entered first
        self._hooks: list = []
        self.last_plan: dict = {}

    def _device_free(self) -> int:
        if self.device.type != "cuda":
            return 1 << 62
        return cuda_free_bytes(self.device)

    def add(self, name: str, module: nn.Module, layers: str | None = None) -> None:
        """`module` lives on the host from now on and comes to the device when any of its children is called."""
        self.parts[name] = _Part(name, module, self.device, layers)
        self._hooks += on_call(module, lambda: self.enter(name))

    def attach_dit(self, dit: nn.Module, storage: str = "compute", exclude: tuple[str, ...] = ()) -> BlockStreamer:
        """A loaded DiT partition into the offload placement (attach_block_offload)."""
        streamer = attach_block_offload(dit, self.device, storage, exclude)
        self.dits.append(streamer)
        return streamer

    def detach_dits(self) -> None:
        """The loaded DiTs are being dropped: free their host and device memory now, whoever still holds them."""
        for streamer in self.dits:
            streamer.close()
        self.dits.clear()

    def enter(self, name: str) -> None:
        """Stage `name` starts (or goes on): its model on the device with room for its activations."""
        if self.stage == name:
            return
        part, reserve = self.parts[name], STAGE_RESERVE.get(name, GIB)
        need = reserve if part.on_device else part.min_bytes + reserve
        self._make_room(need, keep=name)
        if not part.on_device:
            part.load(self.free_bytes(), reserve)
        self.stage = name
        if name in self._recent:
            self._recent.remove(name)
        self._recent.append(name)

    def _make_room(self, need: int, keep: str) -> None:
        """Free device memory until `need` bytes are free: the DiT's blocks first, then the least recently used
        models. Stops when nothing more can go (the stage then runs as far as memory allows)."""
        if self.free_bytes() >= need:
            return
        for streamer in self.dits:
            if streamer.device_bytes():
                streamer.offload_all()
                if self.free_bytes() >= need:
                    return
        for other in list(self._recent):
            part = self.parts[other]
            if other != keep and part.device_bytes:
                part.unload()
                if self.free_bytes() >= need:
                    return

    def enter_dit(self, streamer: BlockStreamer, local_rows: int, total_rows: int, resident: int | None) -> dict:
        """The DiT stage of a request whose forward computes `local_rows` of `total_rows` packed rows: plan the
        resident blocks of `streamer` (`resident`, or auto when None), moving the stage models off when the DiT's
        minimum does not fit beside them. Returns the plan (also kept in `last_plan`)."""
        self.stage = "dit"
        for other in self.dits:
            if other is not streamer:
                other.offload_all()
        activation = dit_activation_bytes(local_rows, total_rows)
        want = streamer.device_bytes_for(0 if resident is None else resident) + activation
        available = self.free_bytes() + streamer.device_bytes()
        for name in list(self._recent):
            if available >= want:
                break
            part = self.parts[name]
            if part.device_bytes:
                part.unload()
                available = self.free_bytes() + streamer.device_bytes()
        k = resident_blocks_for(streamer, available, activation) if resident is None else resident
        streamer.set_resident(k)
        self.last_plan = {"resident_blocks": streamer.resident_count, "streamed_blocks": len(streamer.streamed),
                          "block_bytes": streamer.block_bytes, "activation_estimate_bytes": activation,
                          "available_bytes": available, "mode": "auto" if resident is None else "fixed",
                          "stage_models_on_device": [n for n, p in self.parts.items() if p.on_device]}
        return self.last_plan
