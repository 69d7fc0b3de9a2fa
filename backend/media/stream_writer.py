"""Stream decoded frames from a GPU (or the CPU) into the encoder with bounded host memory.

`StreamingVideoSaver` is the output path's fast path (docs/BENCHMARKS.md, "Save path"):

    caller thread                         side CUDA stream                 encoder thread
    float/uint8 chunk on the GPU
      -> uint8 on the GPU (frames.py)
      -> wait for a free host slot  ....  D2H copy into the slot's   ...  wait for the slot's event,
                                          pinned buffer, record event      encode (Mp4Writer), free the slot

Contracts:
- `write(video)`: float video `[t, H, W, 3]` or `[1, 3, t, H, W]` (a VAE decoder's output) in 0..1, or uint8 frames
  `[t, H, W, 3]`, on any device; any number of calls, any `t`. Float is quantised on its own device with
  `round_half_even(clamp(x, 0, 1) * 255)` (frames.iter_uint8_chunks), so only uint8 crosses to the host: 1/4 of the
  float32 bytes.
- Host memory: `slots` (default 2) buffers of `chunk_frames` uint8 frames each, pinned when the frames come from a CUDA
  device; nothing else of video size is held on the host, whatever the clip length. The caller blocks when every slot
  waits for the encoder (bounded queue depth = `slots`).
- The copy runs on a side stream ordered after the producing stream, so the caller's next GPU work (the next decode
  clip) overlaps the copy, and the encoder thread overlaps both.
- Errors: an exception in the encoder thread is re-raised by the next `write` / `write_audio` / `close` call (the
  original exception, chained); the temporary file is removed and no file appears under the final name. `abort()` (or
  leaving the `with` block by an exception) stops the thread and removes the temporary file.
- CPU tensors take the same API: no streams, no pinning; the slots are plain host buffers.

`stats` counts what happened: `d2h_bytes` (bytes moved device -> host), `frames`, `encode_s` (encoder thread busy
time), `wait_s` (caller blocked on a free slot), `convert_s` (caller time in quantise + copy issue).
"""

from __future__ import annotations

import abc
import logging
import os
import queue
import threading
import time
from fractions import Fraction
from typing import Any

import torch

from .encode import Mp4Writer
from .frames import iter_uint8_chunks
from .yuv import rgb_to_yuv420p

DEFAULT_CHUNK_FRAMES = 16
_STOP = object()


class ChunkedFrameStream(abc.ABC):
    """The pipe: quantise on the frames' device, copy through `slots` (pinned) host buffers on a side stream, hand
    filled buffers to a background thread that calls `_consume_frames(host_uint8 [t, H, W, 3])`. Subclasses:
    StreamingVideoSaver (encodes) and HostFrameCollector (assembles the clip on the host)."""

    @abc.abstractmethod
    def _consume_frames(self, frames: torch.Tensor) -> None:
        """Take one host uint8 chunk [t, H, W, 3] (runs on the background thread)."""

    def _consume_audio(self, waveform: Any, sample_rate: int | None) -> None:
        """Take the soundtrack (only streams that write a file have one)."""
        raise TypeError(f"{type(self).__name__} carries frames only, no audio.")

    def _complete(self) -> None:
        pass

    def _discard(self) -> None:
        pass

    def _wants_yuv420p(self, device: torch.device) -> bool:
        """Whether chunks from `device` are converted to YUV 4:2:0 there (then `_consume_frames` gets planes
        [t, H * 3 // 2, W], backend/media/yuv.py's layout, instead of RGB [t, H, W, 3])."""
        return False

    def _make_slots(self, count: int, shape: tuple[int, ...], cuda: bool) -> list[torch.Tensor]:
        """The host buffers the copies land in (page-locked for a CUDA source)."""
        return [torch.empty(shape, dtype=torch.uint8, pin_memory=cuda) for _ in range(count)]

    def _release_slots(self) -> None:
        """Called once the background thread has ended (nothing reads the buffers any more)."""

    def _consume_slot(self, index: int, count: int) -> None:
        """Take slot `index`'s first `count` frames (runs on the background thread; the copy into it is complete)."""
        self._consume_frames(self._slots[index][:count])

    def _start(self, width: int, height: int, device, chunk_frames: int, slots: int) -> None:
        if int(chunk_frames) < 1 or int(slots) < 1:
            raise ValueError(f"chunk_frames and slots must be >= 1, got {chunk_frames} and {slots}")
        self.width, self.height = int(width), int(height)
        self.chunk_frames = int(chunk_frames)
        self.device = torch.device(device) if device is not None else None
        self.stats = {"frames": 0, "d2h_bytes": 0, "encode_s": 0.0, "wait_s": 0.0, "convert_s": 0.0,
                      "host_buffer_bytes": 0}
        self._slots: list[torch.Tensor] = []
        self._events: list[Any] = []
        self._slot_owner: list[Any] = []  # the device tensor a slot's pending copy reads (kept alive until encoded)
        self._free: queue.Queue[int] = queue.Queue()
        self._work: queue.Queue = queue.Queue()
        self._stream = None
        self._slot_count = int(slots)
        self.yuv420p = False
        self._error: BaseException | None = None
        self._closed = False
        if self.device is not None:
            self._allocate(self.device)
        self._thread = threading.Thread(target=self._run, name="h3-video-encoder", daemon=True)
        self._thread.start()

    # -- setup ---------------------------------------------------------------------------------------------------------
    def _allocate(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.yuv420p = self._wants_yuv420p(device)
        shape = ((self.chunk_frames, self.height * 3 // 2, self.width) if self.yuv420p
                 else (self.chunk_frames, self.height, self.width, 3))
        self._slots = self._make_slots(self._slot_count, shape, cuda)
        for index in range(self._slot_count):
            self._events.append(torch.cuda.Event() if cuda else None)
            self._slot_owner.append(None)
            self._free.put(index)
        if cuda:
            self._stream = torch.cuda.Stream(device=device)
        self.stats["host_buffer_bytes"] = self._slot_count * self._slots[0].numel()
        self.device = device

    # -- caller side ---------------------------------------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            error = self._error
            self._finish(abort=True)
            raise RuntimeError(f"the video encoder failed: {error}") from error

    def check(self) -> None:
        """Raise now if the consumer has failed (a full disk): a caller between costly steps stops at the first
        failed write instead of computing the rest first."""
        self._raise_if_failed()

    def write(self, video: torch.Tensor) -> None:
        """Queue frames for encoding; see the module docstring for the accepted layouts."""
        if self._closed:
            raise ValueError("StreamingVideoSaver is closed")
        self._raise_if_failed()
        if not isinstance(video, torch.Tensor):
            video = torch.as_tensor(video)
        if not self._slots:
            self._allocate(video.device)
        elif video.device.type != self.device.type:
            raise ValueError(f"this saver streams from {self.device}, got a chunk on {video.device}")
        if video.dtype == torch.uint8:
            if video.ndim == 3:
                video = video[None]
            if video.ndim != 4 or tuple(video.shape[1:]) != (self.height, self.width, 3):
                raise ValueError(f"expected uint8 frames [t, {self.height}, {self.width}, 3], "
                                 f"got {tuple(video.shape)}")
            chunks = video.split(self.chunk_frames)
        else:
            size = tuple(video.shape[-2:]) if video.ndim == 5 else tuple(video.shape[1:3])
            if size != (self.height, self.width):
                raise ValueError(f"expected {self.height}x{self.width} frames, got video of shape {tuple(video.shape)}")
            chunks = iter_uint8_chunks(video, chunk_frames=self.chunk_frames)
        start = time.perf_counter()
        waited = 0.0
        for chunk in chunks:
            waited += self._put(chunk)
        self.stats["wait_s"] += waited
        self.stats["convert_s"] += time.perf_counter() - start - waited

    def _put(self, chunk: torch.Tensor) -> float:
        t0 = time.perf_counter()
        while True:  # wait for a free slot, but notice an encoder failure instead of waiting forever
            try:
                index = self._free.get(timeout=0.1)
                break
            except queue.Empty:
                self._raise_if_failed()
        waited = time.perf_counter() - t0
        self._raise_if_failed()
        count = int(chunk.shape[0])
        if self.yuv420p:
            chunk = rgb_to_yuv420p(chunk)
        target = self._slots[index][:count]
        if self._stream is not None:
            producer = torch.cuda.current_stream(chunk.device)
            self._stream.wait_stream(producer)  # the copy reads what the producer (quantise) wrote
            with torch.cuda.stream(self._stream):
                target.copy_(chunk, non_blocking=True)
                self._events[index].record(self._stream)
            chunk.record_stream(self._stream)  # the allocator may not reuse its memory before the copy ran
            self._slot_owner[index] = chunk
            self.stats["d2h_bytes"] += chunk.numel()
        else:
            target.copy_(chunk)
        self.stats["frames"] += count
        self._work.put(("frames", index, count))
        return waited

    def write_audio(self, waveform: Any, sample_rate: int | None = None) -> None:
        """Queue audio for the writer (float [C, S] or [1, C, S] in -1..1); see Mp4Writer.write_audio."""
        if self._closed:
            raise ValueError("StreamingVideoSaver is closed")
        self._raise_if_failed()
        if isinstance(waveform, torch.Tensor):
            waveform = waveform.detach().cpu()
        self._work.put(("audio", waveform, sample_rate))

    # -- encoder thread ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is _STOP:
                return
            kind = item[0]
            try:
                if self._error is None:
                    t0 = time.perf_counter()
                    if kind == "frames":
                        _, index, count = item
                        if self._events and self._events[index] is not None:
                            self._events[index].synchronize()
                        self._consume_slot(index, count)
                    elif kind == "audio":
                        self._consume_audio(item[1], item[2])
                    elif kind == "close":
                        self._complete()
                    self.stats["encode_s"] += time.perf_counter() - t0
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                self._error = error
            finally:
                if kind == "frames":
                    index = item[1]
                    if self._slot_owner:
                        self._slot_owner[index] = None
                    self._free.put(index)

    # -- finishing -----------------------------------------------------------------------------------------------------
    def _finish(self, abort: bool) -> None:
        if self._closed and not self._thread.is_alive():
            return
        was_closed, self._closed = self._closed, True
        if not abort and not was_closed:
            self._work.put(("close",))
        self._work.put(_STOP)
        self._thread.join()
        if abort or self._error is not None:
            self._discard()
        self._release_slots()

    def _close(self) -> None:
        """Drain the queue and complete the sink. Re-raises an error of the consumer thread."""
        if not self._closed:
            self._finish(abort=False)
        if self._error is not None:
            raise RuntimeError(f"the video encoder failed: {self._error}") from self._error

    def abort(self) -> None:
        """Stop without publishing: the encoder thread ends and the temporary file is removed."""
        if not self._closed:
            while True:  # drop queued work so the thread ends promptly
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, tuple) and item[0] == "frames":
                    self._free.put(item[1])
            self._finish(abort=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class StreamingVideoSaver(ChunkedFrameStream):
    """Write video chunks from any device into an `Mp4Writer`; see the module docstring.

    >>> with StreamingVideoSaver(path, 1344, 768, 24, device="cuda") as saver:
    ...     for clip in decoder_clips:            # e.g. [1, 3, t, H, W] float on the GPU
    ...         saver.write(clip)
    ...     saver.write_audio(wave, 32000)
    >>> saver.path                                # published only after a clean close

    `writer_options` go to Mp4Writer (audio_sample_rate, crf, preset, codec, metadata, reserved, threads, ...).
    `device` picks the buffers up front (pinned for CUDA); by default they are made on the first write, for its device.
    `gpu_yuv`: frames from a GPU become YUV 4:2:0 there (yuv.py) when the codec takes it. `encoder`: "thread" runs the
    writer on this process's background thread; "process" in a child process (encoder_process.py) fed through shared
    page-locked buffers, so encoding never takes the GIL from the thread that launches GPU work; "auto" = "process" for
    a CUDA `device` given up front on POSIX, else "thread". `encoder_nice` lowers the child's priority (process only).
    """

    def __init__(self, path, width: int, height: int, fps: Fraction | float, *, device=None,
                 chunk_frames: int = DEFAULT_CHUNK_FRAMES, slots: int = 2, gpu_yuv: bool = True,
                 encoder: str = "auto", encoder_nice: int = 0, **writer_options: Any):
        from . import encoder_process
        from .encode import check_encoder_options, check_target, takes_yuv420p

        if encoder not in ("auto", "thread", "process"):
            raise ValueError(f"encoder must be 'auto', 'thread' or 'process', got {encoder!r}")
        is_file = isinstance(path, (str, os.PathLike))
        cuda = device is not None and torch.device(device).type == "cuda"
        self._process_mode = is_file and encoder_process.supported() and (
            encoder == "process" or (encoder == "auto" and cuda))
        self._gpu_yuv = bool(gpu_yuv)
        self._codec = writer_options.get("codec", "h264")
        self._takes_yuv = takes_yuv420p(self._codec, width, height)
        self._writer = None
        self._child = None
        self._buffers = None
        self._pinned: list[int] = []
        self._nice = int(encoder_nice)
        if self._process_mode:
            check_encoder_options(self._codec, writer_options.get("crf", 18), writer_options.get("preset", "veryfast"))
            self.path = os.path.abspath(os.fspath(path))
            check_target(self.path, bool(writer_options.get("reserved", False)))
            self._writer_call = ((self.path, width, height, fps), dict(writer_options))
        else:
            self._writer = Mp4Writer(path, width, height, fps, **writer_options)
            self.path = self._writer.path
        try:
            self._start(width, height, device, chunk_frames, slots)
        except BaseException:
            self._discard()
            self._release_slots()
            raise

    def _wants_yuv420p(self, device: torch.device) -> bool:
        # GPU frames only: on the CPU swscale converts faster than torch, and nothing competes for a GPU launch thread
        return self._gpu_yuv and device.type == "cuda" and self._takes_yuv

    def _make_slots(self, count, shape, cuda):
        if self._process_mode:
            from .encoder_process import SharedBuffers

            try:
                self._buffers = SharedBuffers(count, shape)
            except OSError as error:  # no room for shared buffers: encode on this process's thread instead
                logging.getLogger(__name__).warning("Encoding on a thread of this process: %s", error)
                args, kwargs = self._writer_call
                self._writer = Mp4Writer(*args, **kwargs)
                self._process_mode = False
        if not self._process_mode:
            return super()._make_slots(count, shape, cuda)
        from .encoder_process import EncoderProcess

        slots = [torch.from_numpy(array) for array in self._buffers.arrays]
        if cuda:  # page-lock the shared pages so the copies into them stay asynchronous
            for slot in slots:
                if torch.cuda.cudart().cudaHostRegister(slot.data_ptr(), slot.numel(), 0) == 0:
                    self._pinned.append(slot.data_ptr())
        args, kwargs = self._writer_call
        self._child = EncoderProcess(self._buffers, args, kwargs, self._nice)
        return slots

    def _release_slots(self) -> None:
        for pointer in self._pinned:
            torch.cuda.cudart().cudaHostUnregister(pointer)
        self._pinned = []
        self._slots = []
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None

    def _consume_slot(self, index: int, count: int) -> None:
        if self._child is None:
            super()._consume_slot(index, count)
        else:
            self._child.call("frames", index, count, self.yuv420p)

    def _consume_frames(self, frames: torch.Tensor) -> None:
        if self.yuv420p:
            self._writer.write_yuv420p(frames.numpy())
        else:
            self._writer.write_frames(frames.numpy())

    def _consume_audio(self, waveform: Any, sample_rate: int | None) -> None:
        if self._child is None:
            self._writer.write_audio(waveform, sample_rate=sample_rate)
        else:
            array = waveform.float().numpy() if isinstance(waveform, torch.Tensor) else waveform
            self._child.call("audio", array, sample_rate)

    def _complete(self) -> None:
        if self._child is None:
            self._writer.close()
        else:
            self._child.call("close")
            self._child.shutdown()

    def _discard(self) -> None:
        if self._writer is not None:
            self._writer.abort()
        if self._child is not None:
            try:
                self._child.call("abort")
            except BaseException:  # noqa: BLE001 - the child is gone or failed: its temp file goes with its abort
                pass
            self._child.shutdown()
        elif self._process_mode and self._writer_call[1].get("reserved"):
            from .encode import release_placeholder

            release_placeholder(self.path)  # no child ever took the reservation over

    def close(self) -> str:
        """Drain the queue, finish and publish the file; returns its path. Re-raises an encoder error."""
        self._close()
        return self.path

    @property
    def frames_written(self) -> int:
        return self._writer.frames_written if self._writer is not None else int(self.stats["frames"])


class HostFrameCollector(ChunkedFrameStream):
    """Assemble a clip's uint8 frames `[T, H, W, 3]` on the host through the same pinned, double-buffered path (for
    results that must live on the host, e.g. a worker's output). `total_frames` sizes the result up front when known;
    more frames than that still work (the result grows)."""

    def __init__(self, width: int, height: int, total_frames: int | None = None, *, device=None,
                 chunk_frames: int = DEFAULT_CHUNK_FRAMES, slots: int = 2):
        self._out = torch.empty((int(total_frames or 0), int(height), int(width), 3), dtype=torch.uint8)
        self._extra: list[torch.Tensor] = []
        self._filled = 0
        self._start(width, height, device, chunk_frames, slots)

    def _consume_frames(self, frames: torch.Tensor) -> None:
        count = frames.shape[0]
        room = max(0, self._out.shape[0] - self._filled)
        take = min(room, count)
        if take:
            self._out[self._filled:self._filled + take].copy_(frames[:take])
        if take < count:
            self._extra.append(frames[take:].clone())
        self._filled += count

    def close(self) -> torch.Tensor:
        """All frames written, as one host uint8 tensor [T, H, W, 3]."""
        self._close()
        out = self._out[: self._filled] if not self._extra else torch.cat([self._out, *self._extra])
        self._out, self._extra = out, []
        return out
