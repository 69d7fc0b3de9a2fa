"""The SeedVR2 restoration pipeline on the package's tiny files (CPU, fp32): sizes and frame counts, seeds, batches
with progress and Stop between them, the streamed file, a single image, and memory refusals before any work."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from comfyui_h3.backend.errors import Cancelled, RequestError
from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
from comfyui_h3.backend.pipelines.seedvr2 import memory
from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    root = make_tiny_seedvr2(tmp_path_factory.mktemp("tiny") / "m", "3b")
    config = seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE,
                            dtype="float32", vae_dtype="float32")
    config.validate()
    return config.build_pipeline(0)


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
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 2  # asked before each batch: stop before the third

    with pytest.raises(Cancelled) as info:
        pipe.run(UpscaleRequest(video, scale=1.0, batch_frames=9, overlap=4, output_path=path,
                                fps=Fraction(24)), should_stop=stop)
    extra = info.value.extra
    assert extra["batches_done"] == 2 and 0 < extra["frames_done"] < 21
    import av

    with av.open(path) as f:
        assert sum(1 for _ in f.decode(video=0)) == extra["frames_done"]


def test_streamed_file_has_every_frame(pipe, tmp_path):
    import av

    from comfyui_h3.backend.media.encode import next_free_path

    path = next_free_path(str(tmp_path), "up", "mp4")
    res = pipe.run(UpscaleRequest(_video(13, 16, 24), scale=2.0, batch_frames=9, overlap=4, output_path=path))
    assert res.frames is None and res.path == path
    with av.open(path) as f:
        frames = [fr for fr in f.decode(video=0)]
    assert len(frames) == 13 and (frames[0].width, frames[0].height) == (48, 32)


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
    with pytest.raises(RequestError, match="single frame"):
        memory.check_fits(config, 0, *args, 1024**3)


def _min_rank(rank, world, port, out):
    from dist_ranks import join_group

    _, ctx = join_group(rank, world, port)
    out[rank] = ctx.min([7 << 30, 3 << 30][rank])  # each rank's free bytes differ
    from dist_ranks import leave_group

    leave_group()


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
