"""The SeedVR2 restoration pipeline on the package's tiny files (CPU, fp32): sizes and frame counts, seeds, batches
with progress and Stop between them, the streamed file, a single image, and memory refusals before any work."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from comfyui_h3.backend.errors import Cancelled, RequestError
from comfyui_h3.backend.pipelines.seedvr2 import memory
from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest


def _video(frames=9, h=24, w=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (frames, h, w, 3), generator=g, dtype=torch.uint8)


def test_upscale_sizes_frames_and_seed(pipe):
    video = _video(7, 24, 40)  # 7 frames -> padded to 9 for the model, cut back to 7
    a = pipe.run(UpscaleRequest(video, scale=2.0, seed=3))
    assert a.frames.shape == (7, 48, 80, 3) and a.frames.dtype == torch.uint8
    assert (a.width, a.height, a.batches) == (80, 48, 1)
    b = pipe.run(UpscaleRequest(video, scale=2.0, seed=3))
    assert torch.equal(a.frames, b.frames)  # same seed, same result
    c = pipe.run(UpscaleRequest(video, scale=2.0, seed=4))
    assert not torch.equal(a.frames, c.frames)


def test_targets_and_edges(pipe):
    video = _video(5, 30, 44)
    assert pipe.run(UpscaleRequest(video, scale=None, short_side=45)).frames.shape == (5, 45, 66, 3)
    assert pipe.run(UpscaleRequest(video, scale=None, width=50, height=34)).frames.shape == (5, 34, 50, 3)
    cropped = pipe.run(UpscaleRequest(video, scale=None, width=50, height=34, edge="crop")).frames
    assert cropped.shape == (5, 32, 48, 3)


def test_single_image(pipe):
    out = pipe.run(UpscaleRequest(_video(1, 20, 20), scale=2.0))
    assert out.frames.shape == (1, 40, 40, 3)


def test_batches_progress_and_colour_fix(pipe):
    video = _video(21, 16, 24)
    steps = []
    res = pipe.run(UpscaleRequest(video, scale=1.0, batch_frames=9, overlap=4, color_fix="adain"),
                   on_step=lambda d, t: steps.append((d, t)))
    assert res.batches == len(steps) and steps[-1] == (res.batches, res.batches) and res.batches >= 3
    assert res.frames.shape == (21, 16, 24, 3)


def test_stop_between_batches_keeps_the_final_frames(pipe, tmp_path):
    from comfyui_h3.backend.media.encode import next_free_path

    video = _video(21, 16, 24)
    path = next_free_path(str(tmp_path), "up", "mp4")
    rate = 32000
    sound = 0.1 * torch.sin(torch.arange(rate * 21 // 24) / 9.0).repeat(2, 1)  # the whole clip's sound (0.875 s)
    done = []

    with pytest.raises(Cancelled) as info:
        pipe.run(UpscaleRequest(video, scale=1.0, batch_frames=9, overlap=4, output_path=path, fps=Fraction(24),
                                audio=sound, sample_rate=rate),
                 on_step=lambda d, t: done.append(d), should_stop=lambda: len(done) >= 2)  # Stop after batch 2
    extra = info.value.extra
    assert extra["batches_done"] == 2 and 0 < extra["frames_done"] < 21
    import av

    with av.open(path) as f:
        assert sum(1 for _ in f.decode(video=0)) == extra["frames_done"]
    with av.open(path) as f:  # the sound that plays under the kept frames, not the whole input's (as Extend's)
        samples = sum(frame.samples for frame in f.decode(audio=0))
    kept = extra["frames_done"] * rate / 24
    assert abs(samples - kept) <= 2048, (samples, kept, sound.shape[1])  # AAC frames of 1024 samples, priming


def _counting(monkeypatch, obj, name, counter, label):
    """Count calls of obj.name under counter[label] (an instance attribute wrapping the bound method)."""
    inner = getattr(obj, name)

    def wrapped(*args, **kwargs):
        counter[label] = counter.get(label, 0) + 1
        return inner(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapped)


def test_stop_reaches_the_stages_of_a_single_batch(pipe, monkeypatch):
    """batch_frames 0 makes one batch of the whole clip: Stop is still asked inside it (between the VAE's time
    slices, the DiT's blocks and the stages), so it ends the run where it was asked, not after the whole batch (the
    worker's stop-timeout kill used to be the only way out)."""
    video = _video(21, 16, 24)  # 21 frames: 5 encode slices, 6 latents (5 decode slices), one batch
    layers = pipe.c.config.layers
    asked = []
    res = pipe.run(UpscaleRequest(video, scale=1.0), should_stop=lambda: asked.append(1) and False)
    assert res.batches == 1
    total = len(asked)
    assert total >= 1 + 4 + layers + 4, total  # before the batch, between slices and before every block

    counts: dict = {}
    _counting(monkeypatch, pipe.c.dit, "_block", counts, "dit blocks")
    _counting(monkeypatch, pipe.c.vae.encoder, "forward", counts, "encode slices")
    _counting(monkeypatch, pipe.c.vae.decoder, "forward", counts, "decode slices")
    seen = set()
    for n in range(1, total):  # Stop at every point it is asked (after the first): the run ends right there
        counts.clear()
        asked.clear()
        with pytest.raises(Cancelled, match="Stopped in batch 1/1") as info:
            pipe.run(UpscaleRequest(video, scale=1.0), should_stop=lambda: asked.append(1) or len(asked) > n)
        assert len(asked) == n + 1 and info.value.extra["frames_done"] == 0
        assert sum(counts.values()) <= n, (n, counts)  # slices and blocks run before the Stop took: one per ask
        seen.add(tuple(sorted(counts.items())))
    encode_slices = max(dict(c).get("encode slices", 0) for c in seen)
    assert encode_slices == 5
    for stage, whole in (("encode slices", 5), ("dit blocks", layers), ("decode slices", 5)):
        partway = {dict(c).get(stage, 0) for c in seen} & set(range(1, whole))
        assert partway == set(range(1, whole)), (stage, seen)  # stopped after each slice / block of each stage


@pytest.mark.parametrize("bad, match", [
    (dict(batch_frames=8), "4n\\+1"),
    (dict(overlap=9, batch_frames=9), "Overlap"),
    (dict(color_fix="sepia"), "Colour fix"),
    (dict(scale=0.0), "Scale"),
    (dict(scale=None, width=40), "width and height"),
])
def test_bad_requests(pipe, bad, match):
    with pytest.raises(RequestError, match=match):
        pipe.run(UpscaleRequest(_video(5, 16, 16), **{"scale": 2.0, **bad}))


def test_memory_refusal_names_what_fits():
    from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig

    config = DiTConfig.released("3b")
    args = (241, 1536, 2688, 768, 1344, 2, 2)  # a 10-s 1344x768 clip at x2, bf16

    def peak(frames):
        return memory.batch_memory(config, frames, *args[1:]).peak

    fits = 181  # a batch whose DiT stage is the largest (the budget then decides the batch)
    assert peak(fits + 4) > peak(fits)
    free = int(peak(fits) / memory.HEADROOM) + 1
    assert memory.largest_batch(config, *args, free) == fits
    with pytest.raises(RequestError, match=f"largest batch that fits is {fits} frames"):
        memory.check_fits(config, fits + 4, *args, free)
    assert memory.check_fits(config, 0, *args, free) == fits
    assert memory.check_fits(config, 17, *args, free) == 17
    with pytest.raises(RequestError, match="5 frames, the smallest batch .*largest output of this aspect that fits is"):
        memory.check_fits(config, 0, *args, 1024**3)
    with pytest.raises(RequestError, match="single frame"):  # an image: its one frame is the smallest batch
        memory.check_fits(config, 0, 1, *args[1:], 1024**3)


def _plan_with(pipe, monkeypatch, host_free, device_free=None):
    """The pipeline's plan with the host reporting `host_free` bytes (and a GPU with `device_free`, or the CPU)."""
    from comfyui_h3.backend.pipelines.seedvr2 import pipeline as module

    monkeypatch.setattr(module, "host_free_bytes", lambda: host_free, raising=False)
    monkeypatch.setattr(pipe, "_free_bytes", lambda: device_free)
    return pipe.plan


def test_a_cpu_engine_checks_the_request_against_host_memory_before_any_work(pipe, monkeypatch):
    """A CPU engine used to take any size (8192x8192 on 9 frames grew the worker past 10 GB): now the batch is
    checked against the host's free memory, before any frame is resized, naming the largest output that fits."""
    import re

    plan = _plan_with(pipe, monkeypatch, 8 * 1024**3)  # run() plans first: a refusal here comes before any work
    huge = UpscaleRequest(_video(9, 16, 16), scale=None, width=8192, height=8192)
    with pytest.raises(RequestError, match="in host memory .*largest output of this aspect that fits is") as err:
        plan(huge)
    assert "\n" not in str(err.value)
    w, h = map(int, re.search(r"fits is (\d+)x(\d+)", str(err.value)).groups())
    assert 16 <= w == h < 8192
    plan(UpscaleRequest(_video(9, 16, 16), scale=None, width=w, height=h))  # what it names is taken
    with pytest.raises(RequestError):
        plan(UpscaleRequest(_video(9, 16, 16), scale=None, width=w + 64, height=h + 64))


def test_the_automatic_batch_on_cpu_is_what_fits_the_host_not_the_whole_clip(pipe, monkeypatch):
    """Auto on a CPU engine was the whole clip whatever its length; now it is the largest batch the host's free
    memory holds (here: room for 9 frames of a 41-frame clip at 256x256, the frame sink included)."""
    args = (256, 256, 64, 64, 4, 4)  # model size, source size, fp32 DiT and VAE
    scale = memory.vae_scale(pipe.c.vae.config)
    sink = memory.sink_bytes_per_pixel(41, streamed=False) * 256 * 256
    room = memory.batch_memory(pipe.c.config, 9, *args, vae_scale=scale).peak + sink
    assert memory.batch_memory(pipe.c.config, 13, *args, vae_scale=scale).peak + sink > room
    plan = _plan_with(pipe, monkeypatch, int(room / memory.HEADROOM) + 1)
    _, batches, _ = plan(UpscaleRequest(_video(41, 64, 64), scale=4.0, overlap=4))
    assert batches.batch == 9 and batches.count > 1
    with pytest.raises(RequestError, match="in host memory .*largest batch that fits is 9 frames"):
        plan(UpscaleRequest(_video(41, 64, 64), scale=4.0, batch_frames=17, overlap=4))
    _, whole, _ = _plan_with(pipe, monkeypatch, 64 * 1024**3)(UpscaleRequest(_video(41, 64, 64), scale=4.0))
    assert whole.count == 1  # with room for it, still one batch


def test_a_gpu_engine_also_checks_the_host_memory_its_frame_sink_holds(pipe, monkeypatch, tmp_path):
    """Plenty of GPU memory does not make a host-side sink fit: the result held in memory (all frames, twice at the
    end) or the encoder's buffers of a streamed file are checked against the host, naming the largest output."""
    video = _video(41, 64, 64)
    plan = _plan_with(pipe, monkeypatch, 16 * 1024**2, device_free=80 * 1024**3)
    with pytest.raises(RequestError, match="256x256 needs ~15 MiB of host memory for the result held in memory.*"
                                           "largest output of this aspect that fits is (\\d+)x\\1"):
        plan(UpscaleRequest(video, scale=4.0))
    with pytest.raises(RequestError, match="host memory for the encoder's buffers"):
        plan(UpscaleRequest(video, scale=4.0, output_path=str(tmp_path / "x.mp4")))
    plan(UpscaleRequest(video, scale=1.0))  # 64x64: 41 frames twice are 1 MiB
    with pytest.raises(RequestError, match="8192x8192 needs ~22.0 GiB of host memory .* fits is 6624x6624\\."):
        memory.check_host(8192, 8192, memory.sink_bytes_per_pixel(9, streamed=True), 16 * 1024**3,
                          "the encoder's buffers")


def _min_rank(rank, world, port, out):
    from dist_ranks import join_group

    _, ctx = join_group(rank, world, port)
    out[rank] = ctx.min([7 << 30, 3 << 30][rank])  # each rank's free bytes differ
    from dist_ranks import leave_group

    leave_group()


@pytest.mark.slow
def test_every_rank_plans_from_the_least_free_memory():
    """SeedVR2 ranks choose the batch from the least free memory over all ranks (the same batch everywhere, or a
    refusal everywhere): ParallelContext.min on 2 gloo ranks."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").Manager().dict()
    mp.spawn(_min_rank, args=(2, port, out), nprocs=2, join=True)
    assert dict(out) == {0: 3 << 30, 1: 3 << 30}
