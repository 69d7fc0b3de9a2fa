"""Weights that live in host memory and visit the device: block streaming for stacks of identical blocks (a DiT's
50 blocks, a text encoder's decoder layers) and whole-module homes for models used in one stage (VAEs).

Every tensor a module owns (parameters and buffers, once each, empty ones left alone) gets a *home*: one flat byte
buffer in host memory (pinned when the device is CUDA, so copies run at full PCIe/NVLink-C2C speed and
asynchronously), each tensor at a 256-byte aligned offset. A tensor is moved by pointing its `.data` at a view of
another buffer with the same layout: the home, a device buffer of its own (resident) or a shared device slot
(streamed). The Parameter objects never change, so references held elsewhere (a compiled block, an optimizer-free
inference graph) stay valid; a block whose weights are not on the device holds host tensors, never stale device data.

BlockStreamer keeps the first K blocks of a list resident on the device and streams the others through
`prefetch + 1` device slots, in forward order and cyclically (the last block prefetches the first streamed one of
the next forward). On CUDA the copies run on a side stream:
  prefetch j:  copy stream waits for slot s's `free` event (the compute that last read s), copies j's home into s,
               records s's `ready` event;
  acquire i:   the compute stream waits for i's slot's `ready` event; i's tensors point at the slot; the next
               `prefetch` streamed blocks are issued;
  release i:   the compute stream records i's slot's `free` event; i's tensors point back at their home.
Nothing on the launch thread waits for the device. On the CPU there is no stream: every copy is a plain copy, issued
in the same order, so the CPU tests run the same state machine.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch
from torch import nn

ALIGN = 256  # bytes: every tensor in a home or slot starts on this boundary (vectorised kernels, cuBLAS)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def module_tensors(module: nn.Module, exclude: Sequence[str] = ()) -> list[torch.Tensor]:
    """The tensors `module` owns, each once (shared ones too), in a stable order: parameters then buffers, skipping
    empty ones and those whose name (relative to `module`) starts with one of `exclude`."""
    seen: set[int] = set()
    out = []
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        if tensor is None or tensor.numel() == 0 or id(tensor) in seen or name.startswith(tuple(exclude)):
            continue
        seen.add(id(tensor))
        out.append(tensor)
    return out


class HostHome:
    """The host copy of a set of tensors, laid out flat; `point(buffer)` makes every tensor a view of `buffer`
    (the home itself, or a device buffer of `nbytes` holding a copy of it)."""

    def __init__(self, tensors: list[torch.Tensor], pin: bool):
        self.tensors = tensors
        self.layout: list[tuple[int, int, torch.dtype, torch.Size]] = []  # offset, bytes, dtype, shape
        offset = 0
        for t in tensors:
            size = t.numel() * t.element_size()
            self.layout.append((offset, size, t.dtype, t.shape))
            offset = _aligned(offset + size)
        self.nbytes = max(offset, ALIGN)
        self.buffer, self.pinned = host_buffer(self.nbytes, pin)
        for t, view in zip(tensors, self.views(self.buffer)):
            view.copy_(t.data)
        self.point(self.buffer)  # the tensors' previous storage (device or pageable host) is released here

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer[o:o + n].view(dtype).view(shape) for o, n, dtype, shape in self.layout]

    def point(self, buffer: torch.Tensor) -> None:
        for t, view in zip(self.tensors, self.views(buffer)):
            t.data = view


def host_buffer(nbytes: int, pin: bool) -> tuple[torch.Tensor, bool]:
    """(uint8 host buffer of `nbytes`, whether it is page-locked). Pinned buffers are page-locked in place
    (cudaHostRegister) on whole pages of their own, unlocked when the tensor object goes; torch's pinned allocator is
    not used because it rounds every allocation up to a power of two (a 1.29 GB block would take 2 GiB). When the
    system refuses to lock that much memory the buffer stays pageable: copies are then synchronous (slower, still
    correct) and a warning says why."""
    if not pin:
        return torch.empty(nbytes, dtype=torch.uint8), False
    import os
    import weakref

    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    size = (nbytes + page - 1) // page * page
    raw = torch.empty(size + page, dtype=torch.uint8)
    start = (-raw.data_ptr()) % page
    buffer = raw[start:start + size]
    cudart = torch.cuda.cudart()
    err = int(cudart.cudaHostRegister(buffer.data_ptr(), size, 1))  # 1: cudaHostRegisterPortable
    if err != 0:
        import logging

        logging.getLogger(__name__).warning(
            "Could not page-lock %.2f GiB of host memory for offloaded weights (CUDA error %d): the machine may lack "
            "free RAM or its locked-memory limit (ulimit -l) is too low; streaming from pageable memory (slower).",
            size / 2**30, err)
        return buffer[:nbytes], False
    out = buffer[:nbytes]
    weakref.finalize(out, cudart.cudaHostUnregister, buffer.data_ptr())  # with the object the home keeps
    return out, True


class _Copies:
    """Where copies run: a side CUDA stream with events, or (CPU) nothing at all."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def event(self):
        return torch.cuda.Event() if self.cuda else None

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after=None, done=None) -> None:
        """dst <- src on the copy stream, after `after` (an event) and recording `done`; synchronous on the CPU."""
        if not self.cuda:
            dst.copy_(src)
            return
        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            dst.copy_(src, non_blocking=True)
            done.record(self.stream)

    def wait(self, event) -> None:
        """The compute (current) stream waits for `event`; the host does not."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(event)

    def record(self, event) -> None:
        if self.cuda:
            event.record(torch.cuda.current_stream(self.device))


class _Slot:
    def __init__(self, buffer: torch.Tensor, copies: _Copies):
        self.buffer = buffer
        self.ready = copies.event()  # the copy into this slot finished
        self.free = copies.event()  # the compute that last read this slot finished
        self.block: int | None = None  # whose weights the slot holds (or is receiving)


class BlockStreamer:
    """K resident blocks + the rest streamed from host homes through `prefetch + 1` device slots (module docstring).

    blocks: modules run one after another in list order (their tensors are moved into host homes here);
    resident: blocks kept on the device (the first K), None = all; exclude: tensor names (relative to a block) left
    where they are (e.g. weights another policy places); prepare: called on each block just before its home is
    made (e.g. quantise its weights on the device), one block at a time so only one is ever expanded."""

    def __init__(self, blocks: Sequence[nn.Module], device: torch.device | str, resident: int | None = None,
                 prefetch: int = 1, exclude: Sequence[str] = (),
                 prepare: Callable[[nn.Module], None] | None = None):
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.blocks = list(blocks)
        self.device = torch.device(device)
        self.copies = _Copies(self.device)
        self.prefetch = prefetch
        pin = self.device.type == "cuda"
        self.homes = []
        for block in self.blocks:
            if prepare is not None:
                prepare(block)
            self.homes.append(HostHome(module_tensors(block, exclude), pin))
        self.block_bytes = max((h.nbytes for h in self.homes), default=0)
        self.resident_count = 0
        self._own: dict[int, torch.Tensor] = {}  # resident block -> its device buffer
        self._slots: list[_Slot] = []
        self._next_slot = 0
        self._active: int | None = None
        self._hooks: list = []
        self.set_resident(len(self.blocks) if resident is None else resident)

    # ---- placement --------------------------------------------------------------------------------------------
    @property
    def streamed(self) -> list[int]:
        return list(range(self.resident_count, len(self.blocks)))

    @property
    def slot_count(self) -> int:
        return min(self.prefetch + 1, len(self.streamed))

    def device_bytes(self) -> int:
        """Device memory held now: resident blocks + slots."""
        return sum(b.numel() for b in self._own.values()) + sum(s.buffer.numel() for s in self._slots)

    def device_bytes_for(self, resident: int) -> int:
        """Device memory this streamer would hold with `resident` blocks."""
        resident = max(0, min(resident, len(self.blocks)))
        return (sum(self.homes[i].nbytes for i in range(resident))
                + min(self.prefetch + 1, len(self.blocks) - resident) * self.block_bytes)

    def set_resident(self, resident: int) -> None:
        """Keep the first `resident` blocks on the device, stream the rest (allocating the slots they need)."""
        resident = max(0, min(int(resident), len(self.blocks)))
        self._release_active()
        for i in [i for i in self._own if i >= resident]:
            self.homes[i].point(self.homes[i].buffer)
            del self._own[i]
        self._forget_slots()
        try:
            for i in range(resident):
                if i not in self._own:
                    own = torch.empty(self.homes[i].nbytes, dtype=torch.uint8, device=self.device)
                    own.copy_(self.homes[i].buffer, non_blocking=True)  # ordered before any use on this stream
                    self._own[i] = own
                    self.homes[i].point(own)
            self.resident_count = resident
            self._slots = [self._new_slot() for _ in range(self.slot_count)]
        except BaseException:  # out of memory half way: nothing on the device, still usable (slots made on demand)
            self.offload_all()
            raise

    def offload_all(self) -> None:
        """Free every device byte this streamer holds (another stage needs the memory); the next `set_resident`
        brings blocks back."""
        self._release_active()
        for i in list(self._own):
            self.homes[i].point(self.homes[i].buffer)
        self._own.clear()
        self._forget_slots()
        self.resident_count = 0

    def close(self) -> None:
        """Release everything (the blocks are being dropped): device buffers, slots and the pinned homes; the blocks'
        tensors become empty, so a stray reference cannot keep gigabytes alive or read freed memory."""
        self.detach_hooks()
        self.offload_all()
        for home in self.homes:
            for t in home.tensors:
                t.data = t.data.new_empty(0)
        self.homes = []
        self.blocks = []

    def _new_slot(self) -> _Slot:
        buffer = torch.empty(self.block_bytes, dtype=torch.uint8, device=self.device)
        if self.copies.cuda:
            buffer.record_stream(self.copies.stream)  # freed only after the copy stream's pending work
        return _Slot(buffer, self.copies)

    def _forget_slots(self) -> None:
        self._slots = []
        self._next_slot = 0

    # ---- streaming --------------------------------------------------------------------------------------------
    def _slot_of(self, block: int) -> _Slot | None:
        for slot in self._slots:
            if slot.block == block:
                return slot
        return None

    def _load(self, block: int) -> _Slot:
        """Issue the copy of `block` into a slot (no-op when it is already there or on its way)."""
        slot = self._slot_of(block)
        if slot is not None:
            return slot
        active = None if self._active is None else self._slot_of(self._active)
        for _ in range(len(self._slots)):  # round robin, never the slot the running block reads
            slot = self._slots[self._next_slot]
            self._next_slot = (self._next_slot + 1) % len(self._slots)
            if slot is not active:
                break
        home = self.homes[block]
        slot.block = block
        self.copies.copy(slot.buffer[:home.nbytes], home.buffer, after=slot.free, done=slot.ready)
        return slot

    def _ahead(self, block: int) -> list[int]:
        """The next `prefetch` streamed blocks after `block`, cyclically (the next forward starts over)."""
        first, n = self.resident_count, len(self.blocks) - self.resident_count
        return [first + (block - first + k) % n for k in range(1, min(self.prefetch, n - 1) + 1)]

    def acquire(self, block: int) -> None:
        """Before `block` runs: its weights are (or will be, in stream order) on the device."""
        if self._active is not None:
            self._release_active()
        if block in self._own:
            if self._slots:  # the resident blocks hide the first streamed block's copy (a no-op once issued)
                self._load(self.resident_count)
            return
        if not self._slots:  # after offload_all: stream with the fewest slots rather than fail
            self._slots = [self._new_slot() for _ in range(self.slot_count)]
        slot = self._load(block)
        self.copies.wait(slot.ready)
        self.homes[block].point(slot.buffer)
        self._active = block
        for j in self._ahead(block):
            self._load(j)

    def release(self, block: int) -> None:
        """After `block`'s work is issued: its slot may be refilled once that work is done."""
        if block in self._own or self._active != block:
            return
        slot = self._slot_of(block)
        self.copies.record(slot.free)
        slot.block = None
        self.homes[block].point(self.homes[block].buffer)
        self._active = None

    def _release_active(self) -> None:
        if self._active is not None:
            self.release(self._active)

    def run(self) -> Iterator[nn.Module]:
        """Iterate the blocks with each one's weights in place while the caller runs it."""
        for i, block in enumerate(self.blocks):
            self.acquire(i)
            try:
                yield block
            finally:
                self.release(i)

    # ---- for modules whose forward we do not own (a library's decoder layers) -----------------------------------
    def attach_hooks(self) -> None:
        """Acquire/release around each block's own forward (forward pre/post hooks), for lists iterated by code
        this package does not own. Not for blocks compiled with torch.compile (the hooks would be traced)."""
        self.detach_hooks()
        for i, block in enumerate(self.blocks):
            self._hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: self.acquire(i)))
            self._hooks.append(block.register_forward_hook(lambda m, a, o, i=i: self.release(i)))

    def detach_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


def resident_blocks_for(streamer: BlockStreamer, available: int, activation: int) -> int:
    """The most blocks that can stay resident with `available` device bytes (the streamer's own included) beside
    `activation` bytes; 0 when even full streaming does not fit (the forward then runs as far as memory allows)."""
    best = 0
    for k in range(len(streamer.blocks) + 1):
        if streamer.device_bytes_for(k) + activation <= available:
            best = k
    return best


def stream_blocks(blocks: Sequence[nn.Module], streamer: BlockStreamer | None):
    """`blocks` as they are, or through `streamer` (weights moved in around each one)."""
    return blocks if streamer is None else streamer.run()


class ModuleHome:
    """A whole module (minus `exclude` tensors) that lives on the host and visits the device for its stage."""

    def __init__(self, module: nn.Module, device: torch.device | str, exclude: Sequence[str] = (),
                 on_device: bool = False):
        self.module = module
        self.device = torch.device(device)
        self.home = HostHome(module_tensors(module, exclude), pin=self.device.type == "cuda")
        self._own: torch.Tensor | None = None
        if on_device:
            self.to_device()

    @property
    def nbytes(self) -> int:
        return self.home.nbytes

    @property
    def on_device(self) -> bool:
        return self._own is not None

    def to_device(self) -> None:
        if self._own is None:
            own = torch.empty(self.home.nbytes, dtype=torch.uint8, device=self.device)
            own.copy_(self.home.buffer, non_blocking=True)
            self._own = own
            self.home.point(own)

    def to_host(self) -> None:
        """Free the device copy (the home is never modified: nothing to copy back)."""
        if self._own is not None:
            self.home.point(self.home.buffer)
            self._own = None


def on_call(module: nn.Module, enter: Callable[[], None]) -> list:
    """Call `enter()` before any direct child of `module` runs (every call into a library model goes through one of
    them): the handles of the hooks."""
    children = list(module.children()) or [module]
    return [child.register_forward_pre_hook(lambda m, a: enter()) for child in children]


