"""The SeedVR2 VAE over ranks (backend/parallel/seedvr2_vae_shard.py) and the restoration batch that uses it.

Plans: the one-rank time slices dealt round-robin, encode frame spans = decode output spans. On 2 and 4 gloo CPU ranks
(one spawn per world): encode and decode equal SeedVR2VAE's one-rank passes bit for bit (fp32 and bf16, several slice
sizes, clips whose last round leaves ranks idle, one-latent slices whose carried frames chain through the ranks), and
restore_batch on the ranks equals one rank bit for bit when the DiT runs whole on every rank (the VAE, posterior
sample, colour fix and quantisation are then the only spread work). An engine with world_size 2 (mp executor, gloo,
window SP for the DiT) gives the one-rank frames up to a rounding step. NCCL twin where there are 2 GPUs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from repo_paths import REPO
from comfyui_h3.backend.executor.mp_executor import _free_port
from comfyui_h3.backend.models.seedvr2.vae import SeedVR2VAE, VAEConfig, time_slices
from comfyui_h3.backend.parallel import seedvr2_vae_shard as vae_shard
from comfyui_h3.backend.parallel.context import SINGLE, ParallelContext

H, W = 24, 40  # frames: latents 3 x 5
# (frames, slice_frames): 4 slices; 5 slices (a last round with idle ranks on 2 and 4 ranks); 2 big slices
ENCODES = [(17, 4), (21, 4), (17, 8)]
# (latents, slice_latents, dtype): one latent per slice (chains at the latent-resolution convs), 2 per slice
DECODES = [(5, 1, torch.float32), (6, 1, torch.float32), (7, 2, torch.float32), (5, 1, torch.bfloat16)]
RESTORES = [(7, "wavelet"), (21, "adain")]  # frames (7 -> 9 padded: the last slice half padding), colour fix


def _vae(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    vae = SeedVR2VAE(VAEConfig.tiny()).eval()
    with torch.no_grad():  # GroupNorm affine away from (1, 0): every normalised piece matters
        for name, p in vae.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape))
    return vae.to(device=device, dtype=dtype)


def _video(frames, seed=1):
    return torch.rand(1, 3, frames, H, W, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _latents(t, seed=2):
    return torch.randn(1, 16, t, H // 8, W // 8, generator=torch.Generator().manual_seed(seed))


# -- plans --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_plans_deal_the_one_rank_slices_round_robin(world):
    enc = vae_shard.encode_plan(21, world)
    assert enc.spans == tuple(time_slices(21, 4)) == ((0, 5), (5, 9), (9, 13), (13, 17), (17, 21))
    assert enc.out_spans == ((0, 2), (2, 3), (3, 4), (4, 5), (5, 6))
    dec = vae_shard.decode_plan(6, world)
    assert dec.spans == tuple(time_slices(6, 1)) and dec.out_spans == enc.spans  # a rank decodes what it encoded
    assert vae_shard.decode_plan(7, world, 2).out_spans == ((0, 9), (9, 17), (17, 25))
    assert vae_shard.encode_plan(5, world, None).spans == ((0, 5),)
    held = sorted(j for r in range(world) for j in enc.slices_of(r))
    assert held == list(range(enc.count)) and all(enc.owner(j) == j % world for j in held)
    assert enc.rounds == -(-5 // world)
    assert [list(enc.round_slices(k)) for k in range(enc.rounds)] == [
        list(range(k * world, min(5, (k + 1) * world))) for k in range(enc.rounds)]


def test_plans_refuse_what_one_rank_refuses():
    with pytest.raises(ValueError, match="4n\\+1 frames"):
        vae_shard.encode_plan(8, 2)
    with pytest.raises(ValueError, match="multiple of 4"):
        vae_shard.encode_plan(9, 2, 6)
    with pytest.raises(ValueError, match="at least one latent"):
        vae_shard.decode_plan(0, 2)
    with pytest.raises(ValueError, match="at least one rank"):
        vae_shard.decode_plan(3, 0)


def test_one_rank_passes_equal_the_vae():
    vae = _vae()
    x, z = _video(13), _latents(4)
    mean, logvar = vae_shard.encode(vae, SINGLE, x)
    want = vae.encode(x)
    assert torch.equal(mean, want[0]) and torch.equal(logvar, want[1])
    assert torch.equal(vae_shard.decode(vae, SINGLE, z), vae.decode(z))


def test_gather_and_stream_checks():
    plan = vae_shard.decode_plan(3, 1)
    empty = torch.empty(0, 2)
    with pytest.raises(ValueError, match="slice 0: piece"):
        vae_shard.gather_pieces(SINGLE, plan, [5, 4], {0: torch.zeros(4, 2), 1: torch.zeros(4, 2)}, empty)
    with pytest.raises(ValueError, match="2 counts for 2 slices|counts for"):
        vae_shard.gather_pieces(SINGLE, plan, [5], {}, empty)
    got = vae_shard.gather_pieces(SINGLE, plan, [5, 4], {0: torch.ones(5, 2), 1: torch.zeros(4, 2)}, empty)
    assert torch.equal(got, torch.cat([torch.ones(5, 2), torch.zeros(4, 2)]))
    stream = vae_shard.RankStream(ParallelContext(1, 2), vae_shard.decode_plan(4, 2))
    with pytest.raises(ValueError, match="cannot run slice 0"):
        stream.begin(0)  # slice 0 is rank 0's
    stream.begin(1)
    with pytest.raises(ValueError, match="cannot run slice 1 after slice 1"):
        stream.begin(1)
    with pytest.raises(ValueError, match="a plan for 2 ranks"):
        vae_shard.RankStream(SINGLE, vae_shard.decode_plan(4, 2))


# -- several ranks ------------------------------------------------------------------------------------------------

def _tiny_components(folder):
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config

    config = seedvr2_config(os.path.join(folder, DIT_FILE.format(variant="3b")), os.path.join(folder, VAE_FILE),
                            os.path.join(folder, TEXT_FILE), dtype="float32", vae_dtype="float32")
    return config.build_pipeline(0).c


def _on(c, device):
    c.device = torch.device(device)
    c.dit.to(device), c.vae.to(device)
    c.text = c.text.to(device)
    return c


def _restore_frames(frames, seed=3):
    return torch.randint(0, 256, (frames, 16, 24, 3), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


def _restore(c, ctx, frames, color):
    from comfyui_h3.backend.pipelines.seedvr2.preprocess import plan_geometry
    from comfyui_h3.backend.pipelines.seedvr2.restore import batch_generator, restore_batch

    video = _restore_frames(frames)
    geometry = plan_geometry(16, 24, scale=2.0)
    timings = {}
    out = restore_batch(c, video, geometry, color, batch_generator(7, 0), ctx, None, None, timings)
    return out, sorted(timings)


def _rank(rank, world, port, out_dir, tiny_dir, backend="gloo", device_type="cpu"):
    from dist_ranks import join_group, to_cpu

    device, ctx = join_group(rank, world, port, backend, device_type)
    result = {"encode": {}, "decode": {}, "restore": {}}
    vae = _vae(device=device)
    for frames, step in ENCODES:
        result["encode"][(frames, step)] = tuple(to_cpu(t) for t in vae_shard.encode(vae, ctx, _video(frames).to(device),
                                                                                    step))
    for t, step, dtype in DECODES:
        model = vae if dtype == torch.float32 else _vae(dtype, device)
        got = vae_shard.decode(model, ctx, _latents(t).to(device, dtype), step)
        result["decode"][(t, step, str(dtype))] = to_cpu(got)
    if tiny_dir is not None:
        c = _on(_tiny_components(tiny_dir), device)
        for frames, color in RESTORES:
            out, stages = _restore(c, ctx, frames, color)
            result["restore"][(frames, color)] = (to_cpu(out), stages)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    from dist_ranks import leave_group

    leave_group()


def _spawn(out, world, tiny_dir, backend="gloo", device_type="cpu"):
    mp.spawn(_rank, args=(world, _free_port(), str(out), tiny_dir, backend, device_type), nprocs=world)
    return world, [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from comfyui_h3.backend.models.seedvr2.tiny import make_tiny_seedvr2

    return str(make_tiny_seedvr2(tmp_path_factory.mktemp("tiny") / "m", "3b"))


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, tmp_path_factory, tiny_dir):
    return _spawn(tmp_path_factory.mktemp(f"vae_shard_{request.param}"), request.param, tiny_dir)


def _check_vae(world, results, device="cpu", exact=True):
    def same(a, b):
        if exact:
            return a.dtype == b.dtype and torch.equal(a, b)
        tol = 1e-5 if b.dtype == torch.float32 else 2e-2  # GPU kernels need not repeat bit for bit
        return a.shape == b.shape and ((a.double() - b.double()).norm() / b.double().norm()).item() <= tol

    vae = _vae(device=device)
    with torch.no_grad():
        for frames, step in ENCODES:
            want = [t.cpu() for t in vae.encode(_video(frames).to(device), step)]
            for res in results:  # the whole condition on every rank
                got = res["encode"][(frames, step)]
                assert all(same(g, w) for g, w in zip(got, want)), (frames, step)
        for t, step, dtype in DECODES:
            model = vae if dtype == torch.float32 else _vae(dtype, device)
            want = model.decode(_latents(t).to(device, dtype), step).cpu()
            got = results[0]["decode"][(t, step, str(dtype))]
            assert same(got, want), (t, step, dtype)
            assert all(res["decode"][(t, step, str(dtype))] is None for res in results[1:])


@pytest.mark.slow
def test_encode_and_decode_on_gloo_ranks_equal_one_rank_bitwise(ranks):
    _check_vae(*ranks)


def _check_restore(results, tiny_dir, device="cpu", exact=True):
    c = _on(_tiny_components(tiny_dir), device)
    for frames, color in RESTORES:
        want, stages = _restore(c, SINGLE, frames, color)
        want = want.cpu()
        got, got_stages = results[0]["restore"][(frames, color)]
        assert got.dtype == torch.uint8 and got.shape == want.shape, (frames, color)
        if exact:
            assert torch.equal(got, want), (frames, color)
        else:  # GPU kernels: a rounding step at most, rarely
            diff = (got.int() - want.int()).abs()
            assert diff.max().item() <= 1 and (diff > 0).float().mean().item() <= 1e-3, (frames, color)
        assert set(stages) <= set(got_stages) and "gather_s" in got_stages
        assert all(res["restore"][(frames, color)][0] is None for res in results[1:])


def test_restore_batch_on_gloo_ranks_equals_one_rank_bitwise(ranks, tiny_dir):
    _check_restore(ranks[1], tiny_dir)


@pytest.mark.slow
def test_engine_on_two_ranks_equals_one(tiny_dir):
    """The whole pipeline through the mp executor on 2 gloo ranks (window SP for the DiT, the VAE spread): the frames
    of one rank up to a rounding step (the DiT's text sums add in another order), over several batches."""
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    files = (os.path.join(tiny_dir, DIT_FILE.format(variant="3b")), os.path.join(tiny_dir, VAE_FILE),
             os.path.join(tiny_dir, TEXT_FILE))

    def request():
        return UpscaleRequest(_restore_frames(19), scale=2.0, batch_frames=13, overlap=4, seed=5, timings=True)

    want = seedvr2_config(*files, dtype="float32", vae_dtype="float32").build_pipeline(0).run(request())
    engine = Engine(seedvr2_config(*files, dtype="float32", vae_dtype="float32", world_size=2, cpu_threads=1))
    try:
        got = engine.generate(request())
    finally:
        engine.shutdown()
    assert got.batches == want.batches == 2 and got.frames.shape == want.frames.shape == (19, 32, 48, 3)
    diff = (got.frames.int() - want.frames.int()).abs()
    assert diff.max().item() <= 1 and (diff > 0).float().mean().item() <= 1e-3
    assert "gather_s" in got.timings


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than 2 CUDA devices on this machine (the gloo CPU "
                    "tests above run the same plans and exchanges)")
@pytest.mark.parametrize("backend", ["cpu:gloo,cuda:nccl", "gloo"])
def test_cuda_ranks_equal_one_gpu(tmp_path, tiny_dir, backend):
    # The engine's group (NCCL for CUDA tensors) and a gloo-only group, whose exchanges run on host copies.
    world, results = _spawn(tmp_path, 2, tiny_dir, backend, "cuda")
    _check_vae(world, results, "cuda:0", exact=False)
    _check_restore(results, tiny_dir, "cuda:0", exact=False)


@pytest.mark.slow
def test_bench_sp_pipeline_runs_tiny_on_cpu_ranks():
    """bench/seedvr2.py sp --pipeline (the multi-GPU run's code) on the tiny files and 2 gloo CPU ranks: stages and
    peaks per rank, the one-rank reference and the uint8 difference."""
    import json
    import subprocess
    import sys

    script = REPO / "bench" / "seedvr2.py"
    done = subprocess.run([sys.executable, str(script), "sp", "--pipeline", "--tiny", "--world", "2", "--frames", "21",
                           "--height", "16", "--width", "24", "--batch-frames", "13"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert record["stage"] == "sp_pipeline" and record["output"] == [21, 32, 48, 3] and record["batches"] == 3
    assert len(record["ranks"]) == 2 and all("gather_s" in r and "decode_s" in r for r in record["ranks"])
    assert record["u8_max_diff"] <= 1 and record["u8_diff_frac"] <= 1e-3 and "decode_s" in record["single"]
