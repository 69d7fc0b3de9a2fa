"""The MiniMax-H3 denoise loop for t2va, fl2va and ref2va: one packed sequence, one forward per step, no CFG.

Noise draw order (from one CPU generator seeded with the request seed, matching the released pipeline): one draw per
visual condition in packed order, then video noise [1, 24, T, h, w], then audio noise directly as rows [2*Ta, 32].
Condition rows are mixed to t = 0.999 once and never written again; only target rows are stepped.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ...parallel.context import SINGLE, ParallelContext
from ...parallel.ulysses import SequenceShard
from .components import H3Components
from .conditioning import normalize_references, prepare_keyframes
from .decode import decode_audio, decode_frames_to_host
from .geometry import Geometry, RequestError, resolve_canvas, resolve_geometry
from .layout import (CONDITION_T, PackedLayout, ReferenceBlock, audio_rows_to_latents, build_layout,
                     build_reference_layout, patchify, unpatchify)
from .request import H3Request, H3Result
from .schedule import DualSchedule, euler_step, row_timestep_plan
from .step_plan import Cancelled, request_rope, step_segments, stop_at_boundary  # noqa: F401 - Cancelled: its public home

StepCallback = Callable[[int, int], None]  # (steps done, total)


class H3Pipeline:
    def __init__(self, components: H3Components, parallel: ParallelContext = SINGLE, attention=None):
        """parallel.world > 1: Ulysses sequence parallelism over an initialised torch.distributed group; every rank
        runs this same pipeline (same seed, same layout) and owns 1/world of the packed rows in the DiT.
        `attention`: the runtime's attention backend (its per-request plan hook); None: the DiT's own."""
        self.c = components
        self.parallel = parallel
        self.attention = attention

    @property
    def rank(self) -> int:
        return self.parallel.rank

    @property
    def world(self) -> int:
        return self.parallel.world

    # -- request resolution -------------------------------------------------------------------------------------
    def resolve(self, req: H3Request) -> tuple[Geometry, list, tuple[str, ...]]:
        req.validate()
        c = self.c
        if not c.has_partition(req.task):
            raise RequestError(f"This model folder has no {'transformer_ref' if req.task == 'ref2va' else 'transformer'}"
                               f"/ partition, which the {req.task} task needs.")
        multiple = c.spatial_ratio * c.patch_size[2]
        height, width = req.height, req.width
        keyframes, anchors = [], ()
        if height is None:
            aspect = (16, 9)
            if req.task == "fl2va":
                aspect = (req.first_frame if req.first_frame is not None else req.last_frame).size
            height, width = resolve_canvas(*aspect, multiple, c.options.canvas_short_edge, c.options.canvas_max_pixels)
        geo = resolve_geometry(req.num_frames, height, width, c.spatial_ratio, multiple, c.frames_per_chunk,
                               c.latents_per_chunk)
        if req.task == "fl2va":
            keyframes, anchors = prepare_keyframes(req.first_frame, req.last_frame, geo.width, geo.height)
        return geo, keyframes, anchors

    # -- the run ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, req: H3Request, on_step: StepCallback | None = None,
            should_stop: Callable[[], bool] | None = None) -> H3Result:
        req = self.c.with_folder_shifts(req)  # every task: unset shifts are the model folder's
        if req.task == "edit":  # latent mask editing: its own loop (editing_loop.py); the paths below are untouched
            from .editing_loop import run_edit

            return run_edit(self, req, on_step, should_stop)
        if req.task == "extend":  # continuation window by window (extension_loop.py)
            from .extension_loop import run_extend

            return run_extend(self, req, on_step, should_stop)
        c, timings = self.c, {}
        t0 = time.perf_counter()
        geo, keyframes, anchors = self.resolve(req)
        patch = c.patch_size
        dit = c.transformer_for(req.task)
        dev = c.device

        # 1. text + conditioning anchors
        conditions: list[torch.Tensor] = []
        audio_conditions: list[torch.Tensor] = []
        if req.task == "ref2va":
            refs = normalize_references(req.references, geo.num_frames, c.spatial_ratio * patch[2],
                                        c.options.reference_image_short_edge, c.audio_rate,
                                        c.options.canvas_short_edge, c.options.canvas_max_pixels)
            text, tags = self._shared_text(lambda: c.text.encode_references(req.prompt, refs))
            blocks = []
            for ref in refs:
                shape, n_audio = None, 0
                if ref.kind == "image":
                    conditions.append(c.cond.encode_image(ref.image))
                elif ref.kind == "video":
                    conditions.append(c.cond.encode_video(ref.frames))
                if ref.kind != "audio":
                    shape = tuple(conditions[-1].shape[2:5])
                if ref.has_audio:
                    audio_conditions.append(c.cond.encode_audio(ref.audio))
                    n_audio = audio_conditions[-1].shape[0] // 2
                blocks.append(ReferenceBlock(ref.kind, shape, n_audio))
            layout = build_reference_layout(tags, geo, patch, blocks)
        else:
            text, tags = self._shared_text(lambda: c.text.encode_prompt(req.prompt, keyframes or None))
            conditions = [c.cond.encode_image(k) for k in keyframes]
            layout = build_layout(tags, geo, patch, anchors)
        timings["encode_s"] = time.perf_counter() - t0

        # 2. noise, in the reference's draw order
        gen = torch.Generator("cpu").manual_seed(req.seed)
        t_cond = torch.tensor(CONDITION_T, dtype=torch.float32)
        cond_rows = []
        for cond in conditions:
            noise = torch.randn(cond.shape, generator=gen, dtype=torch.float32)
            cond_rows.append(patchify(t_cond * cond + (1.0 - t_cond) * noise, patch))
        video_noise = torch.randn((1, c.latent_channels, geo.latent_frames, geo.latent_height, geo.latent_width),
                                  generator=gen, dtype=torch.float32)
        audio_noise = torch.randn((geo.audio_latents * 2, c.audio_channels), generator=gen, dtype=torch.float32)
        video = torch.cat(cond_rows + [patchify(video_noise, patch)]).to(dev)
        audio = torch.cat(audio_conditions + [audio_noise]).to(dev)
        if video.shape[0] != layout.video_indices.numel() or audio.shape[0] != layout.audio_indices.numel():
            raise RuntimeError(f"Layout/rows mismatch: video {video.shape[0]} vs {layout.video_indices.numel()}, "
                               f"audio {audio.shape[0]} vs {layout.audio_indices.numel()}")

        # 3. denoise
        t1 = time.perf_counter()
        video, audio = self.denoise(dit, layout, text.to(dev), video, audio,
                                    DualSchedule.make(req.steps + 1, req.video_shift, req.audio_shift),
                                    on_step, should_stop)
        timings["denoise_s"] = time.perf_counter() - t1

        video_latents = unpatchify(video[layout.num_condition_video_rows:].float().cpu(), c.latent_channels,
                                   geo.latent_frames, geo.latent_height, geo.latent_width, patch)
        audio_latents = audio_rows_to_latents(audio[layout.num_condition_audio_rows:].float().cpu(), geo.audio_latents)
        frames = wave = None
        if req.decode:
            t2 = time.perf_counter()
            frames = decode_frames_to_host(c.vae, video_latents, dev, geo, self.parallel)
            if self.parallel.is_driver:
                wave = decode_audio(c.audio_vae, audio_latents, dev)
            timings["decode_s"] = time.perf_counter() - t2
        timings["total_s"] = time.perf_counter() - t0
        return H3Result(req.task, video_latents, audio_latents, frames, wave, c.audio_rate, timings=timings)

    def _shared_text(self, encode):
        """Rank 0 encodes the prompt (the only rank holding the text encoder) and broadcasts embeddings [1, Nt, D]
        and tags [Nt]; with one rank this is just `encode()`."""
        if self.world == 1:
            return encode()
        import torch.distributed as dist

        dev = self.c.device
        dtypes = (torch.float32, torch.bfloat16, torch.float16)
        if self.rank == 0:
            text, tags = encode()
            meta = torch.tensor([text.shape[1], text.shape[2], dtypes.index(text.dtype)], device=dev)
        else:
            meta = torch.zeros(3, dtype=torch.long, device=dev)
        dist.broadcast(meta, src=0)
        n, width, code = meta.tolist()
        if self.rank != 0:
            text = torch.empty((1, n, width), dtype=dtypes[code], device=dev)
            tags = torch.empty(n, dtype=torch.long)
        tags_dev = tags.to(dev)
        dist.broadcast(text, src=0)
        dist.broadcast(tags_dev, src=0)
        return text, tags_dev.cpu()

    def denoise(self, dit, layout: PackedLayout, text: torch.Tensor, video: torch.Tensor, audio: torch.Tensor,
                schedule: DualSchedule, on_step: StepCallback | None = None,
                should_stop: Callable[[], bool] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """video rows [Nv, 96] / audio rows [Na, 32] float32 (condition rows first) -> denoised rows."""
        dev = video.device
        dl = layout.to(dev)
        shard = None if self.world == 1 else SequenceShard(self.rank, self.world, layout.seq_len)
        rope = request_rope(dit, dl.position_ids, shard)
        n = schedule.num_evaluations
        ncv, nca = layout.num_condition_video_rows, layout.num_condition_audio_rows
        for i in range(n):
            stop_at_boundary(should_stop, shard, i, n)
            vt, at = schedule.video_t(i), schedule.audio_t(i)
            ts, row_index = row_timestep_plan(layout, float(vt), float(at))
            segments = step_segments(layout.token_tags, row_index, shard)
            v_pred, a_pred = dit(video[None], audio[None], text, ts.to(dev), row_index.to(dev), dl.token_tags,
                                 dl.position_ids, dl.video_indices, dl.audio_indices, dl.text_indices,
                                 rope=rope, segments=segments, shard=shard)
            video[ncv:] = euler_step(video[ncv:], v_pred[0, ncv:], vt, schedule.video_sigmas[i],
                                     schedule.video_sigmas[i + 1])
            audio[nca:] = euler_step(audio[nca:], a_pred[0, nca:], at, schedule.audio_sigmas[i],
                                     schedule.audio_sigmas[i + 1])
            if on_step is not None:
                on_step(i + 1, n)
        return video, audio
