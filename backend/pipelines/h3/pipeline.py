"""H3Pipeline: what one H3 worker rank runs (backend/families.py's contract: `run(request, on_step, should_stop)`).

It holds the rank's components, ParallelContext and attention backend, dispatches a request on its task through
TASKS (each task in tasks/ builds its step plan, runs it through the one denoise driver and decodes), and lends the
tasks what all of them share: prompt embeddings computed on rank 0 and broadcast (`encode_text`) and the denoise
driver bound to this rank (`denoise`). With several ranks every rank runs the same task (same seed, same layout) and
owns 1/world of the packed rows in the DiT (Ulysses).
"""

from __future__ import annotations

from typing import Callable

import torch

from ...errors import RequestError
from ...manifest import StageRecorder, pipeline_part
from ...parallel.context import SINGLE, ParallelContext
from .components import H3Components
from . import step_cache
from .denoise import denoise
from .preview import LatentRGB, StepPreview
from .request import H3Result
from .step_plan import StepCallback, StepPlan
from .tasks.edit import run_edit
from .tasks.extend import run_extend
from .tasks.generate import run_generate

TASKS = {"t2va": run_generate, "fl2va": run_generate, "ref2va": run_generate, "edit": run_edit,
         "extend": run_extend}  # request.task -> run(pipeline, request, on_step, should_stop)


class H3Pipeline:
    def __init__(self, components: H3Components, parallel: ParallelContext = SINGLE, attention=None):
        """`parallel`: this rank among the engine's ranks (world > 1: an initialised torch.distributed group).
        `attention`: the runtime's attention backend (its per-request plan hook); None: the DiT's own, no plan."""
        self.c = components
        self.parallel = parallel
        self.attention = attention
        self.preview: StepPreview | None = None  # the running request's previews (rank 0, when asked for)
        self._latent_rgb: LatentRGB | None = None  # the preview projection, fitted once from this engine's VAE
        self._switched: dict | None = None  # what the last live-option switch did, for the next manifest
        self._cache_settings = None  # the running request's step cache (step_cache.py); None: off
        self._step_cache_reports: list[dict] = []

    def set_live_options(self, live: dict) -> None:
        """The engine's live options (families.py) before a job: the LoRAs, switched in place when they changed."""
        done = self.c.switch_loras(live.get("loras", ()))
        if done is not None:
            self._switched = done

    @torch.no_grad()
    def run(self, req, on_step: StepCallback | None = None, should_stop: Callable[[], bool] | None = None) -> H3Result:
        """An H3Request (t2va / fl2va / ref2va / edit, by its inputs) or an H3ExtendRequest. The result carries
        its stage manifest (backend/manifest.py; every rank gathers the peaks, rank 0's is the one returned)."""
        self.recorder = StageRecorder(self.c.device)
        self.preview = self._preview_for(req)
        self._cache_settings = step_cache.parse(getattr(req, "step_cache", "off"))
        self._step_cache_reports = []
        try:
            result = TASKS[req.task](self, req, on_step, should_stop)
        finally:
            self.preview = None
        result.manifest = pipeline_part(
            self.recorder, self.parallel, kind=req.task, family="h3", task=req.task, shapes=_shapes(result),
            seed=req.seed, steps=req.steps, timings=result.timings, adaln=self.c.adaln_report())
        result.manifest["step_cache"] = step_cache.summary(self._step_cache_reports, result.timings)
        shifted = self.c.with_folder_shifts(req)  # the shifts as the task ran them (a turbo LoRA's, the folder's)
        result.manifest["request"]["schedule"] = {"name": getattr(req, "schedule", "default"),
                                                  "video_shift": shifted.video_shift,
                                                  "audio_shift": shifted.audio_shift}
        result.manifest["engine"]["live_switch"], self._switched = self._switched, None
        return result

    def denoise(self, dit, plan: StepPlan, video: torch.Tensor, audio: torch.Tensor,
                on_step: StepCallback | None = None,
                should_stop: Callable[[], bool] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The one denoise driver (denoise.py) on this rank's parallel context and attention backend, with the DiT's
        AdaLN table cache when the weight policy asks for one. Under the offload placement the DiT stage is
        planned first (resident blocks for this shape; text encoder / VAEs off the device if short)."""
        shard = self.parallel.rows(plan.layout.seq_len)
        self.c.enter_dit(dit, plan.layout.seq_len if shard is None else shard.local_len, plan.layout.seq_len)
        settings = self._cache_settings
        cache = None if settings is None else step_cache.StepCache(
            settings, len(dit.transformer_blocks), None if not self.parallel.is_parallel else self.parallel.sum)
        try:
            return denoise(dit, plan, video, audio, self.parallel, self.attention, on_step, should_stop,
                           adaln=self.c.adaln_cache(dit), recorder=getattr(self, "recorder", None),
                           preview=getattr(self, "preview", None), step_cache=cache)
        finally:
            if cache is not None:
                self._step_cache_reports.append(cache.report())

    def _preview_for(self, req) -> StepPreview | None:
        """Previews every `req.preview_every` steps (0: none) on rank 0, which alone reports progress. The
        projection is fitted from the VAE at the first request that asks (preview.py), before the DiT stage, so
        the VAE is where the offload placement expects it."""
        every = int(getattr(req, "preview_every", 0) or 0)
        if every <= 0 or not self.parallel.is_driver:
            return None
        if self._latent_rgb is None:
            c = self.c
            self._latent_rgb = LatentRGB.fit(lambda pixels: c.cond.encode_pixels(pixels, sample=False),
                                             c.frames_per_chunk + c.latents_per_chunk)
        return StepPreview(self._latent_rgb, self.c.patch_size, every)

    def encode_text(self, encode: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank 0 runs `encode` (it alone holds the text encoder) and broadcasts the embeddings [1, Nt, D] and tags
        [Nt] (host); with one rank this is just `encode()`. When `encode` fails on rank 0 (a reference the processor
        refuses, say) every rank raises: a RequestError as a RequestError with rank 0's message, anything else as a
        RuntimeError, so no rank is left waiting in a broadcast of a job that has already failed."""
        recorder = getattr(self, "recorder", None)
        if recorder is not None:  # rank 0's encode (and, with several ranks, the broadcast) is the text stage
            with recorder.stage("text_encode_s"):
                return self._encode_text(encode)
        return self._encode_text(encode)

    def _encode_text(self, encode):
        p = self.parallel
        if not p.is_parallel:
            return encode()
        dev = self.c.device
        dtypes = (torch.float32, torch.bfloat16, torch.float16)
        failure = None
        if p.is_driver:
            try:
                text, tags = encode()
                meta = torch.tensor([text.shape[1], text.shape[2], dtypes.index(text.dtype)], device=dev)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks know
                failure = exc
                reason = str(exc).encode("utf-8", "replace")[:4000]
                meta = torch.tensor([-1, len(reason), int(isinstance(exc, RequestError))], device=dev)
        else:
            meta = torch.zeros(3, dtype=torch.long, device=dev)
        n, width, code = p.broadcast_from_driver(meta).tolist()
        if n < 0:  # rank 0's encode failed: [-1, message bytes, is a request error]
            message = torch.zeros(width, dtype=torch.uint8, device=dev)
            if failure is not None and width:
                message.copy_(torch.frombuffer(bytearray(reason), dtype=torch.uint8))
            text_of = bytes(p.broadcast_from_driver(message).cpu().tolist()).decode("utf-8", "replace")
            if failure is not None:
                raise failure
            raise (RequestError if code else RuntimeError)(text_of)
        if not p.is_driver:
            text = torch.empty((1, n, width), dtype=dtypes[code], device=dev)
            tags = torch.empty(n, dtype=torch.long)
        tags_dev = tags.to(dev)
        p.broadcast_from_driver(text)
        p.broadcast_from_driver(tags_dev)
        return text, tags_dev.cpu()


def _shapes(result: H3Result) -> dict:
    """The request's sizes as they ran (latent grids; frames [F, H, W] and audio samples when decoded)."""
    shapes = {"video_latents": list(result.video_latents.shape), "audio_latents": list(result.audio_latents.shape)}
    if result.frames is not None:
        shapes["frames"] = list(result.frames.shape[:3])
    if result.audio is not None:
        shapes["audio_samples"] = int(result.audio.shape[-1])
    info = result.extend or result.edit or {}
    for key in ("width", "height", "num_frames"):
        if isinstance(info.get(key), int):
            shapes[key] = info[key]
    return shapes
