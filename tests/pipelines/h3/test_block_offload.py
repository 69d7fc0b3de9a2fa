"""Block offload (weight placement "offload", issue 14 item 2): models/block_offload.py streams DiT blocks from host
homes through device slots, pipelines/h3/offload.py plans the resident blocks per request and moves the text encoder
and VAEs between host and device by stage. On the CPU the same state machine runs (copies instead of a copy stream),
so equality here is bitwise; the GPU overlap is bench/block_offload.py's job."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from repo_paths import REPO
from comfyui_h3.backend.models import block_offload
from comfyui_h3.backend.models.block_offload import BlockStreamer, ModuleHome
from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig
from comfyui_h3.backend.pipelines.h3 import offload
from comfyui_h3.backend.options import parse_resident_blocks
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
from comfyui_h3.backend.pipelines.h3.layout import build_layout
from comfyui_h3.backend.pipelines.h3.request import H3Request
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan
from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy as WeightPolicy

CFG = dict(num_attention_heads=2, attention_head_dim=32, hidden_size=48, num_layers=5, num_refiner_layers=1,
           ffn_dim=96, text_dim=40, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=24, rope_freq_dim=4)


@pytest.fixture(scope="module")
def dit_and_calls():
    """A 5-block DiT (random fp32 weights) and three forwards' inputs (three steps' timesteps)."""
    torch.manual_seed(0)
    dit = H3Transformer(H3TransformerConfig(**CFG)).eval().requires_grad_(False)
    for p in dit.parameters():
        p.data.normal_(0, 0.2)
    dit.fuse_projections()
    gen = torch.Generator().manual_seed(1)
    layout = build_layout(torch.tensor([1, 1, 0, 1]), resolve_geometry(124, 64, 64), (1, 2, 2), ("first",))
    calls = []
    for t_video, t_audio in ((0.2, 0.7), (0.5, 0.6), (0.9, 0.95)):
        ts, idx = row_timestep_plan(layout, t_video, t_audio)
        calls.append((torch.randn(1, layout.video_indices.numel(), 96, generator=gen),
                      torch.randn(1, layout.audio_indices.numel(), 32, generator=gen),
                      torch.randn(1, 4, CFG["text_dim"], generator=gen), ts, idx, layout.token_tags,
                      layout.position_ids, layout.video_indices, layout.audio_indices, layout.text_indices))
    with torch.no_grad():
        want = [dit(*args) for args in calls]
    return dit, calls, want


def _home_of(streamer: BlockStreamer, i: int) -> tuple[int, int]:
    buf = streamer.homes[i].buffer
    return buf.data_ptr(), buf.data_ptr() + buf.numel()


@pytest.mark.parametrize("resident", [0, 1, 3, 4, 5])
@pytest.mark.parametrize("prefetch", [1, 2])
def test_streamed_forward_equals_resident_bitwise(dit_and_calls, resident, prefetch):
    dit, calls, want = dit_and_calls
    streamed = copy.deepcopy(dit)
    streamer = BlockStreamer(streamed.transformer_blocks, "cpu", resident=resident, prefetch=prefetch)
    streamed.block_offload = streamer
    with torch.no_grad():
        for args, (want_v, want_a) in zip(calls, want):  # three forwards: the prefetch wraps into the next one
            got_v, got_a = streamed(*args)
            assert torch.equal(got_v, want_v) and torch.equal(got_a, want_a)
    assert streamer.resident_count == resident and len(streamer._slots) == min(prefetch + 1, 5 - resident)
    for i in streamer.streamed:  # between forwards a streamed block's weights are its host home, never a slot
        lo, hi = _home_of(streamer, i)
        assert all(lo <= t.data_ptr() < hi for t in streamer.homes[i].tensors)


def test_next_block_is_copied_before_the_current_one_runs(dit_and_calls, monkeypatch):
    """The launch order the GPU overlap rests on: block i+1's copy is issued before block i's work, cyclically
    across forwards (the last block prefetches the first streamed one), one copy per streamed block per forward."""
    dit, calls, _ = dit_and_calls
    streamed = copy.deepcopy(dit)
    streamer = BlockStreamer(streamed.transformer_blocks, "cpu", resident=1)
    streamed.block_offload = streamer
    events = []
    home_of = {h.buffer.data_ptr(): i for i, h in enumerate(streamer.homes)}
    original = block_offload._Copies.copy

    def copy_logged(self, dst, src, after=None, done=None):
        events.append(("copy", home_of[src.data_ptr()]))
        return original(self, dst, src, after, done)

    monkeypatch.setattr(block_offload._Copies, "copy", copy_logged)
    for i, block in enumerate(streamed.transformer_blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: events.append(("run", i)))
    with torch.no_grad():
        streamed(*calls[0])
        streamed(*calls[1])
    assert events == [("copy", 1), ("run", 0), ("copy", 2), ("run", 1), ("copy", 3), ("run", 2), ("copy", 4),
                      ("run", 3), ("copy", 1), ("run", 4),
                      ("run", 0), ("copy", 2), ("run", 1), ("copy", 3), ("run", 2), ("copy", 4), ("run", 3),
                      ("copy", 1), ("run", 4)]


@pytest.mark.slow
def test_compiled_blocks_stream_bitwise_with_one_graph(dit_and_calls):
    """The engine compiles every block on CUDA (components.compile_blocks): moving a block's weights by `.data` keeps
    one graph for all blocks, streamed or resident, and the same numbers as the compiled resident model."""
    import torch._dynamo.utils as dynamo_utils

    from comfyui_h3.backend.pipelines.h3.components import compile_blocks

    dit, calls, _ = dit_and_calls
    resident, streamed = copy.deepcopy(dit), copy.deepcopy(dit)
    streamed.block_offload = BlockStreamer(streamed.transformer_blocks, "cpu", resident=2)
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compile_blocks(resident)
    compile_blocks(streamed)
    with torch.no_grad():
        for args in calls[:2]:
            (want_v, want_a), (got_v, got_a) = resident(*args), streamed(*args)
            assert torch.equal(got_v, want_v) and torch.equal(got_a, want_a)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1


def test_a_failing_block_leaves_the_streamer_usable(dit_and_calls):
    dit, calls, want = dit_and_calls
    streamed = copy.deepcopy(dit)
    streamer = BlockStreamer(streamed.transformer_blocks, "cpu", resident=0)
    streamed.block_offload = streamer
    handle = streamed.transformer_blocks[2].register_forward_pre_hook(lambda m, a: 1 / 0)
    with torch.no_grad(), pytest.raises(ZeroDivisionError):
        streamed(*calls[0])
    handle.remove()
    assert streamer._active is None  # block 2 went back to its home
    with torch.no_grad():
        got_v, got_a = streamed(*calls[1])
    assert torch.equal(got_v, want[1][0]) and torch.equal(got_a, want[1][1])


def test_resident_count_changes_between_requests(dit_and_calls):
    dit, calls, want = dit_and_calls
    streamed = copy.deepcopy(dit)
    streamer = BlockStreamer(streamed.transformer_blocks, "cpu", resident=2)
    streamed.block_offload = streamer
    with torch.no_grad():
        for k, args, (want_v, _) in zip((2, 5, 0), calls, want):
            streamer.set_resident(k)
            assert streamer.device_bytes() == streamer.device_bytes_for(k)
            assert torch.equal(streamed(*args)[0], want_v)
        streamer.offload_all()
        assert streamer.device_bytes() == 0
        assert torch.equal(streamed(*calls[0])[0], want[0][0])  # still runs: two slots made on demand
        streamer.close()
        assert all(p.numel() == 0 for p in streamed.transformer_blocks.parameters())


def test_out_of_memory_while_planning_leaves_a_usable_streamer(dit_and_calls, monkeypatch):
    dit, calls, want = dit_and_calls
    streamed = copy.deepcopy(dit)
    streamer = BlockStreamer(streamed.transformer_blocks, "cpu", resident=1)
    streamed.block_offload = streamer
    original = BlockStreamer._new_slot

    def no_memory(self):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(BlockStreamer, "_new_slot", no_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        streamer.set_resident(3)
    assert streamer.device_bytes() == 0 and streamer.resident_count == 0
    monkeypatch.setattr(BlockStreamer, "_new_slot", original)
    with torch.no_grad():
        assert torch.equal(streamed(*calls[0])[0], want[0][0])


def test_hooks_stream_a_stack_run_by_someone_elses_loop():
    """The text encoder's decoder layers are iterated by the library's own forward: hooks acquire and release."""
    torch.manual_seed(3)
    stack = nn.Sequential(*[nn.Linear(16, 16) for _ in range(5)])
    x = torch.randn(4, 16)
    want = stack(x)
    streamer = BlockStreamer(list(stack), "cpu", resident=1)
    streamer.attach_hooks()
    assert torch.equal(stack(x), want) and torch.equal(stack(x), want)
    streamer.detach_hooks()


def test_module_home_moves_without_copying_back():
    torch.manual_seed(4)
    module = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    want = module(torch.ones(2, 8))
    home = ModuleHome(module, "cpu")
    home_ptr = home.home.buffer.data_ptr()
    assert not home.on_device and module[0].weight.data_ptr() == home_ptr
    home.to_device()
    assert home.on_device and module[0].weight.data_ptr() != home_ptr
    assert torch.equal(module(torch.ones(2, 8)), want)
    home.to_host()
    assert module[0].weight.data_ptr() == home_ptr and torch.equal(module(torch.ones(2, 8)), want)


# ---- stage residency: decisions under a simulated device memory ------------------------------------------------

class _LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 32)
        self.layers = nn.ModuleList([nn.Linear(32, 32) for _ in range(6)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.embed(x)


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.language_model = _LM()

    def forward(self, x):
        return self.language_model(x)


class _Text(nn.Module):
    """Shaped like Qwen3-VL where the residency looks: model.language_model.layers (streamed when it cannot fit),
    called through its child `model` as the text encoder calls it."""

    def __init__(self):
        super().__init__()
        self.model = _Inner()

    def forward(self, x):
        return self.model(x)


def _simulated(residency, capacity):
    def free():
        used = sum(p.device_bytes for p in residency.parts.values())
        return capacity - used - sum(s.device_bytes() for s in residency.dits)
    return free


def test_stage_residency_moves_models_by_stage(monkeypatch):
    monkeypatch.setattr(offload, "DIT_BYTES_PER_ROW", 0)
    monkeypatch.setattr(offload, "DIT_BYTES_PER_OTHER_ROW", 0)
    monkeypatch.setattr(offload, "DIT_RESERVE", 0)
    monkeypatch.setattr(offload, "STAGE_RESERVE", {"text": 0, "vae": 0})
    torch.manual_seed(5)
    text, vae = _Text(), nn.Sequential(nn.Conv1d(4, 64, 3), nn.Conv1d(64, 4, 3))
    x, z = torch.randn(2, 32), torch.randn(1, 4, 16)
    want_text, want_vae = text(x), vae(z)
    dit_blocks = nn.ModuleList([nn.Linear(32, 32) for _ in range(6)])

    residency = offload.StageResidency("cpu")
    residency.add("text", text, layers="model.language_model.layers")
    residency.add("vae", vae)
    dit = BlockStreamer(dit_blocks, "cpu", resident=0)
    dit.offload_all()
    residency.dits.append(dit)
    text_part, vae_part = residency.parts["text"], residency.parts["vae"]
    layer = text_part.layers.block_bytes
    # room for the text encoder's other weights, two layer slots and two resident layers: 4 of 6 layers stream
    capacity = text_part.home.nbytes + 4 * layer
    residency.free_bytes = _simulated(residency, capacity)

    assert torch.equal(text(x), want_text)  # the call enters the text stage
    assert text_part.on_device and text_part.layers.resident_count == 2 and len(text_part.layers.streamed) == 4

    # the DiT stage: its minimum (two block slots) does not fit beside the text encoder -> the text encoder leaves
    plan = residency.enter_dit(dit, local_rows=10, total_rows=10, resident=None)
    assert not text_part.on_device and text_part.device_bytes == 0
    assert plan["resident_blocks"] == dit.resident_count == (capacity - 2 * dit.block_bytes) // dit.block_bytes
    assert plan["stage_models_on_device"] == []

    # the VAE stage takes its room from the DiT's blocks first
    assert torch.equal(vae(z), want_vae)
    assert vae_part.on_device and dit.device_bytes() == 0 and residency.stage == "vae"

    # a fixed count is kept as asked (the VAE fits beside it: no move)
    residency.free_bytes = _simulated(residency, 10 * capacity)
    plan = residency.enter_dit(dit, 10, 10, resident=3)
    assert plan["resident_blocks"] == 3 and plan["mode"] == "fixed" and vae_part.on_device


def test_auto_counts_blocks_beside_the_activation_estimate():
    blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(10)])
    streamer = BlockStreamer(blocks, "cpu", resident=0)
    b = streamer.block_bytes
    activation = offload.dit_activation_bytes(1000, 1000)
    assert activation == 1000 * offload.DIT_BYTES_PER_ROW + offload.DIT_RESERVE
    assert offload.dit_activation_bytes(500, 1000) == (500 * offload.DIT_BYTES_PER_ROW
                                                       + 500 * offload.DIT_BYTES_PER_OTHER_ROW + offload.DIT_RESERVE)
    assert offload.resident_blocks_for(streamer, activation + 2 * b, activation) == 0
    assert offload.resident_blocks_for(streamer, activation + 2 * b - 1, activation) == 0  # too small: stream all
    assert offload.resident_blocks_for(streamer, activation + 5 * b, activation) == 3
    assert offload.resident_blocks_for(streamer, activation + 10 * b, activation) == 10  # all fit: no slots


# ---- the engine path on the tiny model ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resident_result(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0).run(_request())


def _request():
    return H3Request(prompt="rain on a tin roof", num_frames=124, steps=2, seed=4, width=64, height=64, decode=True)


@pytest.mark.slow
@pytest.mark.parametrize("resident", [0, 1, None])
def test_offload_pipeline_equals_resident_bitwise(tiny_h3_dir, resident_result, resident):
    pipe = h3_config(str(tiny_h3_dir), dtype="float32",
                     weights=WeightPolicy(placement="offload", resident_blocks=resident)).build_pipeline(0)
    got = pipe.run(_request())
    want = resident_result
    assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents, want.audio_latents)
    assert torch.equal(got.frames, want.frames) and torch.equal(got.audio, want.audio)
    plan = pipe.c.residency.last_plan
    layers = len(pipe.c.transformer_for("t2va").transformer_blocks)
    assert plan["resident_blocks"] == (layers if resident is None else resident)  # auto: unlimited on the CPU
    assert plan["mode"] == ("auto" if resident is None else "fixed")
    assert set(pipe.c.residency.parts) == {"text", "vae", "audio_vae"}


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the cpu case runs the same moves as host copies)"))])
def test_small_device_moves_every_model_and_keeps_the_output(tiny_h3_dir, monkeypatch, device):
    """A device of 400 kB (simulated; activation estimates zeroed): the text encoder runs with most of its 50
    decoder layers streamed, the DiT with both blocks streamed after the text encoder left, the VAEs come back for
    decode (evicting the DiT's slots). The result equals the all-resident engine's, bit for bit."""
    for name in ("DIT_BYTES_PER_ROW", "DIT_BYTES_PER_OTHER_ROW", "DIT_RESERVE"):
        monkeypatch.setattr(offload, name, 0)
    monkeypatch.setattr(offload, "STAGE_RESERVE", {})
    monkeypatch.setattr(offload, "GIB", 0)  # the default stage reserve
    want = h3_config(str(tiny_h3_dir), device=device, dtype="float32", compile="off").build_pipeline(0).run(
        _request())
    pipe = h3_config(str(tiny_h3_dir), device=device, dtype="float32", compile="off",
                     weights=WeightPolicy(placement="offload")).build_pipeline(0)
    residency = pipe.c.residency
    residency.free_bytes = _simulated(residency, 400_000)
    loads = []
    original = offload._Part.load

    def logged(self, available, reserve):
        original(self, available, reserve)
        loads.append((self.name, None if self.layers is None else len(self.layers.streamed),
                      [s.device_bytes() for s in residency.dits]))

    monkeypatch.setattr(offload._Part, "load", logged)
    got = pipe.run(_request())
    assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents, want.audio_latents)
    assert torch.equal(got.frames, want.frames) and torch.equal(got.audio, want.audio)
    assert loads[0][0] == "text" and 0 < loads[0][1] < 50  # the encoder did not fit: some layers streamed
    assert residency.last_plan["resident_blocks"] == 0 and residency.last_plan["stage_models_on_device"] == []
    vae_load = next(entry for entry in loads if entry[0] == "vae")
    assert vae_load[2] == [0]  # the DiT's slots went before the VAE came back
    if device == "cuda":
        dit = pipe.c.transformer_for("t2va")
        assert dit.proj_in.weight.is_cuda and all(h.pinned for h in dit.block_offload.homes)


@pytest.mark.slow
@pytest.mark.parametrize("policy", [dict(storage="fp8_emulated"), dict(adaln="cache"),
                                    dict(storage="fp8_emulated", adaln="cache")])
def test_offload_composes_with_the_other_weight_policies(tiny_h3_dir, policy):
    """FP8 blocks are quantised (one block at a time) before they are homed; with the AdaLN cache the projection
    weights are the cache's, not streamed. Same output as the same policy fully resident, bit for bit."""
    dtype = "bfloat16" if "storage" in policy else "float32"  # FP8 runs with bf16 compute
    request = H3Request(prompt="rain on a tin roof", num_frames=124, steps=2, seed=4, width=64, height=64,
                        decode=False)
    want = h3_config(str(tiny_h3_dir), dtype=dtype, weights=WeightPolicy(**policy)).build_pipeline(0).run(request)
    pipe = h3_config(str(tiny_h3_dir), dtype=dtype,
                     weights=WeightPolicy(placement="offload", resident_blocks=0, **policy)).build_pipeline(0)
    got = pipe.run(request)
    assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents, want.audio_latents)
    dit = pipe.c.transformer_for("t2va")
    homed = {id(t) for home in dit.block_offload.homes for t in home.tensors}
    if "storage" in policy:
        assert any(t.dtype == torch.float8_e4m3fn for home in dit.block_offload.homes for t in home.tensors)
    if "adaln" in policy:
        assert all(id(p) not in homed for b in dit.transformer_blocks for p in b.adaln_proj.parameters())


def test_weight_policy_checks_resident_blocks():
    WeightPolicy(placement="offload", resident_blocks=0).validate()
    WeightPolicy(placement="offload").validate()
    for bad in (WeightPolicy(resident_blocks=3), WeightPolicy(placement="offload", resident_blocks=-1),
                WeightPolicy(placement="offload", resident_blocks=True)):
        with pytest.raises(ValueError, match="resident_blocks"):
            bad.validate()


@pytest.mark.parametrize("text,want", [("all", ("resident", None)), ("", ("resident", None)),
                                       ("auto", ("offload", None)), (" AUTO ", ("offload", None)),
                                       ("0", ("offload", 0)), ("12", ("offload", 12)), (7, ("offload", 7))])
def test_resident_blocks_option(text, want):
    assert parse_resident_blocks(text) == want


@pytest.mark.parametrize("text", ["-1", "some", "1.5", "all of them"])
def test_resident_blocks_option_refused(text):
    with pytest.raises(ValueError, match="resident_blocks must be 'all', 'auto' or a number"):
        parse_resident_blocks(text)


def test_loader_widget_appended_with_its_choices(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes import loader

    spec = loader.H3ModelLoader.INPUT_TYPES()
    # appended after the widgets that came before it (later ones go after it): saved workflows keep their order
    assert list(spec["optional"])[:3] == ["adaln_cache", "weights", "resident_blocks"]
    choices, opts = spec["optional"]["resident_blocks"]  # a list: ComfyUI refuses other values at queue time
    assert choices[:3] == ["all", "auto", "0"] and choices[-1] == "50" and opts["default"] == "all"
    assert "auto" in opts["tooltip"]
    assert all(parse_resident_blocks(choice) for choice in choices)
    monkeypatch.setattr(loader, "ensure_tiny_model", lambda: tiny_h3_dir)
    (default,) = loader.H3ModelLoader().load(loader.TINY_NAME, "cpu", "float32", "sdpa")
    (auto,) = loader.H3ModelLoader().load(loader.TINY_NAME, "cpu", "float32", "sdpa", resident_blocks="auto")
    (fixed,) = loader.H3ModelLoader().load(loader.TINY_NAME, "cpu", "float32", "sdpa", resident_blocks="20")
    assert default.config.weights.placement == "resident" and default.config.weights.resident_blocks is None
    assert (auto.config.weights.placement, auto.config.weights.resident_blocks) == ("offload", None)
    assert (fixed.config.weights.placement, fixed.config.weights.resident_blocks) == ("offload", 20)


@pytest.mark.parametrize("flag,want", [([], ("resident", None)), (["--resident-blocks", "auto"], ("offload", None)),
                                       (["--resident-blocks", "0"], ("offload", 0))])
def test_cli_resident_blocks_reaches_the_engine_config(monkeypatch, flag, want):
    from cli_engine_configs import engine_configs_for

    configs = engine_configs_for(monkeypatch, flag, _request())
    assert len(configs) == 3 and all((c.weights.placement, c.weights.resident_blocks) == want for c in configs)


def test_cli_refuses_a_bad_resident_blocks(capsys):
    from comfyui_h3.cli import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["generate", "--prompt", "x", "--resident-blocks", "many"])
    assert "resident_blocks must be 'all', 'auto' or a number" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_script_runs_tiny_on_the_cpu():
    """bench/block_offload.py's --tiny path (the GPU run's code on a tiny model): it finishes, the streamed forward
    equals the resident one bit for bit, and its overlap arithmetic passes its own check."""
    import json
    import os
    import subprocess
    import sys

    script = REPO / "bench" / "block_offload.py"
    done = subprocess.run([sys.executable, str(script), "--tiny", "--no-compile"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    phases = {line["phase"]: line for line in lines}
    assert list(phases) == ["self_test", "setup", "resident", "attach", "offload", "profile", "memory", "summary"]
    assert phases["summary"]["bitwise_equal"] is True and phases["attach"]["streamed_blocks"] == 5
