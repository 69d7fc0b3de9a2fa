"""The one H3 denoise driver: t2va / fl2va / ref2va, edit and every extension window hand it a StepPlan
(step_plan.py) and their initial rows, and it runs the steps.

Once per plan: this rank's rows (`parallel.rows`: Ulysses' contiguous rows, None on one rank), the rotary tables of
those rows, and the attention backend's per-request plan (`attention.plan_for(layout)`; None for dense backends),
which every block receives; a plan with `bind(step_plan)` (VSA) returns the StepPlan to run (its rows reordered
once for the request) and the plan of each step. Per step i:
  1. Stop at the boundary: asked on any rank, every rank raises Cancelled here (before step i), or none does;
  2. the plan's row timesteps -> distinct t values [K] and each row's index into them -> this rank's AdaLN segments
     (with the AdaLN table cache, adaln_cache.py: every step's tables built before step 1, handed to the forward);
  3. one DiT forward on what the model sees of the state (the state itself, or lerp(anchor, state, weight)); with a
     step cache (step_cache.py) only its front blocks when the cache decides the rest may be reused;
  4. every row past the frozen condition / guide rows takes flow_step with the timestep it was given:
     x0 = x_in + (1 - t_r) v,  state <- r * state + (1 - r) * x0,  r = sigma_{i+1} / sigma_i  (float32);
  5. progress: on_step(i + 1, steps), or on_step(i + 1, steps, preview=uint8 [H, W, 3]) on the steps a StepPreview
     (preview.py; rank 0, when the request asks for previews) captures the clean estimate x0 of a few frames.
"""

from __future__ import annotations

from typing import Callable

import torch

from ...errors import Cancelled
from ...parallel.context import SINGLE, ParallelContext
from .adaln_cache import AdaLNCache, planned_steps
from .schedule import flow_step
from .step_plan import StepCallback, StepPlan, request_rope


def stop_at_boundary(should_stop: Callable[[], bool] | None, parallel: ParallelContext, step: int,
                     total: int) -> None:
    """Raise Cancelled before `step` when asked to stop; with several ranks all of them stop here, or none does."""
    if parallel.any(should_stop is not None and should_stop()):
        raise Cancelled(f"Stopped before step {step + 1}/{total}.")


@torch.no_grad()
def denoise(dit, plan: StepPlan, video: torch.Tensor, audio: torch.Tensor, parallel: ParallelContext = SINGLE,
            attention=None, on_step: StepCallback | None = None,
            should_stop: Callable[[], bool] | None = None,
            adaln: AdaLNCache | None = None, recorder=None, preview=None,
            step_cache=None) -> tuple[torch.Tensor, torch.Tensor]:
    """video rows [Nv, 96] / audio rows [Na, 32] float32 on the DiT's device, in the layout's row order (condition
    rows first) -> the denoised rows (updated in place). `attention`: the runtime's backend (its per-request plan).
    `adaln`: the DiT's AdaLN table cache (None: direct projection). `recorder`: the request's StageRecorder
    (manifest.py): a marker per step boundary, no sync in the loop; None: not timed. `preview`: a StepPreview
    (preview.py) or None (no preview work at all). `step_cache`: the request's StepCache (step_cache.py) or None
    (every forward in full)."""
    if preview is not None:  # the state's rows are in this layout's order, whatever order the attention runs in
        preview.begin(plan.layout, video.device)
    attention_plan = None if attention is None else attention.plan_for(plan.layout)
    step_attention = lambda i: attention_plan  # noqa: E731
    if hasattr(attention_plan, "bind"):  # e.g. VSA: rows in tile order for the whole request, a plan per step
        plan, step_attention = attention_plan.bind(plan, always=getattr(dit, "vsa_gates", False))
    layout = plan.layout
    if video.shape[0] != layout.video_indices.numel() or audio.shape[0] != layout.audio_indices.numel():
        raise RuntimeError(f"Rows do not match the layout: video {video.shape[0]} vs {layout.video_indices.numel()}, "
                           f"audio {audio.shape[0]} vs {layout.audio_indices.numel()}.")
    dev = video.device
    dl = layout.to(dev)
    shard = parallel.rows(layout.seq_len)
    rope = request_rope(dit, dl.position_ids, shard)
    ncv, nca = layout.num_condition_video_rows, layout.num_condition_audio_rows
    vi, ai = dl.video_indices[ncv:], dl.audio_indices[nca:]
    sched, n = plan.schedule, plan.steps
    with planned_steps(plan, adaln, parallel, should_stop) as steps:
        if recorder is not None:
            recorder.steps_begin()
        for i in range(n):
            stop_at_boundary(should_stop, parallel, i, n)
            ts, row_index, segments, modulation = steps.step(i, shard)
            ts, row_index = ts.to(dev), row_index.to(dev)
            x_v, x_a = (video, audio) if plan.anchors is None else plan.anchors.model_input(video, audio)
            cache = {}
            if step_cache is not None:
                step_cache.begin(i)
                cache = {"step_cache": step_cache}
            v_pred, a_pred = dit(x_v[None], x_a[None], plan.text, ts, row_index, dl.token_tags, dl.position_ids,
                                 dl.video_indices, dl.audio_indices, dl.text_indices, rope=rope, segments=segments,
                                 shard=shard, attention_plan=step_attention(i), modulation=modulation, **cache)
            t = ts[row_index]  # each row's timestep, as the model saw it
            shot = None
            if preview is not None and preview.due():  # before the update: x_v may be the state itself
                shot = preview.capture(x_v[ncv:], v_pred[0, ncv:], t[vi])
            video[ncv:] = flow_step(video[ncv:], x_v[ncv:], v_pred[0, ncv:], t[vi], sched.video_sigmas[i],
                                    sched.video_sigmas[i + 1])
            audio[nca:] = flow_step(audio[nca:], x_a[nca:], a_pred[0, nca:], t[ai], sched.audio_sigmas[i],
                                    sched.audio_sigmas[i + 1])
            if recorder is not None:
                recorder.step_done()
            if on_step is not None:
                if shot is None:
                    on_step(i + 1, n)
                else:
                    on_step(i + 1, n, preview=shot)
        if recorder is not None:
            recorder.steps_end()
    return video, audio
