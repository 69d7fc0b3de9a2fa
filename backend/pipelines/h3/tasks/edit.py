"""The "edit" task: latent mask editing on the t2va partition (math and conventions: editing.py's docstring).

Packed layout is t2va's ([text | target audio | target video], no condition rows): source rows are not extra rows,
they are the target rows themselves, held at their anchor where the mask keeps them. Its step plan: each row's
timestep from its mask (editing.row_timesteps; text rides the video clock) and anchors (the model sees
lerp(anchor, state, mask)); the driver's update then takes x0 with that per-row timestep. Noise is drawn in t2va's
order (video [1, 24, T, h, w], then audio rows [2*Ta, 32]) from torch.Generator('cpu').manual_seed(seed), so an
all-ones mask with audio "regenerate" reproduces t2va's latents for the same prompt, size and seed.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..decode import decode_audio, decode_frames_to_host
from ..editing import (audio_row_mask, composite_frames, mask_to_latent_grid, prepare_audio, prepare_source,
                       resolve_preset, row_timesteps)
from ..geometry import AUDIO_LATENTS_PER_SECOND, RequestError, resolve_geometry
from ..layout import PackedLayout, audio_rows_to_latents, build_layout, held_at_condition, patchify, unpatchify
from ..request import H3Request, H3Result
from ..schedule import DualSchedule
from ..student import check_student
from ..step_plan import Anchors, StepCallback, StepPlan
from ..strength import noised, truncated


@torch.no_grad()
def run_edit(pipe, req: H3Request, on_step: StepCallback | None = None,
             should_stop: Callable[[], bool] | None = None) -> H3Result:
    """pipe: the rank's H3Pipeline (components, parallel context, text sharing, the denoise driver). Returns task
    "edit" with `edit` info:
    restore mask [T_lat, h, w], token mask [T_lat, h/2, w/2], audio row mask [2*Ta], source latents (video
    [1, 24, T, h, w], audio [2, 32, Ta]) and the resolved preset values."""
    req = pipe.c.with_folder_shifts(req)  # unset shifts: the model folder's
    req.validate()
    c, timings = pipe.c, {}
    t0 = time.perf_counter()
    if not c.has_partition("edit"):
        raise RequestError("This model folder has no transformer/ partition, which the edit task needs.")
    check_student(c, req)
    patch = c.patch_size
    multiple = c.spatial_ratio * patch[2]
    grow, feather, mode, level = resolve_preset(req.preset, req.mask_grow, req.mask_feather, req.audio_mode,
                                                req.audio_level)
    src = prepare_source(req.source_frames, req.mask, req.source_fps, grow, feather, multiple,
                         c.options.canvas_max_pixels, c.frames_per_chunk, c.latents_per_chunk)
    n_frames, height, width = src.frames.shape[:3]
    geo = resolve_geometry(n_frames, height, width, c.spatial_ratio, multiple, c.frames_per_chunk,
                           c.latents_per_chunk)
    masks = mask_to_latent_grid(src.mask, c.spatial_ratio, patch[1:], c.frames_per_chunk,
                                int(c.vae.temporal_compression_ratio))
    want = (geo.latent_frames, geo.latent_height // patch[1], geo.latent_width // patch[2])
    if tuple(masks.token.shape) != want:
        raise RuntimeError(f"Token mask {tuple(masks.token.shape)} does not match the latent grid {want}.")
    dev, dit = c.device, c.transformer_for("edit")

    # 1. text, source latents (video: the conditioning encoder's fixed-seed posterior sample; audio: posterior mode)
    text, tags = pipe.encode_text(lambda: c.text.encode_prompt(req.prompt, None))
    layout = build_layout(tags, geo, patch)
    clean_video = c.cond.encode_video(src.frames)
    if tuple(clean_video.shape[2:]) != (geo.latent_frames, geo.latent_height, geo.latent_width):
        raise RuntimeError(f"Encoded source {tuple(clean_video.shape)} does not match the geometry {geo}.")
    hop = c.audio_rate // AUDIO_LATENTS_PER_SECOND
    wave, valid = prepare_audio(req.source_audio, req.source_sample_rate, c.audio_rate, geo.audio_latents * hop)
    clean_audio = c.cond.encode_audio(wave).reshape(2, -1, c.audio_channels)
    ta = geo.audio_latents
    if clean_audio.shape[1] < ta:  # encoder rounding: pad the tail (it is regenerated anyway)
        clean_audio = torch.cat([clean_audio, clean_audio.new_zeros(2, ta - clean_audio.shape[1],
                                                                     clean_audio.shape[2])], 1)
    clean_audio = clean_audio[:, :ta].reshape(2 * ta, -1).contiguous()
    audio_mask = audio_row_mask(ta, min(valid // hop, ta), mode, level)
    timings["encode_s"] = time.perf_counter() - t0

    # 2. noise in t2va's draw order; anchors
    gen = torch.Generator("cpu").manual_seed(req.seed)
    video_noise = torch.randn((1, c.latent_channels, geo.latent_frames, geo.latent_height, geo.latent_width),
                              generator=gen, dtype=torch.float32)
    audio_noise = torch.randn((ta * 2, c.audio_channels), generator=gen, dtype=torch.float32)
    clean_v = patchify(clean_video, patch)
    noise_v = patchify(video_noise, patch)
    video_mask = masks.token_rows()
    anchors = Anchors(held_at_condition(clean_v, noise_v).to(dev), clean_audio.to(dev), video_mask.to(dev),
                      audio_mask.to(dev))

    # 3. denoise: the state starts as the seeded noise (target rows only: no condition rows), or below denoise 1 as
    # the source noised to the first sigma of the truncated schedule (strength.py: the masked region re-made from it)
    t1 = time.perf_counter()
    schedule = DualSchedule.named(req.schedule, req.steps, req.video_shift, req.audio_shift)
    start_v, start_a = noise_v, audio_noise
    if req.denoise < 1:
        schedule = truncated(schedule, float(req.denoise), "same", req.audio_shift)
        start_v = noised(clean_v, noise_v, schedule.video_sigmas[0])
        start_a = noised(clean_audio, audio_noise, schedule.audio_sigmas[0])
    plan = StepPlan(layout, text.to(dev), schedule, masked_timesteps(layout, video_mask, audio_mask, schedule), anchors)
    state_v, state_a = pipe.denoise(dit, plan, start_v.to(dev), start_a.to(dev), on_step, should_stop)
    timings["denoise_s"] = time.perf_counter() - t1

    # 4. restore: kept cells are the clean source exactly
    restore_v = masks.restore_rows(patch, c.latent_channels)
    final_v = torch.lerp(clean_v, state_v.float().cpu(), restore_v)
    final_a = torch.lerp(clean_audio, state_a.float().cpu(), audio_mask[:, None])
    video_latents = unpatchify(final_v, c.latent_channels, geo.latent_frames, geo.latent_height, geo.latent_width,
                               patch)
    audio_latents = audio_rows_to_latents(final_a, ta)

    frames = audio = None
    if req.decode:
        t2 = time.perf_counter()
        edited = decode_frames_to_host(c.vae, video_latents, dev, geo, pipe.parallel, should_stop)
        recon = decode_frames_to_host(c.vae, clean_video, dev, geo, pipe.parallel, should_stop)
        if pipe.parallel.is_driver:  # rank 0 assembled both videos
            frames = composite_frames(recon, edited, src.mask)
            audio = decode_audio(c.audio_vae, audio_latents, dev)
        timings["decode_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    info = {"preset": req.preset, "mask_grow": grow, "mask_feather": feather, "audio_mode": mode,
            "audio_level": level, "restore_mask": masks.restore, "token_mask": masks.token,
            "audio_mask": audio_mask, "source_video_latents": clean_video,
            "source_audio_latents": audio_rows_to_latents(clean_audio, ta), "width": width, "height": height,
            "num_frames": n_frames}
    return H3Result("edit", video_latents, audio_latents, frames, audio, c.audio_rate, timings=timings, edit=info)


def masked_timesteps(layout: PackedLayout, video_mask: torch.Tensor, audio_mask: torch.Tensor,
                     schedule: DualSchedule) -> Callable[[int], torch.Tensor]:
    """Step i -> each row's timestep [S]: t_r = min(1 - m * sigma_i, 0.999) on video / audio rows from their masks
    and clocks; text rides the video clock (t = 1 - sigma_i) as in t2va."""
    vi, ai = layout.video_indices, layout.audio_indices

    def at(i: int) -> torch.Tensor:
        sv, sa = schedule.video_sigmas[i], schedule.audio_sigmas[i]
        row_t = torch.full((layout.seq_len,), float(1.0 - sv), dtype=torch.float32)
        row_t[vi] = row_timesteps(video_mask, sv)
        row_t[ai] = row_timesteps(audio_mask, sa)
        return row_t

    return at
