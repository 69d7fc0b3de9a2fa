"""Ulysses sequence parallelism on CPU ranks (gloo): 2 and 4 ranks equal the single-rank path.

DiT forward on a fresh random config and inputs: rel err <= 1e-5. The whole engine (N worker processes, one
process group) on the tiny model: final latents <= 1e-4, decoded frames within the VAE's float error; Stop at a
step boundary on every rank; a killed rank becomes an error and the next prompt restarts the group."""

import os
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp

from comfyui_h3.backend.engine import Engine, EngineCancelled, EngineError
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.executor.mp_executor import _free_port
from comfyui_h3.backend.parallel.context import ParallelContext
from comfyui_h3.backend.parallel.ulysses import SequenceShard, alltoall_bytes_per_layer
from comfyui_h3.backend.pipelines.h3.request import H3Request

from tiny_dit import dit_inputs, tiny_dit


def _rank(rank, world, port, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    args = dit_inputs()
    shard = SequenceShard(rank, world, args[6].shape[0])
    with torch.no_grad():
        video, audio = tiny_dit()(*args, shard=shard)
    torch.save((video, audio), os.path.join(out_dir, f"rank{rank}.pt"))
    from dist_ranks import leave_group

    leave_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_forward_equals_single_rank(tmp_path, world):
    with torch.no_grad():
        want_v, want_a = tiny_dit()(*dit_inputs())
    seq = dit_inputs()[6].shape[0]
    assert seq % world != 0 or world == 2  # the 4-rank case exercises padding
    mp.spawn(_rank, args=(world, _free_port(), str(tmp_path)), nprocs=world)
    for rank in range(world):  # every rank ends with the full outputs
        got_v, got_a = torch.load(tmp_path / f"rank{rank}.pt")
        assert ((got_v - want_v).norm() / want_v.norm()).item() <= 1e-5
        assert ((got_a - want_a).norm() / want_a.norm()).item() <= 1e-5


def test_degree_must_divide_heads(tiny_h3_dir):
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        h3_config(str(tiny_h3_dir), world_size=3).validate()


def test_alltoall_plan_bytes():
    # 10 s at 1344x768 (73,888 rows), bf16, degree 8: q, k, v and the output, 7/8 of each local tensor leaves.
    assert alltoall_bytes_per_layer(73888, 8) == int(4 * 9236 * 56 * 128 * 2 * 7 / 8)
    assert alltoall_bytes_per_layer(73888, 1) == 0


def small(**kw):
    base = dict(prompt="thunder over hills", num_frames=124, steps=3, seed=9, width=64, height=64)
    base.update(kw)
    return H3Request(**base)


@pytest.fixture(scope="module")
def single(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0).run(small())


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_engine_on_n_ranks_equals_one(tiny_h3_dir, single, world):
    from PIL import Image

    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=world, cpu_threads=1))
    try:
        got = eng.generate(small())
        key = Image.new("RGB", (96, 64), (200, 80, 10))
        keyed = eng.generate(small(first_frame=key, width=None, height=None, decode=False))
    finally:
        eng.shutdown()
    for key_name in ("video_latents", "audio_latents"):
        a, b = getattr(got, key_name), getattr(single, key_name)
        assert ((a - b).norm() / b.norm()).item() <= 1e-4
    assert torch.equal(got.frames, single.frames)  # clip-shared VAE decode is exact
    # fl2va: the keyframe's text/vision presentation is encoded on rank 0 only and broadcast
    want = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0).run(
        small(first_frame=key, width=None, height=None, decode=False))
    assert ((keyed.video_latents - want.video_latents).norm() / want.video_latents.norm()).item() <= 1e-4


@pytest.mark.slow
def test_a_request_error_only_rank_0_sees_leaves_both_ranks_in_step(tiny_h3_dir, single):
    """Rank 0 alone encodes the prompt and references; when it refuses one (a reference video shorter than the
    processor takes) every rank fails the job with rank 0's message, the group is kept, and the next job pairs its
    collectives correctly (equal to one rank)."""
    import numpy as np

    from comfyui_h3.backend.errors import RequestError
    from comfyui_h3.backend.pipelines.h3.request import ReferenceInput

    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1))
    try:
        eng.start()
        pids = [p.pid for p in eng._executor._procs]
        short = ReferenceInput("video", frames=np.zeros((12, 64, 64, 3), np.uint8), fps=24.0)
        for _ in range(2):  # twice: a stale message or broadcast from the first would derail the second
            with pytest.raises(RequestError, match="at least 13 frames .* got 12"):
                eng.generate(small(references=[short]))
        got = eng.generate(small())
        assert [p.pid for p in eng._executor._procs] == pids
        assert ((got.video_latents - single.video_latents).norm() / single.video_latents.norm()).item() <= 1e-4
    finally:
        eng.shutdown()


@pytest.mark.slow
def test_stop_and_dead_rank_on_two_ranks(tiny_h3_dir):
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1))
    try:
        seen = []
        with pytest.raises(EngineCancelled):
            eng.generate(small(steps=20), progress=lambda d, t: seen.append(d), should_cancel=lambda: bool(seen))
        assert 1 <= len(seen) < 20
        assert eng.generate(small(steps=1, decode=False)).video_latents is not None  # both ranks still in step
        victim = eng._executor._procs[1].pid
        killed = []

        def kill_rank1(done, total):
            if not killed:
                killed.append(time.monotonic())
                os.kill(victim, signal.SIGKILL)

        with pytest.raises(EngineError, match="died"):
            eng.generate(small(steps=40), progress=kill_rank1)
        assert time.monotonic() - killed[0] < 10  # the node errors within seconds, not after a collective timeout
        assert eng.generate(small(steps=1, decode=False)).video_latents is not None  # the group restarted
    finally:
        eng.shutdown()


def _decode_rank(rank, world, port, folder, latents_path, out_dir, stop_rank=-1):
    import torch.distributed as dist
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.errors import Cancelled
    from comfyui_h3.backend.pipelines.h3.decode import iter_decode_video

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    vae = AutoencoderKLMiniMaxH3.from_pretrained(os.path.join(folder, "vae")).eval()
    try:
        chunks = list(iter_decode_video(vae, torch.load(latents_path), "cpu", ParallelContext(rank, world),
                                        should_stop=lambda: rank == stop_rank))
        result = torch.cat(chunks) if chunks else None
    except Cancelled:
        result = "cancelled"
    torch.save(result, os.path.join(out_dir, f"frames{rank}.pt"))
    from dist_ranks import leave_group

    leave_group()


@pytest.mark.slow
def test_stop_asked_of_one_rank_during_the_shared_decode_stops_every_rank(tmp_path, tiny_h3_dir):
    """Stop between VAE clips (a long decode is not a denoise step): the ranks agree before any clip is exchanged,
    so every rank stops and none is left in a broadcast."""
    latents = torch.randn(1, 24, 37, 4, 4, generator=torch.Generator().manual_seed(1))
    torch.save(latents, tmp_path / "lat.pt")
    mp.spawn(_decode_rank, args=(2, _free_port(), str(tiny_h3_dir), str(tmp_path / "lat.pt"), str(tmp_path), 1),
             nprocs=2)
    assert [torch.load(tmp_path / f"frames{r}.pt") for r in range(2)] == ["cancelled", "cancelled"]


def test_stop_during_the_decode_of_one_rank(tiny_h3_dir):
    from comfyui_h3.backend.errors import Cancelled

    asked = []

    def stop_after_the_denoise():  # the one denoise step asks once; the decode asks between clips
        asked.append(1)
        return len(asked) > 1

    pipe = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)
    with pytest.raises(Cancelled, match="during the video decode"):
        pipe.run(small(steps=1), should_stop=stop_after_the_denoise)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_vae_decode_shared_across_ranks_is_bitwise_equal(tmp_path, tiny_h3_dir, world):
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.decode import decode_video

    latents = torch.randn(1, 24, 37, 4, 4, generator=torch.Generator().manual_seed(1))
    torch.save(latents, tmp_path / "lat.pt")
    vae = AutoencoderKLMiniMaxH3.from_pretrained(str(tiny_h3_dir / "vae")).eval()
    with torch.no_grad():
        want = decode_video(vae, latents, "cpu")
    mp.spawn(_decode_rank, args=(world, _free_port(), str(tiny_h3_dir), str(tmp_path / "lat.pt"), str(tmp_path)),
             nprocs=world)
    assert torch.equal(torch.load(tmp_path / "frames0.pt"), want)  # rank 0 assembles; the others only decode
    assert all(torch.load(tmp_path / f"frames{r}.pt") is None for r in range(1, world))


@pytest.mark.slow
def test_edit_and_extend_on_two_ranks_equal_one(tiny_h3_dir, tmp_path):
    """Editing (per-row timesteps) and extension (guide rows, shifted clocks, streamed file on rank 0) on 2 gloo
    ranks against the 1-rank pipeline."""
    import numpy as np

    from comfyui_h3.backend.media.decode import probe_video
    from comfyui_h3.backend.media.encode import next_free_path
    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    mask = np.zeros((64, 96), np.float32)
    mask[16:48, 32:64] = 1.0
    wave = torch.from_numpy(rng.standard_normal((2, 32000 * 5)).astype(np.float32) * 0.1)

    def edit():
        return H3Request(prompt="a boat", steps=2, seed=3, source_frames=frames, mask=mask, preset="replace",
                         source_audio=wave, source_sample_rate=32000, decode=False)

    def extend(path=None):
        return H3ExtendRequest(prompts=["waves"], added_frames=51, window_frames=56, overlap_frames=22, steps=2,
                               seed=1, source_frames=frames, source_audio=wave, source_sample_rate=32000,
                               output_path=path)

    one = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)
    want_edit, want_ext = one.run(edit()), one.run(extend())
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1))
    try:
        got_edit = eng.generate(edit())
        path = next_free_path(str(tmp_path), "ext2", "mp4")
        got_ext = eng.generate(extend(path))
    finally:
        eng.shutdown()
    for got, want in ((got_edit, want_edit), (got_ext, want_ext)):
        for key in ("video_latents", "audio_latents"):
            a, b = getattr(got, key), getattr(want, key)
            assert a.shape == b.shape and ((a - b).norm() / b.norm()).item() <= 1e-4, key
    assert got_ext.extend["frames_written"] == 124 + 51 == probe_video(path).frame_count


@pytest.mark.slow
def test_stop_on_two_ranks_keeps_the_windows_rank_0_published(tiny_h3_dir, tmp_path):
    """Every rank stops at the same step; rank 1 reports at once while rank 0 still publishes the finished windows:
    the engine waits for rank 0's report, which names the partial file."""
    from h3_requests import extension_request as _request

    from comfyui_h3.backend.media.decode import probe_video
    from comfyui_h3.backend.media.encode import next_free_path

    path = next_free_path(str(tmp_path), "ext", "mp4")
    seen = []
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1))
    try:
        with pytest.raises(EngineCancelled) as stopped:  # 4 windows of 2 steps; Stop in the second window
            eng.generate(_request(output_path=path), progress=lambda d, t: seen.append(d),
                         should_cancel=lambda: len(seen) >= 3)
    finally:
        eng.shutdown()
    extra = stopped.value.extra
    assert 1 <= extra.get("windows_done", 0) < 4 and os.path.isfile(extra["path"]), extra
    assert probe_video(extra["path"]).frame_count == extra["frames"]
