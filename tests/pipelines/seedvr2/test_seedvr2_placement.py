"""SeedVR2 on GPUs smaller than the model (issue 31): the shared weight policy's offload placement (DiT blocks
streamed, the VAE moved for its stages), FP8 GEMM weights, automatic VAE tiles, and the memory check that counts
them. On the CPU with the package's tiny files: the streamer runs the same state machine with plain copies, so a
streamed run must equal the resident one bit for bit; the device budgets are simulated (the activation estimates
themselves are calibrated on an H200, docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.models.fp8_linear import FP8, Fp8Linear
from comfyui_h3.backend.models.seedvr2.dit_config import DiTConfig
from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
from comfyui_h3.backend.pipelines.seedvr2 import memory
from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config, seedvr2_engine_config
from comfyui_h3.backend.pipelines.seedvr2.placement import SeedVR2Placement
from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest
from comfyui_h3.backend.runtime import WeightPolicy

GIB = 1024**3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {v: make_tiny_seedvr2(root / v, v, seed=4) for v in ("3b", "7b")}


def _files(folder, variant="3b"):
    return folder / DIT_FILE.format(variant=variant), folder / VAE_FILE, folder / TEXT_FILE


def _pipe(folder, variant="3b", policy=None, dtype="float32"):
    config = seedvr2_config(*_files(folder, variant), dtype=dtype, vae_dtype="float32",
                            weights=policy or WeightPolicy())
    config.validate()
    return config.build_pipeline(0)


def _video(frames=9, h=24, w=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (frames, h, w, 3), generator=g, dtype=torch.uint8)


# ---- streamed blocks equal resident ones ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["3b", "7b"])
def test_streamed_blocks_equal_the_resident_run_bit_for_bit(tiny, variant):
    video = _video(13, 24, 40)
    request = dict(scale=2.0, batch_frames=9, overlap=4, seed=5)
    resident = _pipe(tiny[variant], variant).run(UpscaleRequest(video, **request))
    layers = DiTConfig.tiny(variant).layers
    for blocks in (0, 1, layers - 1, None):  # all streamed, one resident, all but one, auto
        pipe = _pipe(tiny[variant], variant, WeightPolicy(placement="offload", resident_blocks=blocks))
        assert pipe.c.dit.block_offload is not None and pipe.c.placement is not None
        streamed = pipe.run(UpscaleRequest(video, **request))
        assert torch.equal(streamed.frames, resident.frames), blocks
        plan = streamed.manifest["engine"]["placement"]
        want = layers if blocks is None else blocks  # auto on the CPU: nothing limits it
        assert plan["resident_blocks"] == want and plan["streamed_blocks"] == layers - want
        assert plan["mode"] == ("auto" if blocks is None else "fixed")


def test_the_blocks_live_on_the_host_and_visit_the_device_only_while_they_run(tiny):
    pipe = _pipe(tiny["3b"], policy=WeightPolicy(placement="offload", resident_blocks=0))
    streamer = pipe.c.dit.block_offload
    seen = []
    for i, block in enumerate(pipe.c.dit.blocks):
        weight = next(block.parameters())
        home = streamer.homes[i].buffer
        seen.append(weight.data_ptr() >= home.data_ptr() and weight.data_ptr() < home.data_ptr() + home.numel())
    assert all(seen)  # between runs every block's weights point into its host home
    pipe.run(UpscaleRequest(_video(5, 16, 16), scale=1.0))
    assert streamer.device_bytes() == streamer.device_bytes_for(0)  # the two slots, no resident block


# ---- the placement's choices under a simulated device ---------------------------------------------------------------

class _Device:
    """A simulated device of `total` bytes: free = total - what the placement holds there - `other`."""

    def __init__(self, total: int, other: int = 0):
        self.total, self.other = total, other
        self.placement = None

    def free(self) -> int:
        held = self.placement.dit.device_bytes() + (self.placement.vae.nbytes if self.placement.vae.on_device else 0)
        return self.total - held - self.other


def _placement(tiny, total, resident=None):
    from comfyui_h3.backend.models.seedvr2.checkpoints import load_dit, load_vae

    dit_path, vae_path, _ = _files(tiny["3b"])
    dit, vae = load_dit(dit_path, "cpu", torch.float32), load_vae(vae_path, "cpu", torch.float32)
    device = _Device(total)
    placement = SeedVR2Placement(dit, vae, "cpu", resident, free_bytes=device.free)
    device.placement = placement
    return placement, device


def test_auto_keeps_as_many_blocks_as_fit_beside_the_activation(tiny):
    probe, _ = _placement(tiny, 1 << 40)
    block, vae = probe.dit.block_bytes, probe.vae.nbytes
    activation = 10 * block
    # room for the VAE, the activation and one resident block with the streaming slots (the tiny DiT's 4 blocks:
    # 3 resident need one slot only, yet still more bytes than this)
    one = probe.dit.device_bytes_for(1)
    assert all(probe.dit.device_bytes_for(k) > one for k in (2, 3, 4))
    placement, device = _placement(tiny, vae + activation + one + 64)
    placement.plan_request(activation, 0)
    placement.enter_vae()  # a batch's encode
    plan = placement.enter_dit()
    assert plan["resident_blocks"] == 1 and plan["vae_on_device"] is True  # the DiT fits beside the VAE
    assert device.free() >= activation
    # a device where the DiT's minimum (2 slots + activation) does not fit beside the VAE: the VAE goes to the host
    assert vae < activation  # the VAE's own stage fits on this device, only not beside the DiT's minimum
    placement, device = _placement(tiny, activation + 2 * block + 64)
    placement.plan_request(activation, 0)
    placement.enter_vae()
    assert placement.vae.on_device
    plan = placement.enter_dit()
    assert plan["resident_blocks"] == 0 and not placement.vae.on_device and placement.moves["vae_out"] == 1
    assert device.free() >= activation


def test_a_vae_stage_takes_back_the_room_auto_gave_the_dit_while_the_vae_stayed(tiny):
    """A batch's decode after a DiT stage whose auto resident blocks filled the room beside a small DiT activation
    (the VAE stayed on the device through it): the decode's larger activation gets that room back (the capped H100
    run that ran out of memory in its decode tiles before this)."""
    probe, _ = _placement(tiny, 1 << 40)
    block, vae = probe.dit.block_bytes, probe.vae.nbytes
    dit_act, vae_act = 2 * block, 6 * block
    total = vae + vae_act + probe.dit.device_bytes_for(0) + 64  # the check's room: the larger stage
    placement, device = _placement(tiny, total)
    placement.plan_request(dit_act, vae_act)
    placement.enter_vae()  # encode
    assert device.free() >= vae_act
    plan = placement.enter_dit()
    assert plan["resident_blocks"] >= 1 and placement.vae.on_device  # auto used the room the DiT had spare
    assert device.free() >= dit_act
    placement.enter_vae()  # decode: the VAE is on the device already, its room is not
    assert device.free() >= vae_act and placement.moves["dit_offloads"] == 1


def test_a_fixed_count_is_kept_whatever_the_memory(tiny):
    placement, _ = _placement(tiny, 1 << 40, resident=2)
    placement.plan_request(1, 1)
    assert placement.enter_dit()["resident_blocks"] == 2
    assert placement.stage_weights() == (placement.dit.device_bytes_for(2), placement.vae.nbytes)


def test_an_accepted_request_stays_inside_its_simulated_budget(tiny):
    """What the memory check counts for the offload placement (the stages' weights beside their activations) is
    what the placement then holds: at every stage the weights on the device plus the stage's estimate fit the
    budget the check was given."""
    probe, _ = _placement(tiny, 1 << 40)
    pipe = _pipe(tiny["3b"])
    dit_config, scale = pipe.c.config, memory.vae_scale(pipe.c.vae.config)
    args = (256, 256, 64, 64, 4, 4)
    activation = memory.batch_memory(dit_config, 9, *args, vae_scale=scale)
    vae_stage = max(activation.encode, activation.decode)
    total = int((activation.dit + probe.dit.device_bytes_for(0) + vae_stage + probe.vae.nbytes) / memory.HEADROOM)
    placement, device = _placement(tiny, total)
    weights = placement.stage_weights()
    batch = memory.check_fits(dit_config, 0, 41, *args, total, vae_scale=scale, dit_weights=weights[0],
                              vae_weights=weights[1])
    need = memory.batch_memory(dit_config, batch, *args, vae_scale=scale)
    placement.plan_request(need.dit, max(need.encode, need.decode))
    for _ in range(3):  # batches: encode, DiT, decode
        placement.enter_vae()
        assert device.total - device.free() + max(need.encode, need.decode) <= total
        placement.enter_dit()
        assert device.total - device.free() + need.dit <= total
        placement.enter_vae()
        assert device.total - device.free() + max(need.encode, need.decode) <= total


# ---- automatic VAE tiles ------------------------------------------------------------------------------------------

def _released():
    return DiTConfig.released("3b")


def test_whole_frames_when_they_fit_tiles_chosen_apart_when_they_do_not():
    size = (1088, 1920, 768, 1344)
    whole = memory.plan_memory(_released(), 21, 241, *size, 2, 2, 200 * GIB)
    assert (whole.batch, whole.vae_tiles, whole.auto_tiles) == (21, (0, 0), False)
    budget = 24 * GIB
    with pytest.raises(RequestError):  # the strict check alone refuses whole frames here
        memory.check_fits(_released(), 21, 241, *size, 2, 2, budget)
    plan = memory.plan_memory(_released(), 21, 241, *size, 2, 2, budget)
    encode, decode = plan.vae_tiles
    assert plan.batch == 21 and plan.auto_tiles and encode >= decode >= memory.MIN_VAE_TILE
    usable = budget * memory.HEADROOM
    assert memory.batch_memory(_released(), 21, *size, 2, 2, 1, plan.vae_tiles).peak <= usable
    bigger = memory.batch_memory(_released(), 21, *size, 2, 2, 1, (encode + memory.VAE_TILE_STEP, decode))
    assert bigger.encode > usable or encode + memory.VAE_TILE_STEP >= 1920
    bigger = memory.batch_memory(_released(), 21, *size, 2, 2, 1, (encode, decode + memory.VAE_TILE_STEP))
    assert bigger.decode > usable
    auto = memory.plan_memory(_released(), 0, 241, *size, 2, 2, budget)  # auto batch: the largest the DiT fits
    assert auto.auto_tiles and auto.batch >= 21
    assert memory.batch_memory(_released(), auto.batch, *size, 2, 2, 1, auto.vae_tiles).peak <= usable
    assert memory.batch_memory(_released(), auto.batch + 4, *size, 2, 2).dit > usable
    # an asked tile is checked as it is, several ranks never tile, and nothing fits: the strict check's message
    assert memory.plan_memory(_released(), 21, 241, *size, 2, 2, budget, 1, 512).vae_tiles == (512, 512)
    with pytest.raises(RequestError, match="more GPUs do not help the VAE"):
        memory.plan_memory(_released(), 21, 241, *size, 2, 2, budget, 2)
    with pytest.raises(RequestError, match="needs"):
        memory.plan_memory(_released(), 21, 241, *size, 2, 2, 2 * GIB)
    with pytest.raises(RequestError):
        memory.plan_memory(_released(), 21, 241, *size, 2, 2, budget, auto_tiles=False)


def test_the_stage_weights_shrink_what_fits():
    size = (768, 1344, 384, 672)
    free = int(memory.batch_memory(_released(), 45, *size, 2, 2).peak / memory.HEADROOM) + 1
    plain = memory.largest_batch(_released(), 241, *size, 2, 2, free)
    offload = memory.largest_batch(_released(), 241, *size, 2, 2, free, dit_weights=GIB // 8,
                                   vae_weights=GIB // 8)
    assert plain == 45 and 0 < offload < plain


def test_the_pipeline_runs_the_tiles_it_chose_and_the_manifest_names_them(tiny, monkeypatch):
    from comfyui_h3.backend.pipelines.seedvr2 import pipeline as module
    from comfyui_h3.backend.pipelines.seedvr2.restore import batch_generator, restore_batch

    pipe = _pipe(tiny["3b"])
    video = _video(5, 36, 48)
    chosen = memory.MemoryPlan(5, (160, 128), auto_tiles=True)
    monkeypatch.setattr(module, "plan_memory", lambda *a, **k: chosen)
    res = pipe.run(UpscaleRequest(video, scale=4.0, seed=2))  # 144x192 out: both tiles cut the frame
    assert res.manifest["request"]["shapes"]["vae_tiles"] == {"encode": 160, "decode": 128, "chosen": "auto",
                                                              "stats": "frame"}
    geometry, _, _ = pipe.plan(UpscaleRequest(video, scale=4.0, seed=2))
    direct = restore_batch(pipe.c, video, geometry, "wavelet", batch_generator(2, 0), pipe.parallel,
                           vae_tile=(160, 128))
    assert torch.equal(res.frames, direct)
    whole = restore_batch(pipe.c, video, geometry, "wavelet", batch_generator(2, 0), pipe.parallel)
    assert not torch.equal(direct, whole)  # the tiles did run (close to, not equal to, whole frames)
    assert (direct.float() - whole.float()).abs().mean() < 8
    assert memory.split_tiles(128) == (128, 128) and memory.split_tiles((160, 0)) == (160, 0)


# ---- FP8 ---------------------------------------------------------------------------------------------------------

def test_fp8_linear_with_a_bias_is_the_bf16_linear_of_its_dequantised_weight():
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=g) * 0.05)
        linear.bias.copy_(torch.randn(48, generator=g))
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    fp8 = Fp8Linear.from_linear(linear, emulate=True)
    assert fp8.weight.dtype == FP8 and fp8.bias.dtype == torch.bfloat16
    out = fp8(x)
    bare = Fp8Linear(fp8.weight, fp8.weight_scale, emulate=True)(x)
    assert torch.equal(out, bare + linear.bias)  # the bias is added to the bf16 product, as a bf16 Linear does
    ref = linear(x).float()
    assert (out.float() - ref).norm() / ref.norm() < 0.05
    with pytest.raises(ValueError, match="bias"):
        Fp8Linear(fp8.weight, fp8.weight_scale, True, torch.zeros(3))


def test_an_fp8_weight_is_taken_as_it_is_with_scale_one():
    codes = (torch.randn(32, 16) * 0.1).to(FP8)
    layer = Fp8Linear.from_weight(codes, emulate=True)
    assert torch.equal(layer.weight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(layer.weight_scale, torch.ones(32))


@pytest.mark.parametrize("variant", ["3b", "7b"])
def test_fp8_dit_is_close_to_bf16_and_streams_bit_for_bit(tiny, variant):
    video = _video(9, 24, 40)
    request = dict(scale=2.0, seed=1)
    bf16 = _pipe(tiny[variant], variant, dtype="bfloat16").run(UpscaleRequest(video, **request))
    pipe = _pipe(tiny[variant], variant, WeightPolicy(storage="fp8_emulated"), dtype="bfloat16")
    gemms = [m for m in pipe.c.dit.blocks.modules() if isinstance(m, Fp8Linear)]
    assert gemms and not any(isinstance(m, torch.nn.Linear) for m in pipe.c.dit.blocks.modules())
    fp8 = pipe.run(UpscaleRequest(video, **request))
    diff = (fp8.frames.float() - bf16.frames.float()).abs()
    assert 0 < diff.mean() < 6, diff.mean()  # the tiny random model; trained-weight quality is not measured here
    streamed = _pipe(tiny[variant], variant, WeightPolicy(storage="fp8_emulated", placement="offload",
                                                          resident_blocks=1), dtype="bfloat16")
    assert torch.equal(streamed.run(UpscaleRequest(video, **request)).frames, fp8.frames)


def test_a_released_fp8_file_keeps_its_codes_under_fp8_storage(tiny, tmp_path):
    from comfyui_h3.backend.models.seedvr2.checkpoints import GEMM_WEIGHT, load_dit

    dit_path, vae_path, text_path = _files(tiny["3b"])
    state = load_file(str(dit_path))
    fp8_state = {k: v.to(FP8) if v.is_floating_point() and not k.endswith(".rope.rope.freqs") else v
                 for k, v in state.items()}
    path = tmp_path / "seedvr2_ema_3b_fp8_e4m3fn.safetensors"
    save_file(fp8_state, str(path))
    dit = load_dit(path, "cpu", torch.bfloat16, keep_fp8=True)
    key = next(k for k in fp8_state if GEMM_WEIGHT.match(k))
    owner, name = dit.get_submodule(key.rsplit(".", 2)[0]), key.rsplit(".", 2)[1]
    assert getattr(owner, name).weight.dtype == FP8
    assert dit.vid_in.proj.weight.dtype == torch.bfloat16  # everything else is cast up
    for block in dit.blocks:
        block.use_fp8_gemms(emulate=True)
    layer = getattr(owner, name)
    assert torch.equal(layer.weight.view(torch.uint8), fp8_state[key].view(torch.uint8))
    assert torch.equal(layer.weight_scale, torch.ones_like(layer.weight_scale))
    cast = load_dit(path, "cpu", torch.bfloat16)  # bf16 storage: cast up, as before
    assert cast.get_submodule(key.rsplit(".", 1)[0]).weight.dtype == torch.bfloat16
    config = seedvr2_config(path, vae_path, text_path, weights=WeightPolicy(storage="fp8_emulated"))
    config.validate()
    assert config.family_impl().memory_bytes(config) < seedvr2_config(path, vae_path, text_path).family_impl() \
        .memory_bytes(seedvr2_config(path, vae_path, text_path))


# ---- the node, the CLI and the engine config ----------------------------------------------------------------------

def test_the_loader_appends_weights_and_resident_blocks(tiny, monkeypatch):
    from comfyui_h3.nodes import seedvr2_loader

    spec = seedvr2_loader.H3SeedVR2Loader.INPUT_TYPES()
    assert list(spec["optional"]) == ["weights", "resident_blocks"]
    choices, opts = spec["optional"]["resident_blocks"]
    assert choices[:3] == ["all", "auto", "0"] and choices[-1] == "36" and opts["default"] == "all"
    assert spec["optional"]["weights"][0] == ["bf16", "fp8"]
    files = tuple(map(str, _files(tiny["3b"])))
    monkeypatch.setattr(seedvr2_loader, "resolve_seedvr2_files", lambda model, vae: files)
    (default,) = seedvr2_loader.H3SeedVR2Loader().load("x", "auto", "auto", "cpu", "float32", "sdpa")
    assert default.config.weights == WeightPolicy()
    (auto,) = seedvr2_loader.H3SeedVR2Loader().load("x", "auto", "auto", "cpu", "float32", "sdpa",
                                                    resident_blocks="auto")
    assert auto.config.weights == WeightPolicy(placement="offload")
    with pytest.raises(ValueError, match="FP8 weights need an NVIDIA GPU"):
        seedvr2_loader.H3SeedVR2Loader().load("x", "auto", "auto", "cpu", "bfloat16", "sdpa", weights="fp8")


def test_the_engine_builder_checks_each_option(tiny):
    files = _files(tiny["3b"])
    config = seedvr2_engine_config(*files, resident_blocks="7")
    assert config.weights == WeightPolicy(placement="offload", resident_blocks=7)
    for bad in ({"resident_blocks": "most"}, {"weights": "int4"}):
        with pytest.raises(RequestError):
            seedvr2_engine_config(*files, **bad)


def test_the_upscale_command_takes_resident_blocks_and_fp8(tiny):
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_upscale import engine_config

    parser = _parser()
    args = parser.parse_args(["upscale", "--video", "x.mp4", "--out", "y.mp4", "--resident-blocks", "auto",
                              "--device", "cpu"])
    config = engine_config(args, lambda: tuple(map(str, _files(tiny["3b"]))))
    assert config.weights == WeightPolicy(placement="offload")
    args = parser.parse_args(["upscale", "--video", "x.mp4", "--out", "y.mp4", "--fp8", "--device", "cpu"])
    with pytest.raises(ValueError, match="FP8 weights need an NVIDIA GPU"):
        engine_config(args, lambda: tuple(map(str, _files(tiny["3b"]))))
    with pytest.raises(SystemExit):
        parser.parse_args(["upscale", "--video", "x.mp4", "--out", "y.mp4", "--resident-blocks", "many"])


def test_free_device_memory_honours_a_per_process_cap(monkeypatch):
    """A process capped with set_per_process_memory_fraction (a shared GPU, or the capped benches) plans from the cap
    it has left, not from the driver's free memory: the allocator refuses past the cap, counting what it reserved."""
    from comfyui_h3.backend.device_memory import cuda_free_bytes

    gib = 2**30
    state = {"fraction": 1.0}
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 4 * gib)
    def fraction(device=None):  # torch's wants an index (ValueError for a bare "cuda")
        if not isinstance(device, int) and torch.device(device).index is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        return state["fraction"]

    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", fraction, raising=False)
    assert cuda_free_bytes("cuda:0") == 100 * gib  # no cap: the driver's figure
    state["fraction"] = 24 / 140
    assert cuda_free_bytes("cuda:0") == 20 * gib  # a 24 GiB cap with 4 GiB reserved
    state["fraction"] = 2 / 140
    assert cuda_free_bytes("cuda:0") == 0  # already past the cap
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert cuda_free_bytes("cuda") == 0  # "cuda" (no index) is the current device: the cap functions want one
