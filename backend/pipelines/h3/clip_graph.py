"""The video VAE's clip decode replayed from a CUDA graph, for a decode that streams into a CPU encoder.

The released decoder (a 36-layer ViT, spatially tiled) is launch-bound on the H200: ~40,000 kernel launches per
clip, so its launch thread needs a whole host core, and x264 running beside it on every core slows it down
(docs/BENCHMARKS.md, "Decode -> MP4"). Every clip of a decode has the same input shape (the tail is padded to a whole
clip, vae_clips.clip_schedule), so one capture serves them all: the first clip runs eagerly (it also sets up
cuBLAS/cuDNN), the second is captured, and every later clip is one `replay()`.

When it pays (H200, released-size VAE, bf16): streamed into the MP4 at 10 s it took 13.78 s vs 14.02 s eager; a
decode to host memory with nothing beside it is faster eager (the capture and instantiation cost ~1 s that a
few replays do not win back: 7.81 s graphed vs 6.88 s eager at 5 s, runs of two sessions), so it is opt-in
(`cuda_graphs=True`).

The graph runs the kernels eager mode picked, so the output equals the eager decode bit for bit (tested on the GPU).
A capture that fails (an op that syncs with the host, a VAE that is not capturable) falls back to eager for the rest
of the decode with a warning; nothing is lost. The graph's private memory pool holds one clip's activations until
`release()`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch

from .tile_batch import decode_clip_tiles_batched


class GraphedClipDecode:
    """decode(z [1, C, t, h, w]) -> the clip decoder's output, replayed from a CUDA graph after the first call of a
    shape. Each result is a fresh tensor (the graph's own output buffer is overwritten by the next replay)."""

    def __init__(self, decode: Callable[[torch.Tensor], torch.Tensor]):
        self.decode = decode
        self.failed = False  # a capture failed: eager from then on
        self.captures = 0
        self.replays = 0
        self._warm_key = None  # the shape run eagerly once, to capture at its next call
        self._key = None
        self._graph = self._input = self._output = None

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.failed:
            return self.decode(z)
        key = (tuple(z.shape), z.dtype, z.device)
        if key != self._key:
            if key != self._warm_key:
                self._warm_key = key
                return self.decode(z)
            if not self._capture(z, key):
                return self.decode(z)
        self._input.copy_(z)
        self._graph.replay()
        self.replays += 1
        return self._output.clone()

    def _capture(self, z: torch.Tensor, key) -> bool:
        self.release()
        try:
            static_in = z.clone()
            graph, static_out = capture_graph(self.decode, static_in)
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager is always correct
            self.failed = True
            if z.is_cuda:
                torch.cuda.synchronize(z.device)
            warnings.warn(f"The video VAE could not be captured in a CUDA graph ({type(exc).__name__}: {exc}); "
                          f"decoding eagerly.", RuntimeWarning, stacklevel=3)
            return False
        self._graph, self._input, self._output, self._key = graph, static_in, static_out, key
        self.captures += 1
        return True

    def release(self) -> None:
        """Frees the graph and its memory pool (the next call of a shape runs eagerly and captures again)."""
        self._graph = self._input = self._output = None
        self._key = self._warm_key = None


def capture_graph(fn, static_in: torch.Tensor):
    """(graph, output buffer) of fn(static_in) captured on a side stream. Not `torch.cuda.graph(...)`: its entry
    empties the device and pinned-host caches, which after a DiT run means freeing ~90 GiB of cached blocks (9 s
    added to a 5-s request's decode on the H200) that the next request then allocates again. thread_local: the
    saver's copy thread may use CUDA while this thread captures."""
    device = static_in.device
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            static_out = fn(static_in)
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(side)
    return graph, static_out


def clip_decoder(vae, device, cuda_graphs: bool = False, batch_tiles: bool | None = None):
    """What decodes one clip [1, 24, t, h, w] -> [1, 3, t', H, W]: the clip's spatial tiles in one batch
    (tile_batch.py; `batch_tiles`, by default on CUDA devices, where the tile-by-tile decode is launch-bound) or
    `vae._decode_clip` tile by tile (the CPU's default: bit for bit the reference), replayed from a CUDA graph when
    `cuda_graphs` and `device` is a CUDA device. Call `.release()` on a GraphedClipDecode when the decode ends."""
    cuda = torch.device(device).type == "cuda"
    batched = cuda if batch_tiles is None else batch_tiles
    decode = functools.partial(decode_clip_tiles_batched, vae) if batched else vae._decode_clip
    return GraphedClipDecode(decode) if cuda_graphs and cuda else decode
