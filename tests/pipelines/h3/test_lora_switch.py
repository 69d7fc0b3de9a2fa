"""Switching LoRAs on a loaded H3 DiT (models/lora_apply.py): another set, other strengths or none gives, bit for bit,
the weights and outputs of a model loaded with that set -- unfused, fused and FP8 storage -- reading no base weight;
a switch that needs a base weight the model no longer holds exactly is refused (the caller loads again) and changes
nothing."""

import os

import pytest
import torch

from comfyui_h3.backend.models import lora_apply
from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
from comfyui_h3.backend.models.lora import lora_choice
from comfyui_h3.backend.models.lora_apply import CannotSwitch, apply_loras
from comfyui_h3.backend.models.lora_write import write_lora
from test_lora import forward, lora_parts, shapes  # noqa: F401  (shapes: the module fixture)

STORAGES = {"unfused": dict(fuse=False), "fused": dict(), "fp8": dict(storage="fp8_emulated")}


def load(tiny_h3_dir, storage, loras=()):
    return load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, loras=loras, **STORAGES[storage])


def held(model) -> dict:
    """Every tensor the model holds, FP8 codes as bytes (what torch.equal compares everywhere)."""
    out = {}
    for key, value in model.state_dict().items():
        out[key] = value.view(torch.uint8) if value.dtype == torch.float8_e4m3fn else value
    for name, module in model.named_modules():
        if getattr(module, "qkv_weight", None) is not None:
            out[f"{name}.qkv_weight"] = module.qkv_weight
    return out


def assert_same(a, b):
    ha, hb = held(a), held(b)
    assert ha.keys() == hb.keys()
    for key in ha:
        assert torch.equal(ha[key], hb[key]), key
    for x, y in zip(forward(a), forward(b)):
        assert torch.equal(x, y)


@pytest.fixture()
def two_loras(shapes, tmp_path):  # noqa: F811
    f1, a1, d1 = lora_parts(shapes, seed=5)
    f2, a2, d2 = lora_parts(shapes, seed=6, blocks=(1,))
    return (write_lora(tmp_path / "one.safetensors", f1, "kohya", shapes, a1, d1),
            write_lora(tmp_path / "two.safetensors", f2, "native", shapes, a2, d2))


@pytest.mark.parametrize("storage", list(STORAGES))
def test_switching_equals_a_model_loaded_with_that_set(tiny_h3_dir, two_loras, storage):
    one, two = two_loras
    model = load(tiny_h3_dir, storage, [lora_choice(one)])
    for chosen in ([lora_choice(two, 0.7), lora_choice(one, -0.3, 0.5)],  # another set, order and strengths
                   [lora_choice(one, 0.5)],  # back to the first file, another strength
                   []):  # none: the base as loaded
        report = apply_loras(model, chosen)
        assert report["weights"] > 0
        assert model.loras == [c.record() for c in chosen]
        assert_same(model, load(tiny_h3_dir, storage, chosen))


def test_a_model_loaded_without_loras_takes_one_in_place(tiny_h3_dir, two_loras):
    one, _ = two_loras
    model = load(tiny_h3_dir, "fused")
    assert not model.lora_base
    apply_loras(model, [lora_choice(one, 0.8)])
    assert_same(model, load(tiny_h3_dir, "fused", [lora_choice(one, 0.8)]))
    assert model.lora_base  # the weights it touched, as loaded, for the next switch


def test_fp8_codes_are_no_base_a_switch_is_refused_and_changes_nothing(tiny_h3_dir, two_loras, shapes, tmp_path):  # noqa: F811
    one, two = two_loras
    model = load(tiny_h3_dir, "fp8", [lora_choice(two)])  # block 1 only: block 0's GEMM weights are FP8 codes now
    before = {k: v.clone() for k, v in held(model).items()}
    with pytest.raises(CannotSwitch, match="no longer held exactly"):
        apply_loras(model, [lora_choice(one)])  # touches block 0
    assert all(torch.equal(v, before[k]) for k, v in held(model).items())
    apply_loras(model, [lora_choice(two, 0.25)])  # the same weights: in place
    assert_same(model, load(tiny_h3_dir, "fp8", [lora_choice(two, 0.25)]))


def test_a_switch_opens_only_the_lora_files(tiny_h3_dir, two_loras, monkeypatch):
    one, two = two_loras
    model = load(tiny_h3_dir, "fused", [lora_choice(one)])
    opened = []
    real = lora_apply.safe_open

    def spy(path, *a, **k):
        opened.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(lora_apply, "safe_open", spy)
    monkeypatch.setattr("comfyui_h3.backend.models.checkpoint.load_into",
                        lambda *a, **k: pytest.fail("a switch read the base weights"))
    report = apply_loras(model, [lora_choice(two)])
    assert opened and set(opened) <= {str(one), str(two)}, opened
    assert report["lora_bytes"] == os.path.getsize(two)


def test_without_host_room_the_base_is_not_kept_and_the_next_switch_refuses(tiny_h3_dir, two_loras, monkeypatch):
    one, two = two_loras
    monkeypatch.setattr(lora_apply, "host_free_bytes", lambda: 1024)
    model = load(tiny_h3_dir, "fused", [lora_choice(one)])
    assert model.lora_base is None
    with pytest.raises(CannotSwitch):
        apply_loras(model, [lora_choice(two)])
    assert_same(model, load(tiny_h3_dir, "fused", [lora_choice(one)]))


# -- on an engine: the registry reuses the workers, the job carries the LoRAs ------------------------------------------

def _request():
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    return H3Request(prompt="surf", num_frames=124, steps=2, seed=3, width=64, height=64, decode=False)


def _latents_equal(a, b):
    return torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


def test_a_pipeline_switches_in_place_and_equals_a_fresh_one(tiny_h3_dir, two_loras):
    from comfyui_h3.backend.errors import ReloadNeeded
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy

    one, two = two_loras
    for policy in (H3WeightPolicy(), H3WeightPolicy(adaln="cache")):  # the cache is rebuilt over the switched DiT
        pipe = h3_config(str(tiny_h3_dir), dtype="float32", weights=policy, loras=[(one, 1.0)]).build_pipeline(0)
        pipe.run(_request())
        chosen = h3_config(str(tiny_h3_dir), dtype="float32", weights=policy, loras=[(two, 0.6), (one, -0.2)])
        pipe.set_live_options(chosen.live_state())
        got = pipe.run(_request())
        assert got.manifest["engine"]["live_switch"]["in_place"] is True
        assert _latents_equal(got, chosen.build_pipeline(0).run(_request())), policy
    streamed = h3_config(str(tiny_h3_dir), dtype="float32", loras=[(one, 1.0)],
                         weights=H3WeightPolicy(placement="offload", resident_blocks=1)).build_pipeline(0)
    streamed.run(_request())
    with pytest.raises(ReloadNeeded, match="streamed"):
        streamed.set_live_options({"loras": chosen.options.loras})


@pytest.mark.slow
def test_an_engine_switches_loras_without_new_workers_and_reloads_where_it_must(tiny_h3_dir, two_loras):
    from comfyui_h3.backend import engine as engines
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy

    one, two = two_loras
    first = h3_config(str(tiny_h3_dir), dtype="float32", cpu_threads=1, loras=[(one, 1.0)])
    second = h3_config(str(tiny_h3_dir), dtype="float32", cpu_threads=1, loras=[(two, 0.6)])
    fp8 = dict(dtype="bfloat16", cpu_threads=1, weights=H3WeightPolicy(storage="fp8_emulated"))
    assert second.identity() == first.identity() and second != first
    try:
        eng = engines.get_engine(first)
        eng.generate(_request(), config=first)
        pids = [p.pid for p in eng._executor._procs]
        assert engines.get_engine(second) is eng and eng.config == second  # the same engine, retargeted
        got = eng.generate(_request(), config=second)
        assert [p.pid for p in eng._executor._procs] == pids  # no new workers: nothing loaded again
        assert got.manifest["engine"]["live_switch"]["in_place"] is True
        assert got.manifest["engine"]["load_s"] is None
        assert got.manifest["engine"]["loras"] == [c.record() for c in second.options.loras]
        assert _latents_equal(got, second.build_pipeline(0).run(_request()))
        # back to the first set, through the job's own config (another caller may have retargeted the engine)
        again = eng.generate(_request(), config=first)
        assert _latents_equal(again, first.build_pipeline(0).run(_request()))
        # an FP8 engine holding block 1's codes only cannot take block 0's LoRA in place: it starts again with it
        low = engines.get_engine(h3_config(str(tiny_h3_dir), loras=[(two, 0.6)], **fp8))
        low.generate(_request())
        back = engines.get_engine(h3_config(str(tiny_h3_dir), loras=[(one, 1.0)], **fp8))
        assert back is low and back is not eng
        got = back.generate(_request())
        assert got.manifest["engine"]["live_switch"]["in_place"] is False
        assert "no longer held exactly" in got.manifest["engine"]["live_switch"]["why"]
        assert got.manifest["engine"]["load_s"] is not None
    finally:
        engines.shutdown_all()


@pytest.mark.slow
def test_two_gloo_ranks_switch_together_and_equal_one_fresh_rank(tiny_h3_dir, two_loras):
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    one, two = two_loras
    first = h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1, loras=[(one, 1.0)])
    second = h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1, loras=[(two, 0.6), (one, 0.3)])
    want = h3_config(str(tiny_h3_dir), dtype="float32", loras=[(two, 0.6), (one, 0.3)]).build_pipeline(0).run(_request())
    eng = Engine(first)
    try:
        eng.generate(_request())
        got = eng.generate(_request(), config=second)
    finally:
        eng.shutdown()
    assert got.manifest["engine"]["live_switch"]["in_place"] is True
    for g, w in ((got.video_latents, want.video_latents), (got.audio_latents, want.audio_latents)):
        assert (g - w).abs().max() <= 1e-5 * max(1.0, w.abs().max().item())  # the ranks' text sums: other order


def test_a_switch_failing_half_way_asks_for_a_reload(tiny_h3_dir, two_loras, monkeypatch):
    from comfyui_h3.backend.errors import ReloadNeeded
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    one, two = two_loras
    pipe = h3_config(str(tiny_h3_dir), dtype="float32", loras=[(one, 1.0)]).build_pipeline(0)
    pipe.run(_request())
    calls = []
    real = lora_apply._install

    def failing(model, values):
        calls.append(1)
        if len(calls) == 2:  # one block switched, the next fails (as an out-of-memory would)
            raise RuntimeError("out of memory")
        real(model, values)

    monkeypatch.setattr(lora_apply, "_install", failing)
    with pytest.raises(ReloadNeeded, match="failed part way"):
        pipe.set_live_options({"loras": (lora_choice(two),)})
    assert not pipe.c._dits  # the mixed weights are dropped, never run
