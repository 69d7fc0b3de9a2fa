"""A storyboard (backend/pipelines/h3/storyboard.py) made into one film on an engine: each shot one request (a cut a
t2va / ref2va generation, a continue an extension of the scene's latents), its frames and sound streamed into the
film's MP4 as soon as the shot is done. A Stop keeps the finished shots: the film of them is published under a
clearly named `<name>_partial_NNNNN.mp4`; nothing half-made is left under the film's own name."""

from __future__ import annotations

import os
from typing import Callable

import torch

from .backend.pipelines.h3.storyboard import Storyboard, samples_for, shot_sound


def shot_request(board: Storyboard, shot, scene, references):
    """The request that makes `shot`: `scene` (video, audio latents of the scene so far) for a continue."""
    from .backend.pipelines.h3.request import H3ExtendRequest, H3Request

    if shot.transition == "cut":
        return H3Request(prompt=shot.prompt, num_frames=shot.frames, width=board.width, height=board.height,
                         steps=board.steps, seed=shot.seed, references=list(references), step_cache=board.step_cache)
    return H3ExtendRequest(prompts=[shot.prompt], added_frames=shot.frames, source_video_latents=scene[0],
                           source_audio_latents=scene[1], steps=board.steps, seed=shot.seed,
                           step_cache=board.step_cache)


def _fitted(audio: torch.Tensor, samples: int) -> torch.Tensor:
    """The shot's sound at exactly `samples` (its frames' worth): cut, or held on its last sample."""
    if audio.shape[-1] >= samples:
        return audio[:, :samples]
    return torch.cat([audio, audio[:, -1:].expand(-1, samples - audio.shape[-1])], dim=-1)


def _mp4_writer(path, width, height, sample_rate, channels):
    from .backend.media.encode import Mp4Writer

    return Mp4Writer(path, width, height, 24, audio_sample_rate=sample_rate, audio_channels=channels, reserved=True,
                     metadata={"comment": "comfyui-h3 storyboard"})


def make_film(board: Storyboard, run: Callable, out_path: str, references=(), should_stop=lambda: False,
              on_shot=None, open_writer=_mp4_writer) -> dict:
    """Make the film into `out_path` (a placeholder reserved with media.encode.reserve_path). `run(request)` -> an
    H3Result with decoded frames, or None when stopped. `on_shot(shot, done)` after each shot. `open_writer(path, w,
    h, sample_rate, channels)`: the film's writer (write_frames / write_audio / close / abort; an Mp4Writer).
    Returns the report: shots (index, transition, frames, seed), frames, seconds, stopped, path (the partial's
    when stopped)."""
    from .extend_job import keep_partial, partial_prefix_for

    writer, scene, done, scene_frames = None, None, [], 0
    stopped = False
    try:
        for shot in board.shots:
            if should_stop():
                stopped = True
                break
            result = run(shot_request(board, shot, scene, references))
            if result is None:
                stopped = True
                break
            rate = result.sample_rate
            if shot.transition == "cut":
                scene_frames = 0
            frames = result.frames[-shot.frames:]
            audio = _fitted(result.audio[:, samples_for(scene_frames, rate):], samples_for(shot.frames, rate))
            if writer is None:
                writer = open_writer(out_path, int(frames.shape[2]), int(frames.shape[1]), rate, int(audio.shape[0]))
            following = board.shots[shot.index + 1] if shot.index + 1 < len(board.shots) else None
            writer.write_frames(frames)
            writer.write_audio(shot_sound(audio, rate, fade_in=shot.index > 0 and shot.transition == "cut",
                                          fade_out=following is not None and following.transition == "cut"))
            scene = (result.video_latents, result.audio_latents)
            scene_frames += shot.frames
            done.append({"index": shot.index, "transition": shot.transition, "frames": shot.frames,
                         "start_frame": sum(d["frames"] for d in done), "seed": shot.seed, "prompt": shot.prompt})
            if on_shot is not None:
                on_shot(shot, len(done))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    path = out_path
    if writer is None:  # stopped before the first shot: nothing to keep
        from .backend.media.encode import release_placeholder

        release_placeholder(out_path)
        path = None
    else:
        writer.close()
        if stopped:
            path = keep_partial(out_path, *partial_prefix_for(out_path))
    frames = sum(s["frames"] for s in done)
    return {"shots": done, "frames": frames, "seconds": frames / 24.0, "stopped": stopped, "path": path,
            "planned_shots": len(board.shots), "planned_frames": board.total_frames}


def storyboard_file(path: str) -> Storyboard:
    from .backend.pipelines.h3.storyboard import parse_storyboard

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Shot list not found: {path}")
    with open(path, encoding="utf-8") as handle:
        return parse_storyboard(handle.read())
