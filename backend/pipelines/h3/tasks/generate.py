"""t2va, fl2va and ref2va: one packed sequence [text | conditions | target audio | target video], one forward per
step, no CFG. The three differ only in their conditions (CONDITIONS below): keyframes (none for t2va, first and/or
last frame for fl2va) or references (ref2va); everything after is shared.

Noise draw order (from one CPU generator seeded with the request seed, matching the released pipeline): one draw per
visual condition in packed order, then video noise [1, 24, T, h, w], then audio noise directly as rows [2*Ta, 32].
Condition rows are mixed to t = 0.999 once and never written again; only target rows are stepped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..components import TASK_PARTITION
from ..conditioning import normalize_references, prepare_keyframes
from ..decode import decode_audio, decode_frames_to_host
from ..geometry import Geometry, RequestError, resolve_canvas, resolve_geometry
from ..layout import (PackedLayout, ReferenceBlock, audio_rows_to_latents, build_layout, build_reference_layout,
                      held_at_condition, patchify, unpatchify)
from ..init_clip import with_clip_latents
from ..request import H3Request, H3Result
from ..row_fit import check_layout_fits
from ..schedule import DualSchedule
from ..step_plan import StepCallback
from ..strength import start_rows, step_plan
from ..student import check_student

DEFAULT_ASPECT = (16, 9)  # the canvas without width/height or a keyframe to follow


@dataclass
class Conditions:
    """What a task conditions on: prompt embeddings [1, Nt, D] and the packed layout, visual conditions (normalised
    latents [1, 24, T, h, w], in packed order) and reference soundtrack rows ([2*Ta, 32] each, in packed order)."""

    text: torch.Tensor
    layout: PackedLayout
    visual: list[torch.Tensor] = field(default_factory=list)
    audio_rows: list[torch.Tensor] = field(default_factory=list)


class Keyframes:
    """t2va (no keyframe) and fl2va (first and/or last frame): the first given keyframe is stretched onto the canvas
    and sets its aspect, a follower is cover-cropped; each is one latent frame of condition rows."""

    @staticmethod
    def aspect(req: H3Request) -> tuple[float, float]:
        image = req.first_frame if req.first_frame is not None else req.last_frame
        return DEFAULT_ASPECT if image is None else image.size

    @staticmethod
    def encode(pipe, req: H3Request, geo: Geometry) -> Conditions:
        c = pipe.c
        keyframes, anchors = prepare_keyframes(req.first_frame, req.last_frame, geo.width, geo.height)
        text, tags = pipe.encode_text(lambda: c.text.encode_prompt(req.prompt, keyframes or None))
        return Conditions(text, build_layout(tags, geo, c.patch_size, anchors),
                          [c.cond.encode_image(k) for k in keyframes])


class References:
    """ref2va: images, videos (with their soundtracks) and soundtracks, each a reference block in request order."""

    @staticmethod
    def aspect(req: H3Request) -> tuple[float, float]:
        return DEFAULT_ASPECT

    @staticmethod
    def encode(pipe, req: H3Request, geo: Geometry) -> Conditions:
        c, patch = pipe.c, pipe.c.patch_size
        refs = normalize_references(req.references, geo.num_frames, c.spatial_ratio * patch[2],
                                    c.options.reference_image_short_edge, c.audio_rate,
                                    c.options.canvas_short_edge, c.options.canvas_max_pixels)
        text, tags = pipe.encode_text(lambda: c.text.encode_references(req.prompt, refs))
        visual, audio_rows, blocks = [], [], []
        for ref in refs:
            shape, n_audio = None, 0
            if ref.kind == "image":
                visual.append(c.cond.encode_image(ref.image))
            elif ref.kind == "video":
                visual.append(c.cond.encode_video(ref.frames))
            if ref.kind != "audio":
                shape = tuple(visual[-1].shape[2:5])
            if ref.has_audio:
                audio_rows.append(c.cond.encode_audio(ref.audio))
                n_audio = audio_rows[-1].shape[0] // 2
            blocks.append(ReferenceBlock(ref.kind, shape, n_audio))
        return Conditions(text, build_reference_layout(tags, geo, patch, blocks), visual, audio_rows)


CONDITIONS = {"t2va": Keyframes, "fl2va": Keyframes, "ref2va": References}


def resolve(c, req: H3Request) -> Geometry:
    """Validate the request and size it on the loaded model's grids (the canvas follows the conditions' aspect when
    width/height are unset)."""
    req.validate()
    if not c.has_partition(req.task):
        raise RequestError(f"This model folder has no {TASK_PARTITION[req.task]}/ partition, which the {req.task} "
                           "task needs.")
    multiple = c.spatial_ratio * c.patch_size[2]
    height, width = req.height, req.width
    if height is None:
        height, width = resolve_canvas(*CONDITIONS[req.task].aspect(req), multiple, c.options.canvas_short_edge,
                                       c.options.canvas_max_pixels)
    return resolve_geometry(req.num_frames, height, width, c.spatial_ratio, multiple, c.frames_per_chunk,
                            c.latents_per_chunk)


@torch.no_grad()
def run_generate(pipe, req: H3Request, on_step: StepCallback | None = None,
                 should_stop: Callable[[], bool] | None = None) -> H3Result:
    """pipe: the rank's H3Pipeline (components, parallel context, text sharing, the denoise driver)."""
    req = pipe.c.with_folder_shifts(req)  # unset shifts: the model folder's
    c, timings = pipe.c, {}
    t0 = time.perf_counter()
    geo = resolve(c, req)
    check_student(c, req)
    patch, dev = c.patch_size, c.device
    dit = c.transformer_for(req.task)

    # 1. text + conditions (and a source clip's latents)
    cond = CONDITIONS[req.task].encode(pipe, req, geo)
    # the rows are known now: a request the GPU cannot hold is refused before the clip's encode and any step
    check_layout_fits(geo, cond.layout, c.dit_room(dit), pipe.parallel.world, patch, c.spatial_ratio, str(dev))
    req = with_clip_latents(c, req, geo)
    timings["encode_s"] = time.perf_counter() - t0

    # 2. noise, in the reference's draw order
    gen = torch.Generator("cpu").manual_seed(req.seed)
    cond_rows = [patchify(held_at_condition(latents, torch.randn(latents.shape, generator=gen, dtype=torch.float32)),
                          patch) for latents in cond.visual]
    video_noise = torch.randn((1, c.latent_channels, geo.latent_frames, geo.latent_height, geo.latent_width),
                              generator=gen, dtype=torch.float32)
    audio_noise = torch.randn((geo.audio_latents * 2, c.audio_channels), generator=gen, dtype=torch.float32)
    # from noise, or from the request's source latents at its strength (strength.py)
    schedule = DualSchedule.named(req.schedule, req.steps, req.video_shift, req.audio_shift)
    schedule, target_video, target_audio = start_rows(req, geo, schedule, video_noise, audio_noise, patch)
    video = torch.cat(cond_rows + [target_video]).to(dev)
    audio = torch.cat(cond.audio_rows + [target_audio]).to(dev)

    # 3. denoise
    t1 = time.perf_counter()
    video, audio = pipe.denoise(dit, step_plan(cond.layout, cond.text.to(dev), schedule, req.init_audio_mode),
                                video, audio, on_step, should_stop)
    timings["denoise_s"] = time.perf_counter() - t1

    layout = cond.layout
    video_latents = unpatchify(video[layout.num_condition_video_rows:].float().cpu(), c.latent_channels,
                               geo.latent_frames, geo.latent_height, geo.latent_width, patch)
    audio_latents = audio_rows_to_latents(audio[layout.num_condition_audio_rows:].float().cpu(), geo.audio_latents)
    frames = wave = None
    if req.decode:
        t2 = time.perf_counter()
        frames = decode_frames_to_host(c.vae, video_latents, dev, geo, pipe.parallel, should_stop)
        if pipe.parallel.is_driver:  # rank 0 holds the frames; it alone decodes the soundtrack
            wave = decode_audio(c.audio_vae, audio_latents, dev)
        timings["decode_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    return H3Result(req.task, video_latents, audio_latents, frames, wave, c.audio_rate, timings=timings)
