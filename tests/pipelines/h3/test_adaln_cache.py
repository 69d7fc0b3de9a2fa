"""The AdaLN projection table cache (weight policy adaln="cache", backend/pipelines/h3/adaln_cache.py) on the tiny
model in float32: the same latents bit for bit as the direct projection for t2va, fl2va, edit (per-row timesteps)
and extend (several windows, guide rows), on one rank and on 2 gloo ranks; no projection weight left on the modules;
a key missing mid-request rebuilt; a Stop or a failure during a rebuild leaves a working pipeline; a plan whose tables
would outweigh the weights runs on the direct projection; the option in the loader node and the CLI."""

import pytest
import torch

from comfyui_h3.backend.engine import Engine
from comfyui_h3.backend.errors import Cancelled
from comfyui_h3.backend.pipelines.h3 import adaln_cache
from comfyui_h3.backend.pipelines.h3.adaln_cache import StepInfo
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy as WeightPolicy

from h3_requests import REQUESTS, edit, extend, t2va  # noqa: F401

CACHE = WeightPolicy(adaln="cache")


def _same(got, want):
    for key in ("video_latents", "audio_latents"):
        a, b = getattr(got, key), getattr(want, key)
        assert a.shape == b.shape and torch.equal(a, b), key


def _projection_params(dit):
    lins = [b.adaln_proj.linear for b in dit.transformer_blocks] + [dit.norm_out.linear]
    return [p for lin in lins for p in (lin.weight, lin.bias)]


@pytest.fixture(scope="module")
def direct(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)


@pytest.fixture(scope="module")
def cached(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32", weights=CACHE).build_pipeline(0)


@pytest.fixture(scope="module")
def wants(direct):
    return {name: direct.run(make()) for name, make in REQUESTS.items()}


def _report(pipe, partition="transformer"):
    return pipe.c.adaln_report()[partition]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REQUESTS))
def test_cache_equals_direct_bitwise(cached, wants, name):
    partition = "transformer_ref" if name == "extend" else "transformer"
    got = cached.run(REQUESTS[name]())
    _same(got, wants[name])
    report = _report(cached, partition)
    assert report["mode"] == "tables" and report["table_keys"] >= 2 and report["table_bytes"] > 0
    assert report["weight_bytes_device"] == 0 < report["weight_bytes_host"]
    assert report["table_bytes"] < report["weight_bytes_host"]
    assert all(p.numel() == 0 for p in _projection_params(cached.c.transformer_for(name)))
    if name == "extend":  # the second window's steps are the first's keys: hits, no rebuild
        assert report["hits"] >= 2 and report["builds"] == 1


@pytest.mark.slow
def test_edit_plans_carry_per_row_timesteps(cached, monkeypatch):
    """The edit case above is not a clocks-only plan in disguise: its steps hold several timesteps per modality."""
    seen = []
    real = StepInfo.of

    def spy(row_t, tags):
        info = real(row_t, tags)
        seen.append(info)
        return info

    monkeypatch.setattr(StepInfo, "of", staticmethod(spy))
    cached.run(edit())
    assert seen and max(len(i.key.timesteps) for i in seen) > 3
    assert max(len(i.key.rows) for i in seen) > 4


def test_step_keys_are_exact_bit_patterns():
    tags = torch.tensor([1, 1, 0, 0, 2])
    t = torch.tensor([0.5, 0.5, 0.5, 0.25, 0.25], dtype=torch.float32)
    a = StepInfo.of(t, tags)
    assert a.key == StepInfo.of(t.clone(), tags).key
    assert a.key.timesteps == tuple(torch.tensor([0.25, 0.5]).view(torch.int32).tolist())
    assert a.key.rows == (0 * 3 + 0, 0 * 3 + 2, 1 * 3 + 0, 1 * 3 + 1)  # (t index * 3 + tag), used ones only
    assert a.renumber == {0: 0, 2: 1, 3: 2, 4: 3}
    nudged = t.clone()
    nudged[3:] = torch.nextafter(nudged[3:], torch.tensor(1.0))  # one ulp
    assert StepInfo.of(nudged, tags).key != a.key


def test_key_miss_mid_request_is_rebuilt(cached, wants):
    """Tables dropped after step 1: steps 2 and 3 find their keys missing and rebuild them, same latents."""
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    cache.evict()
    before = dict(cache.stats)
    got = cached.run(t2va(), on_step=lambda done, total: cache.evict() if done == 1 else None)
    _same(got, wants["t2va"])
    assert cache.stats["builds"] - before["builds"] == 3  # ahead of step 1, then at steps 2 and 3
    assert cache.stats["keys_built"] - before["keys_built"] == 5  # 3 ahead + 2 again


def test_a_new_request_brings_new_keys_and_old_ones_stay(cached, direct):
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    cache.evict()
    cached.run(t2va())
    keys = cache.report()["table_keys"]
    before = dict(cache.stats)
    other = t2va(steps=2, video_shift=5.0)
    _same(cached.run(other), direct.run(other))
    assert cache.stats["builds"] == before["builds"] + 1 and cache.report()["table_keys"] > keys
    cached.run(t2va())  # the first plan's keys are still held: no build
    assert cache.stats["builds"] == before["builds"] + 1


def test_old_keys_are_evicted_to_keep_the_tables_within_the_weights(cached, direct):
    """Two 15-step plans: each fits the tiny model's budget alone, not both together. The second evicts the first's
    least recently used keys; the tables never outweigh the projection weights."""
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    cache.evict()
    first, second = t2va(steps=15), t2va(steps=15, video_shift=5.0)
    cached.run(first)
    held = cache.report()["table_keys"]
    _same(cached.run(second), direct.run(second))
    report = cache.report()
    assert report["mode"] == "tables" and report["table_bytes"] <= report["weight_bytes_host"]
    assert report["table_keys"] < held + 14  # some of the first plan's keys went
    builds = cache.stats["builds"]
    _same(cached.run(first), direct.run(first))  # its evicted keys are rebuilt
    assert cache.stats["builds"] == builds + 1


def test_stop_during_a_rebuild_leaves_a_working_pipeline(cached, wants):
    """Stop asked at the build's last question (every block's tables built, the output norm's not yet)."""
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    cache.evict()
    last = len(cache.dit.transformer_blocks) + 1  # one question before each block and before the output norm
    calls = []

    def stop_while_building():
        calls.append(1)
        return len(calls) == last

    builds = cache.stats["builds"]
    with pytest.raises(Cancelled, match="building AdaLN tables"):
        cached.run(t2va(), should_stop=stop_while_building)
    assert cache.report()["table_keys"] == 0 and cache.stats["builds"] == builds  # nothing half-built committed
    assert all(p.numel() == 0 for p in _projection_params(cache.dit))
    _same(cached.run(t2va()), wants["t2va"])


def test_a_failure_during_a_rebuild_commits_nothing(cached, wants, monkeypatch):
    """The build fails at its last projection (the output norm's), after every block's tables were made."""
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    cache.evict()
    cached.run(t2va(steps=2))
    held = cache.report()["table_keys"]

    def fail(*args):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(adaln_cache, "norm_out_table", fail)
    with pytest.raises(RuntimeError, match="injected failure"):
        cached.run(t2va())
    assert cache.report()["table_keys"] == held
    assert all(p.numel() == 0 for p in _projection_params(cache.dit))
    monkeypatch.undo()
    _same(cached.run(t2va()), wants["t2va"])


def test_tables_larger_than_the_weights_run_on_the_direct_projection(cached, direct):
    """40 steps of the tiny model: 40 keys of tables outweigh its projection weights. The plan runs on the weights,
    restored for it and offloaded after (also when it is stopped)."""
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    long = t2va(steps=40)
    plans = cache.stats["direct_plans"]
    _same(cached.run(long), direct.run(long))
    assert cache.report()["mode"] == "direct" and cache.stats["direct_plans"] == plans + 1
    assert all(p.numel() == 0 for p in _projection_params(cache.dit))
    with pytest.raises(Cancelled):
        cached.run(long, should_stop=lambda: True)
    assert cache.report()["weight_bytes_device"] == 0


def test_a_failed_restore_leaves_the_weights_offloaded(cached, monkeypatch):
    cache = cached.c.adaln_cache(cached.c.transformer_for("t2va"))
    real = cache._on_device

    def fail_at_block_1(j):
        if j == 1:
            raise torch.cuda.OutOfMemoryError("injected")
        return real(j)

    monkeypatch.setattr(cache, "_on_device", fail_at_block_1)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with cache.weights_restored():
            pass
    assert all(p.numel() == 0 for p in _projection_params(cache.dit))


def test_an_offloaded_projection_refuses_a_forward_without_tables(cached):
    dit = cached.c.transformer_for("t2va")
    with pytest.raises(RuntimeError, match="offloaded"):
        dit.transformer_blocks[0].adaln_proj(torch.zeros(1, dit.config.time_embed_dim))


@pytest.mark.slow
def test_two_gloo_ranks_cache_equals_direct_bitwise(tiny_h3_dir, tmp_path):
    """Ulysses on 2 CPU ranks: every rank builds the same tables; t2va, edit and extend as without the cache."""
    from comfyui_h3.backend.media.encode import next_free_path

    results = {}
    for policy in (WeightPolicy(), CACHE):
        eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1, weights=policy))
        try:
            ext = extend()
            ext.output_path = next_free_path(str(tmp_path), f"ext_{policy.adaln}", "mp4")
            results[policy.adaln] = [eng.generate(t2va()), eng.generate(edit()), eng.generate(ext)]
        finally:
            eng.shutdown()
    for got, want in zip(results["cache"], results["direct"]):
        _same(got, want)


def test_weight_policy_refuses_an_unknown_adaln_mode(tiny_h3_dir):
    with pytest.raises(ValueError, match="AdaLN mode must be one of"):
        h3_config(str(tiny_h3_dir), weights=WeightPolicy(adaln="tables")).validate()


def test_loader_offers_the_cache_as_an_appended_optional_widget(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes import loader

    spec = loader.H3ModelLoader.INPUT_TYPES()
    assert list(spec["required"]) == ["model", "device", "dtype", "attention", "sp_degree", "gpus", "executor",
                                      "ray_address"]  # saved workflows' widget order
    kind, opts = spec["optional"]["adaln_cache"]
    assert kind == "BOOLEAN" and opts["default"] is False and opts["tooltip"]
    monkeypatch.setattr(loader, "ensure_tiny_model", lambda: tiny_h3_dir)
    (off,) = loader.H3ModelLoader().load(loader.TINY_NAME, "cpu", "float32", "sdpa")
    (on,) = loader.H3ModelLoader().load(loader.TINY_NAME, "cpu", "float32", "sdpa", adaln_cache=True)
    assert off.config.weights.adaln == "direct" and on.config.weights.adaln == "cache"


@pytest.mark.parametrize("flag,want", [([], "direct"), (["--adaln-cache"], "cache")])
def test_cli_adaln_cache_flag_reaches_the_engine_config(monkeypatch, flag, want):
    from cli_engine_configs import engine_configs_for

    configs = engine_configs_for(monkeypatch, flag, t2va())
    assert len(configs) == 3 and all(c.weights.adaln == want for c in configs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the page-locked host home of the "
                    "projection weights, device tables); the CPU tests above run the same cache logic")
def test_cuda_bf16_cache_equals_direct_bitwise(tiny_h3_dir):
    want = h3_config(str(tiny_h3_dir), device="cuda", dtype="bfloat16", compile="off").build_pipeline(0).run(t2va())
    pipe = h3_config(str(tiny_h3_dir), device="cuda", dtype="bfloat16", compile="off", weights=CACHE).build_pipeline(0)
    _same(pipe.run(t2va()), want)
    report = _report(pipe)
    assert report["pinned"] and report["weight_bytes_device"] == 0 and report["table_bytes"] > 0
    assert all(p.numel() == 0 and p.is_cuda for p in _projection_params(pipe.c.transformer_for("t2va")))
