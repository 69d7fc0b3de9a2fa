"""The "extend" task: continue a source video window by window on one timeline (plan: extension_plan.py; rows and
rotary positions: extension_layout.py; source: extension_source.py; streamed output: extension_output.py).

Per window k (all ranks run the same loop; rank 0 alone decodes and writes):
  guide   = the last latent_frames(overlap) video latents of the content so far, mixed once to t = 0.999 with noise
            (like every visual condition), and the audio latents [audio_start, audio_guide_end) clean (t = 1); with a
            locked soundtrack the whole window's audio is guide (the driving latents) and none is generated;
  target  = seeded noise for the whole window (video, and audio unless locked), denoised by the one driver
            (denoise.py) on the clocks like t2va; it never writes condition rows: the guide is bit-identical after;
  append  = target latents from the overlap on (video: latent frames [G, L); audio: [guide, end)), the overlap
            itself discarded.
Noise: one CPU generator seeded with the request seed, drawn per window in order: guide mix noise (video latents
shape), target video [1, 24, L, h, w], target audio rows [2*Ta, 32]. Same seed and settings -> same result.
Transformer: the ref2va partition (transformer_ref/: guide rows are a reference block) when the folder has it, else
transformer/.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ....errors import Cancelled
from ....media.frame_sinks import FileSink, MemorySink
from ..extension_layout import build_window_layout
from ..extension_output import ExtensionOutput
from ..extension_plan import plan_windows
from ..extension_source import driving_soundtrack, prepare_extension_source
from ..geometry import FPS, RequestError, latent_frames
from ..layout import audio_latents_to_rows, audio_rows_to_latents, held_at_condition, patchify, unpatchify
from ..request import H3Result
from ..schedule import DualSchedule
from ..step_plan import StepCallback, StepPlan

try:  # POSIX only (not on Windows); the peak-RSS timing it gives is informational
    import resource
except ImportError:
    resource = None

Observer = Callable[[int, object, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def window_prompts(prompts: list[str], num_windows: int) -> list[str]:
    if len(prompts) == 1:
        return prompts * num_windows
    if len(prompts) != num_windows:
        raise RequestError(f"{len(prompts)} prompts for {num_windows} windows: give one prompt for all windows, or "
                           f"exactly one per window.")
    return list(prompts)


@torch.no_grad()
def run_extend(pipe, req, on_step: StepCallback | None = None,
               should_stop: Callable[[], bool] | None = None, observe: Observer | None = None) -> H3Result:
    """pipe: the rank's H3Pipeline (components, parallel context, text sharing, the denoise driver).
    `observe(k, layout, video_rows_before, audio_rows_before, video_rows_after, audio_rows_after)` sees every
    window's packed rows (tests). Raises errors.Cancelled at a step boundary on Stop; windows finished by then
    are published (file output) and named in the exception's `extra`."""
    req = pipe.c.with_folder_shifts(req)  # unset shifts: the model folder's
    req.validate()
    c, timings, t0 = pipe.c, {}, time.perf_counter()
    task = "extend" if c.has_partition("extend") else "t2va"
    if not c.has_partition(task):
        raise RequestError("This model folder has neither transformer_ref/ nor transformer/: nothing can extend.")
    dit, patch, dev = c.transformer_for(task), c.patch_size, c.device
    src = prepare_extension_source(c, req, req.overlap_frames)
    windows = plan_windows(src.num_frames, req.added_frames, req.window_frames, req.overlap_frames)
    prompts = window_prompts(req.prompts, len(windows))
    total_frames = src.num_frames + req.added_frames
    lock = req.audio_mode == "lock"
    drive_latents = drive_wave = None
    if lock:
        drive_latents, drive_wave = driving_soundtrack(c, req, total_frames)
    texts = {}
    for prompt in prompts:  # every rank encodes (or receives) them in the same order
        if prompt not in texts:
            texts[prompt] = pipe.encode_text(lambda p=prompt: c.text.encode_prompt(p, None))
    timings["encode_s"] = time.perf_counter() - t0

    output = None
    if pipe.parallel.is_driver:  # rank 0 alone decodes and writes
        if req.output_path:
            sink = FileSink(req.output_path, src.width, src.height, FPS, dev, c.audio_rate, req.crf, req.preset,
                            req.metadata)
        else:
            sink = MemorySink()
        output = ExtensionOutput(c, dev, sink, drive_wave)
    schedule = DualSchedule.make(req.steps + 1, req.video_shift, req.audio_shift)
    steps = schedule.num_evaluations
    total_steps = steps * len(windows)
    gen = torch.Generator("cpu").manual_seed(req.seed)
    video_parts, audio_parts = [src.video_latents], [src.audio_latents if not lock else
                                                     drive_latents[:, :, :src.audio_latents.shape[2]]]
    tail = src.video_latents  # the latest latents; a guide is at most a window's worth
    longest_guide = latent_frames(req.window_frames)
    audio_so_far = audio_parts[0]
    lh, lw = src.video_latents.shape[3], src.video_latents.shape[4]
    done = 0
    t1 = time.perf_counter()
    try:
        if output is not None:
            output.append(src.video_latents, audio_parts[0])
        for k, win in enumerate(windows):
            if output is not None:  # a failed write (a full disk) ends the run before another window's denoise
                output.check()
            text, tags = texts[prompts[k]]
            layout = build_window_layout(tags, win, lh, lw, patch, lock)
            g = win.guide_latent_frames
            guide = tail[:, :, -g:]
            mix = torch.randn(guide.shape, generator=gen, dtype=torch.float32)
            guide_rows = patchify(held_at_condition(guide, mix), patch)
            video_noise = torch.randn((1, c.latent_channels, win.latent_frames, lh, lw), generator=gen,
                                      dtype=torch.float32)
            if lock:
                guide_audio = drive_latents[:, :, win.audio_start:win.audio_end]
                audio_noise = torch.zeros(0, c.audio_channels)
            else:
                guide_audio = audio_so_far[:, :, win.audio_start:win.audio_guide_end]
                audio_noise = torch.randn((win.audio_latents * 2, c.audio_channels), generator=gen,
                                          dtype=torch.float32)
            video = torch.cat([guide_rows, patchify(video_noise, patch)]).to(dev)
            audio = torch.cat([audio_latents_to_rows(guide_audio), audio_noise]).to(dev)
            before = (video.clone(), audio.clone()) if observe is not None else None

            def step(i, _n, base=k * steps, **extra):  # extra: the step's preview, when there is one
                if on_step is not None:
                    on_step(base + i, total_steps, **extra)

            plan = StepPlan.on_clocks(layout, text.to(dev), schedule)  # guide rows: the layout's condition rows
            video, audio = pipe.denoise(dit, plan, video, audio, step, should_stop)
            if observe is not None:
                observe(k, layout, *before, video, audio)
            ncv, nca = layout.num_condition_video_rows, layout.num_condition_audio_rows
            target = unpatchify(video[ncv:].float().cpu(), c.latent_channels, win.latent_frames, lh, lw, patch)
            new_video = target[:, :, g:].contiguous()
            if lock:
                new_audio = drive_latents[:, :, win.audio_guide_end:win.audio_end]
            else:
                window_audio = audio_rows_to_latents(audio[nca:].float().cpu(), win.audio_latents)
                new_audio = window_audio[:, :, win.guide_audio_latents:].contiguous()
            video_parts.append(new_video)
            audio_parts.append(new_audio)
            tail = torch.cat([tail, new_video], dim=2)[:, :, -longest_guide:]
            audio_so_far = torch.cat([audio_so_far, new_audio], dim=2)
            if output is not None:
                output.append(new_video, new_audio)
            done += 1
    except Cancelled as exc:
        exc.extra = _finish_partial(output, done, len(windows), src, windows, req)
        raise
    except BaseException:
        if output is not None:
            output.abort()
        raise
    timings["denoise_s"] = time.perf_counter() - t1
    frames_written = output.finish() if output is not None else 0
    timings["total_s"] = time.perf_counter() - t0
    if resource is not None:
        timings["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if torch.cuda.is_available() and dev.type == "cuda":
        timings["peak_device_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    frames = audio = None
    if output is not None and isinstance(output.sink, MemorySink):
        frames, audio = output.sink.result()
    info = {"windows": [(w.start_frame, w.num_frames, w.overlap_frames) for w in windows],
            "source_frames": src.num_frames, "given_frames": src.given_frames, "added_frames": req.added_frames,
            "total_frames": total_frames, "frames_written": frames_written, "width": src.width,
            "height": src.height, "path": req.output_path, "transformer": task}
    return H3Result("extend", torch.cat(video_parts, dim=2), torch.cat(audio_parts, dim=2), frames, audio,
                    c.audio_rate, timings=timings, extend=info)


def _finish_partial(output, done: int, planned: int, src, windows, req) -> dict:
    """On Stop: publish what the finished windows made (nothing when none finished)."""
    if output is None:
        return {}
    if done == 0:
        output.abort()
        return {"windows_done": 0, "windows": planned}
    frames = output.finish()
    return {"windows_done": done, "windows": planned, "frames": frames, "path": req.output_path,
            "seconds": frames / 24.0}
