"""Extension (task "extend"): the window plan and audio indices by hand, the window layouts' rotary positions
(guide = target's clock; window k continues window k-1 bit for bit), the streamed decoders against whole decodes,
and the invariants on the tiny model: frame / audio counts add up, the output is the decode of source + appended
latents, guide rows are untouched by sampling, overlaps are discarded, same seed -> same result, locked audio, Stop
keeps the finished windows, and memory does not grow with the number of windows."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend.pipelines.h3.extension_layout import build_window_layout, latent_first_frames
from comfyui_h3.backend.pipelines.h3.extension_plan import (Window, added_frames_for, audio_index, plan_windows)
from comfyui_h3.backend.pipelines.h3.geometry import AUDIO_TAG, VIDEO_TAG, RequestError, resolve_geometry
from comfyui_h3.backend.pipelines.h3.layout import build_layout
from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

from h3_requests import extension_request, extension_source

PATCH = (1, 2, 2)


# -- plan -----------------------------------------------------------------------------------------------------------
def test_audio_index_is_round_of_five_thirds_on_the_global_timeline():
    for frame in range(0, 5000):
        assert audio_index(frame) == int(np.floor(frame * 40 / 24 + 0.5))
    assert [audio_index(f) for f in (0, 1, 2, 3, 124, 345)] == [0, 2, 3, 5, 207, 575]


def test_plan_by_hand():
    windows = plan_windows(124, 119, 56, 22)
    # 56 - 22 = 34 new frames per window: 124 -> 158 -> 192 -> 226, then 17 left: the window stays 56 frames long
    # and its guide widens to 39 frames (on the 17n+5 grid).
    assert [(w.start_frame, w.num_frames, w.overlap_frames) for w in windows] == [
        (102, 56, 22), (136, 56, 22), (170, 56, 22), (187, 56, 39)]
    assert sum(w.new_frames for w in windows) == 119
    assert windows[-1].end_frame == 124 + 119
    w = windows[1]
    assert (w.latent_frames, w.guide_latent_frames) == (17, 7)
    assert (w.audio_start, w.audio_guide_end, w.audio_end) == (227, 263, 320)  # round(136*5/3), round(158*5/3), ...
    # the default reference settings: 277-frame windows, 22-frame overlap, one minute added
    plan = plan_windows(124, added_frames_for(60), 277, 22)
    assert [w.new_frames for w in plan[:-1]] == [255] * 5 and sum(w.new_frames for w in plan) == 1445
    assert all(w.num_frames == 277 for w in plan)
    # the last window never reaches back before the start of the content
    short = plan_windows(39, 17, 345, 22)
    assert [(w.start_frame, w.num_frames, w.overlap_frames) for w in short] == [(0, 56, 39)]


def test_added_frames_round_up_to_whole_chunks():
    assert added_frames_for(10) == 255  # 240 frames -> 15 chunks of 17
    assert added_frames_for(0.5) == 17
    with pytest.raises(RequestError, match="Seconds to add"):
        added_frames_for(0)


@pytest.mark.parametrize("args, message", [
    ((124, 17, 60, 22), "Window length"),
    ((124, 17, 56, 20), "Overlap must be"),
    ((124, 17, 39, 39), "at least 17 new frames"),
    ((130, 17, 56, 22), "17n\\+5"),
    ((5, 17, 56, 22), "shorter than the overlap"),
    ((124, 20, 56, 22), "multiple of 17"),
])
def test_plan_errors(args, message):
    with pytest.raises(RequestError, match=message):
        plan_windows(*args)


# -- layout ---------------------------------------------------------------------------------------------------------
def _tags(n):
    return torch.ones(n, dtype=torch.long)


def _media_times(layout, n_text):
    """(video latent times [frames], per-frame first row's time) and audio row times, text origin removed."""
    return layout.position_ids[:, 0] - n_text


def test_window_layout_rows_and_guide_clock():
    win = Window(1, 136, 56, 22)
    lay = build_window_layout(_tags(9), win, 4, 6, PATCH)
    per_frame = 2 * 3
    assert lay.num_condition_video_rows == 7 * per_frame
    assert lay.num_condition_audio_rows == 2 * win.guide_audio_latents
    assert lay.seq_len == 9 + 2 * 36 + 7 * per_frame + 2 * win.audio_latents + 17 * per_frame
    vi, ai = lay.video_indices, lay.audio_indices
    assert bool((lay.token_tags[vi] == VIDEO_TAG).all()) and bool((lay.token_tags[ai] == AUDIO_TAG).all())
    pos = lay.position_ids
    guide_v, target_v = vi[:7 * per_frame], vi[7 * per_frame:]
    assert torch.equal(pos[guide_v], pos[target_v[:7 * per_frame]])  # the guide shares the window's clock
    n_ga = win.guide_audio_latents
    guide_a, target_a = ai[:2 * n_ga], ai[2 * n_ga:]
    target_ch = target_a.reshape(2, -1)
    assert torch.equal(pos[guide_a].reshape(2, n_ga, 3), pos[target_ch[:, :n_ga]])
    # by hand: latent j of the window at 9 + 5 * (136 + first_frame(j)) / 3; audio at 9 + global index
    firsts = latent_first_frames(17)
    assert firsts[:7] == [0, 1, 5, 9, 13, 17, 18]
    times = pos[target_v[::per_frame], 0]
    assert torch.equal(times, torch.tensor([9 + 5 * (136 + f) / 3 for f in firsts], dtype=torch.float64))
    assert torch.equal(pos[target_ch[0], 0], 9.0 + torch.arange(227, 320, dtype=torch.float64))


def test_window_k_continues_window_k_minus_1_exactly():
    windows = plan_windows(124, 17 * 9, 90, 22)
    for prev, cur in zip(windows, windows[1:]):
        a = build_window_layout(_tags(11), prev, 4, 6, PATCH)
        b = build_window_layout(_tags(11), cur, 4, 6, PATCH)
        per_frame = 6
        # video: the global frames where cur's target starts are prev's last guide-sized stretch
        first_a = latent_first_frames(prev.latent_frames)
        first_b = latent_first_frames(cur.latent_frames)
        ta = a.position_ids[a.video_indices[a.num_condition_video_rows::per_frame], 0]
        tb = b.position_ids[b.video_indices[b.num_condition_video_rows::per_frame], 0]
        shared = [(i, j) for i, fa in enumerate(first_a) for j, fb in enumerate(first_b)
                  if prev.start_frame + fa == cur.start_frame + fb]
        assert len(shared) >= cur.guide_latent_frames - 1
        for i, j in shared:
            assert ta[i].item() == tb[j].item()  # bit for bit
        # audio: global index a has one time in both windows
        aa = a.position_ids[a.audio_indices[a.num_condition_audio_rows:], 0]
        ab = b.position_ids[b.audio_indices[b.num_condition_audio_rows:], 0]
        common = range(cur.audio_start, prev.audio_end)
        assert len(common) >= cur.guide_audio_latents
        for g in common:
            assert aa[g - prev.audio_start].item() == ab[g - cur.audio_start].item() == 11 + g


def test_window_at_start_zero_is_the_t2va_grid():
    geo = resolve_geometry(124, 64, 96)
    t2va = build_layout(_tags(10), geo, PATCH)
    win = Window(0, 0, 124, 22)
    ext = build_window_layout(_tags(10), win, 4, 6, PATCH)
    ncv, nca = ext.num_condition_video_rows, ext.num_condition_audio_rows
    torch.testing.assert_close(ext.position_ids[ext.video_indices[ncv:]], t2va.position_ids[t2va.video_indices],
                               rtol=0, atol=1e-12)
    assert torch.equal(ext.position_ids[ext.audio_indices[nca:]], t2va.position_ids[t2va.audio_indices])


def test_locked_audio_is_all_guide():
    win = Window(0, 102, 56, 22)
    lay = build_window_layout(_tags(5), win, 4, 6, PATCH, lock_audio=True)
    assert lay.num_condition_audio_rows == lay.audio_indices.numel() == 2 * win.audio_latents


# -- streamed decoders ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)


@pytest.mark.slow
def test_streamed_video_and_audio_decode_equal_whole_decodes(pipeline):
    from comfyui_h3.backend.pipelines.h3.decode import decode_audio, decode_video
    from comfyui_h3.backend.pipelines.h3.stream_decode import StreamingAudioDecoder, StreamingVideoDecoder

    c = pipeline.c
    gen = torch.Generator().manual_seed(3)
    for total, pieces in ((42, [12, 5, 25]), (27, [7, 10, 10]), (24, [1, 23])):  # on the grid, and a padded tail
        z = torch.randn(1, c.latent_channels, total, 4, 6, generator=gen)
        dec = StreamingVideoDecoder(c.vae, "cpu")
        chunks, cut = [], 0
        for n in pieces:
            chunks += dec.push(z[:, :, cut:cut + n])
            cut += n
        streamed_before_finish = sum(x.shape[0] for x in chunks)
        chunks += dec.finish()
        assert streamed_before_finish > 0
        assert torch.equal(torch.cat(chunks), decode_video(c.vae, z, "cpu"))
    a = torch.randn(2, c.audio_channels, 150, generator=gen)
    dec = StreamingAudioDecoder(c.audio_vae, "cpu")
    waves = [dec.push(a[:, :, s:e]) for s, e in ((0, 40), (40, 41), (41, 120), (120, 150))] + [dec.finish()]
    whole = decode_audio(c.audio_vae, a, "cpu")
    torch.testing.assert_close(torch.cat(waves, 1), whole, rtol=0, atol=2e-5)


# -- the loop on the tiny model -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extended(pipeline):
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    seen = []

    def observe(k, layout, v0, a0, v1, a1):
        ncv, nca = layout.num_condition_video_rows, layout.num_condition_audio_rows
        seen.append((k, torch.equal(v0[:ncv], v1[:ncv]), torch.equal(a0[:nca], a1[:nca]),
                     not torch.equal(v0[ncv:], v1[ncv:])))

    result = run_extend(pipeline, extension_request(), observe=observe)
    return result, seen


@pytest.mark.slow
def test_counts_add_up_and_output_is_the_decode_of_all_latents(pipeline, extended):
    from comfyui_h3.backend.pipelines.h3.decode import decode_audio, decode_video

    result, _ = extended
    info = result.extend
    assert info["given_frames"] == 130 and info["source_frames"] == 124  # cut down to 17n+5, never padded
    assert info["total_frames"] == 124 + 119 == result.frames.shape[0] == info["frames_written"]
    assert result.video_latents.shape[2] == (243 - 5) // 17 * 5 + 2
    assert result.audio_latents.shape[2] == audio_index(243)
    assert abs(result.audio.shape[1] / 32000 - 243 / 24) <= 1 / 40  # within one audio latent
    c = pipeline.c
    assert torch.equal(result.frames, decode_video(c.vae, result.video_latents, "cpu"))
    torch.testing.assert_close(result.audio, decode_audio(c.audio_vae, result.audio_latents, "cpu"), rtol=0,
                               atol=2e-5)
    # the source part is the source's own decode (but the VAE's last cross-fade into the continuation)
    src_latents = c.cond.encode_video(extension_source()[0][:124])
    assert torch.equal(result.video_latents[:, :, :src_latents.shape[2]], src_latents)
    src_frames = decode_video(c.vae, src_latents, "cpu")
    keep = 124 - c.vae.frame_overlap
    assert torch.equal(result.frames[:keep], src_frames[:keep])


def test_guide_rows_are_untouched_and_overlaps_discarded(pipeline, extended):
    result, seen = extended
    assert [s[0] for s in seen] == [0, 1, 2, 3]
    assert all(s[1] and s[2] and s[3] for s in seen)  # guides bit-identical, targets changed
    # appended latents: exactly the windows' new frames (the overlap of each was dropped)
    windows = [Window(i, *w) for i, w in enumerate(result.extend["windows"])]
    added = sum(w.latent_frames - w.guide_latent_frames for w in windows)
    assert result.video_latents.shape[2] == 37 + added


@pytest.mark.slow
def test_same_seed_same_result_other_seed_differs(pipeline, extended):
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    result, _ = extended
    again = run_extend(pipeline, extension_request())
    assert torch.equal(again.video_latents, result.video_latents) and torch.equal(again.frames, result.frames)
    assert torch.equal(again.audio, result.audio)
    other = run_extend(pipeline, extension_request(seed=6, added_frames=17))
    assert not torch.equal(other.video_latents[:, :, 37:], result.video_latents[:, :, 37:42])


@pytest.mark.slow
def test_extend_from_latents_and_per_window_prompts(pipeline, extended):
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    result, _ = extended
    # continue the result itself (its latents: nothing re-encoded), one prompt per window
    more = run_extend(pipeline, H3ExtendRequest(
        prompts=["one", "two"], added_frames=34 * 2, window_frames=56, overlap_frames=22, steps=1,
        source_video_latents=result.video_latents, source_audio_latents=result.audio_latents))
    n = result.video_latents.shape[2]
    assert torch.equal(more.video_latents[:, :, :n], result.video_latents)
    assert torch.equal(more.audio_latents[:, :, :result.audio_latents.shape[2]], result.audio_latents)
    assert more.extend["total_frames"] == 243 + 68 == more.frames.shape[0]
    with pytest.raises(RequestError, match="3 prompts for 2 windows"):
        run_extend(pipeline, extension_request(prompts=["a", "b", "c"], added_frames=68))


@pytest.mark.slow
def test_locked_soundtrack_is_the_driving_audio(pipeline):
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    drive = torch.sin(torch.arange(32000 * 11) / 32000 * 2 * np.pi * 220)[None].repeat(2, 1) * 0.3
    result = run_extend(pipeline, extension_request(audio_mode="lock", driving_audio=drive, driving_sample_rate=32000,
                                           added_frames=34))
    frames = result.frames.shape[0]
    assert frames == 124 + 34
    expect = drive[:, :int(np.ceil(frames * 32000 / 24))]
    assert torch.equal(result.audio, expect)
    with pytest.raises(RequestError, match="driving soundtrack is 1.00 s"):
        run_extend(pipeline, extension_request(audio_mode="lock", driving_audio=drive[:, :32000], driving_sample_rate=32000))


@pytest.mark.slow
def test_extend_runs_without_the_posix_resource_module(pipeline, monkeypatch):
    """Windows has no `resource` module: the extension task still imports and runs there (its peak-RSS timing is
    informational and left out)."""
    import importlib

    from comfyui_h3.backend.pipelines.h3.tasks import extend

    name = extend.__name__
    monkeypatch.setitem(sys.modules, "resource", None)  # `import resource` raises ImportError, as on Windows
    monkeypatch.delitem(sys.modules, name)
    fresh = importlib.import_module(name)
    assert fresh.resource is None
    result = fresh.run_extend(pipeline, extension_request(added_frames=17, steps=1))
    assert "peak_rss_mb" not in result.timings and result.frames.shape[0] == 124 + 17


@pytest.mark.slow
def test_stop_keeps_the_finished_windows_as_a_playable_file(pipeline, tmp_path):
    from comfyui_h3.backend.media.decode import probe_video
    from comfyui_h3.backend.media.encode import next_free_path
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend
    from comfyui_h3.backend.errors import Cancelled

    path = next_free_path(str(tmp_path), "ext", "mp4")
    steps = {"n": 0}

    def should_stop():  # 2 steps per window: stop after window 1 and one step of window 2
        return steps["n"] >= 5

    def on_step(done, total):
        steps["n"] = done

    with pytest.raises(Cancelled) as stopped:
        run_extend(pipeline, extension_request(output_path=path), on_step=on_step, should_stop=should_stop)
    extra = stopped.value.extra
    assert extra["windows_done"] == 2 and extra["windows"] == 4 and extra["path"] == path
    assert extra["frames"] == 124 + 34 * 2
    info = probe_video(path)
    assert (info.width, info.height, info.frame_count) == (96, 64, 124 + 68)
    # stopped before any window finished: no file
    path2 = next_free_path(str(tmp_path), "ext", "mp4")
    with pytest.raises(Cancelled) as stopped:
        run_extend(pipeline, extension_request(output_path=path2), should_stop=lambda: True)
    assert stopped.value.extra["windows_done"] == 0 and not os.path.exists(path2)


def test_a_failed_file_write_ends_the_extension_before_the_next_window(pipeline, tmp_path, monkeypatch):
    """The file's encoder failing (a full disk) is noticed before the next window is denoised, not after every window:
    the run ends with the encoder's error, the partial file is removed, and no more denoising happens."""
    from comfyui_h3.backend.media import frame_sinks
    from comfyui_h3.backend.media.encode import next_free_path
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    checks = {"n": 0}

    def failing_check(self):
        checks["n"] += 1
        if checks["n"] == 2:  # as StreamingVideoSaver.check raises once its thread has met ENOSPC
            raise RuntimeError("the video encoder failed: [Errno 28] No space left on device")

    monkeypatch.setattr(frame_sinks.FileSink, "check", failing_check)
    path = next_free_path(str(tmp_path), "ext", "mp4")
    steps = []
    with pytest.raises(RuntimeError, match="No space left"):
        run_extend(pipeline, extension_request(output_path=path), on_step=lambda done, total: steps.append(done))
    assert max(steps) == 2  # window 1's two steps ran, window 2's none
    assert not os.path.exists(path) and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.slow
def test_memory_of_six_windows_stays_near_one(tiny_h3_dir, tmp_path):
    """Each run in a fresh process writing its file (256x448, 124-frame windows: each window adds 102 frames, 35 MB
    as uint8). A leak that grows with windows shows as resident memory rising window after window, and as a higher
    peak for 6 windows than for 1.

    glibc's dynamic mmap threshold makes resident memory of a process that frees and reallocates tens-of-MB buffers
    depend on heap fragmentation and thread timing (the 6-window run's peak varied by ~150 MB under load). The probe
    pins the threshold at 1 MB so freed buffers go back to the system and resident memory is what is held."""
    script = os.path.join(REPO_DIR, "tests", "extension_memory_probe.py")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(2**20))
    runs = {}
    for windows in (1, 6):
        out = subprocess.run([sys.executable, script, str(tiny_h3_dir), str(tmp_path), str(windows)],
                             capture_output=True, text=True, timeout=600, cwd=REPO_DIR, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[windows] = json.loads(out.stdout.strip().splitlines()[-1])
    one, six = runs[1], runs[6]
    assert six["frames"] == 124 + 6 * 102 and one["frames"] == 124 + 102
    window_frames_mb = 102 * 256 * 448 * 3 / 2**20  # what holding one window's frames would add
    per_window = six["window_mb"]
    assert len(per_window) == 6, runs
    # From the second window on (the first allocates the guide rows once), holding each window's frames would climb
    # ~35 MB per window; streaming stays flat (measured ~1 MB per window).
    slope = (per_window[-1] - per_window[1]) / (len(per_window) - 2)
    assert slope <= 0.25 * window_frames_mb, runs
    # The peak: holding the 5 extra windows would add ~175 MB; measured ~30 MB above the 1-window run.
    assert six["peak_mb"] - one["peak_mb"] <= 0.5 * 5 * window_frames_mb, runs
