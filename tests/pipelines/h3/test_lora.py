"""LoRA for H3 (models/lora.py): files written in every layout (models/lora_write.py) from known factors merge into
the tiny DiT as the float64 merge computed here; strength 0 is no LoRA; LoRAs stack; every weight policy sees the
merged weights; bad files are refused before any step, naming the file and its first bad keys."""

import math
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.models.checkpoint import CheckpointError, meta_shapes
from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig, load_h3_transformer
from comfyui_h3.backend.models.lora import lora_choice, parse_lora_arg, read_lora
from comfyui_h3.backend.models.lora_write import LAYOUTS, write_lora
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy
from tiny_dit import config_inputs, folder_state

RANK = 3


def base_state(tiny_h3_dir) -> dict:
    return folder_state(tiny_h3_dir / "transformer")


@pytest.fixture(scope="module")
def shapes(tiny_h3_dir):
    cfg = H3TransformerConfig.from_json(tiny_h3_dir / "transformer" / "config.json")
    return meta_shapes(lambda: H3Transformer(cfg))


def lora_parts(shapes, seed, blocks=(0, 1)):
    """Known factors on every block's q / k / v / out / SwiGLU in / out / adaln_proj and a refiner projection, one
    alpha per module (q, k, v share theirs), and a weight and a bias diff."""
    gen = torch.Generator().manual_seed(seed)
    modules = [f"transformer_blocks.{i}.{m}" for i in blocks for m in
               ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2",
                "adaln_proj.linear")] + ["token_refiner.refiner_blocks.0.attn.to_q",
                                         "token_refiner.refiner_blocks.0.attn.to_k",
                                         "token_refiner.refiner_blocks.0.attn.to_v"]
    factors, alphas = {}, {}
    for m in modules:
        out, inp = shapes[m + ".weight"]
        factors[m] = (torch.randn(RANK, inp, generator=gen) * 0.2, torch.randn(out, RANK, generator=gen) * 0.2)
        alphas[m] = 1.5 if ".attn.to_" in m and m[-1] in "qkv" else 2.0 + (len(m) % 3)
    diffs = {k: torch.randn(shapes[k], generator=gen) * 0.05
             for k in ("transformer_blocks.1.norm1.weight", "transformer_blocks.1.adaln_proj.linear.bias")}
    return factors, alphas, diffs


def merged64(base, factors, alphas, diffs, strength=1.0, adaln_strength=None):
    """The merge, written out here in float64: W + s * alpha / r * B @ A (+ s * diff)."""
    out = {k: v.double() for k, v in base.items()}
    for m, (a, b) in factors.items():
        s = adaln_strength if adaln_strength is not None and ".adaln_proj." in m else strength
        scale = alphas[m] / a.shape[0] if alphas else 1.0
        out[m + ".weight"] += s * scale * (b.double() @ a.double())
    for k, d in diffs.items():
        s = adaln_strength if adaln_strength is not None and ".adaln_proj." in k else strength
        out[k] += s * d.double()
    return out


def load_reference(tiny_h3_dir, state64, **kw):
    """The tiny DiT with `state64` cast to float32 (fused and stored as a loaded model is)."""
    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False)
    model.load_state_dict({k: v.float() for k, v in state64.items()}, strict=False)
    model.fuse_projections()
    if kw.get("storage"):
        for block in model.transformer_blocks:
            block.use_fp8_gemms(emulate=True)
    return model


def forward(model):
    with torch.no_grad():
        return model(*config_inputs(model.config))


def peft_alphas(factors):
    return {m: 2.5 for m in factors}  # PEFT states one lora_alpha for the file


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_merges_as_the_float64_merge(tiny_h3_dir, shapes, tmp_path, layout):
    factors, alphas, diffs = lora_parts(shapes, seed=11)
    if layout == "peft":
        alphas = peft_alphas(factors)
    path = write_lora(tmp_path / f"{layout}.safetensors", factors, layout, shapes, alphas, diffs)
    lora = read_lora(path, shapes)
    assert lora.ranks == ([RANK, 3 * RANK] if layout == "native" else [RANK])  # native joins q | k | v
    base = base_state(tiny_h3_dir)
    want_state = merged64(base, factors, alphas, diffs)
    got = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False,
                              loras=[lora_choice(path)])
    state = got.state_dict()
    touched = set(f"{m}.weight" for m in factors) | set(diffs)
    for key, value in want_state.items():
        if key in touched:
            assert torch.allclose(state[key].double(), value, rtol=0, atol=2e-6), key
            assert not torch.equal(state[key], base[key].float()), key
        else:
            assert torch.equal(state[key], base[key].float()), key
    got.fuse_projections()
    ref = load_reference(tiny_h3_dir, want_state)
    for g, w in zip(forward(got), forward(ref)):
        assert (g - w).abs().max() <= 1e-6 * max(1.0, w.abs().max().item())
    assert got.loras == [{"file": str(path.resolve()) if hasattr(path, "resolve") else os.path.realpath(path),
                          "sha256": lora_choice(path).sha256, "strength": 1.0, "adaln_strength": 1.0}]


def test_strength_zero_is_no_lora_bitwise_and_loras_stack(tiny_h3_dir, shapes, tmp_path):
    f1, a1, d1 = lora_parts(shapes, seed=1)
    f2, a2, d2 = lora_parts(shapes, seed=2, blocks=(1,))
    p1 = write_lora(tmp_path / "one.safetensors", f1, "kohya", shapes, a1, d1)
    p2 = write_lora(tmp_path / "two.safetensors", f2, "native", shapes, a2, d2)
    plain = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32)
    zero = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32,
                               loras=[lora_choice(p1, 0.0), lora_choice(p2, 0.0, 0.0)])
    for g, w in zip(forward(zero), forward(plain)):
        assert torch.equal(g, w)
    both = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False,
                               loras=[lora_choice(p1, 0.7, 0.25), lora_choice(p2, -0.4)])
    want = merged64(base_state(tiny_h3_dir), f1, a1, d1, 0.7, 0.25)
    want = merged64(want, f2, a2, d2, -0.4)
    state = both.state_dict()
    for key, value in want.items():
        assert torch.allclose(state[key].double(), value, rtol=0, atol=4e-6), key


def test_every_weight_policy_sees_the_merged_weights(tiny_h3_dir, shapes, tmp_path):
    """FP8 (merged before quantising), the AdaLN table cache (tables from the merged projections), streamed
    blocks: each equals its own no-LoRA path on the float64-merged weights."""
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    factors, alphas, diffs = lora_parts(shapes, seed=5)
    path = write_lora(tmp_path / "lora.safetensors", factors, "diffusers", shapes, alphas, diffs)
    # FP8: the LoRA merged before quantising = the no-LoRA FP8 path given the merged (float32) weights, bitwise
    merged = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False,
                                 loras=[lora_choice(path)]).state_dict()
    fp8 = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, storage="fp8_emulated",
                              loras=[lora_choice(path)])
    ref = load_reference(tiny_h3_dir, merged, storage="fp8")
    for g, w in zip(forward(fp8), forward(ref)):
        assert torch.equal(g, w)
    # whole pipelines: the merged folder (the same weights written as a model) against the LoRA engine
    merged_dir = tmp_path / "merged"
    import shutil

    shutil.copytree(tiny_h3_dir, merged_dir)
    for name in os.listdir(merged_dir / "transformer"):
        if name.endswith(".safetensors"):
            part = load_file(str(merged_dir / "transformer" / name))
            save_file({k: merged[k] for k in part}, str(merged_dir / "transformer" / name))
    req = H3Request(prompt="surf", num_frames=124, steps=2, seed=3, width=64, height=64, decode=False)
    for policy in (H3WeightPolicy(adaln="cache"), H3WeightPolicy(placement="offload", resident_blocks=1)):
        got = h3_config(str(tiny_h3_dir), dtype="float32", weights=policy,
                        loras=[(path, 1.0)]).build_pipeline(0).run(req)
        want = h3_config(str(merged_dir), dtype="float32", weights=policy).build_pipeline(0).run(req)
        for g, w in ((got.video_latents, want.video_latents), (got.audio_latents, want.audio_latents)):
            assert (g - w).abs().max() <= 1e-5 * max(1.0, w.abs().max().item()), policy


@pytest.mark.slow
def test_two_gloo_ranks_with_a_lora_equal_one_rank(tiny_h3_dir, shapes, tmp_path):
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    factors, alphas, diffs = lora_parts(shapes, seed=8)
    path = write_lora(tmp_path / "lora.safetensors", factors, "native", shapes, alphas, diffs)
    req = H3Request(prompt="surf", num_frames=124, steps=2, seed=3, width=64, height=64, decode=False)
    want = h3_config(str(tiny_h3_dir), dtype="float32", loras=[(path, 0.8)]).build_pipeline(0).run(req)
    eng = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1, loras=[(path, 0.8)]))
    try:
        got = eng.generate(req)
    finally:
        eng.shutdown()
    assert got.manifest["engine"]["loras"][0]["strength"] == 0.8
    for g, w in ((got.video_latents, want.video_latents), (got.audio_latents, want.audio_latents)):
        assert (g - w).abs().max() <= 1e-5 * max(1.0, w.abs().max().item())


# -- refusals ---------------------------------------------------------------------------------------------------------

def _good(shapes, tmp_path, name="good"):
    factors, alphas, diffs = lora_parts(shapes, seed=3)
    return write_lora(tmp_path / f"{name}.safetensors", factors, "diffusers", shapes, alphas, diffs)


def test_other_models_and_bad_files_are_refused_naming_the_file(tiny_h3_dir, shapes, tmp_path):
    r = torch.randn
    cases = {
        "wan": ({"diffusion_model.blocks.0.self_attn.q.lora_A.weight": r(4, 40),
                 "diffusion_model.blocks.0.self_attn.q.lora_B.weight": r(40, 4)}, "Wan LoRA"),
        "seedvr2": ({"blocks.0.mmattn.proj_qkv.vid.lora_A.weight": r(4, 40),
                     "blocks.0.mmattn.proj_qkv.vid.lora_B.weight": r(40, 4)}, "SeedVR2 LoRA"),
        "ranks": ({"transformer_blocks.0.attn.to_q.lora_A.weight": r(4, shapes["transformer_blocks.0.attn.to_q.weight"][1]),
                   "transformer_blocks.0.attn.to_q.lora_B.weight": r(shapes["transformer_blocks.0.attn.to_q.weight"][0], 5)},
                  "does not fit"),
        "half": ({"transformer_blocks.0.attn.to_q.lora_A.weight": r(4, 8)}, "other half"),
        "loha": ({"lora_unet_blocks_0_attn_qkv_proj.hada_w1_a": r(4, 8)}, "LyCORIS"),
        "stranger": ({"transformer_blocks.0.attn.to_q.weight": r(4, 8)}, "no LoRA part"),
        "assigns": ({"transformer_blocks.0.attn.to_q.set_weight": r(*shapes["transformer_blocks.0.attn.to_q.weight"])},
                    "FastH3's adapter form"),  # FastH3's own file given as a LoRA
    }
    for name, (tensors, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        with pytest.raises(CheckpointError, match=message) as err:
            read_lora(path, shapes)
        assert str(path) in str(err.value), name
    # a truncated file: refused when chosen for a config
    good = _good(shapes, tmp_path)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(open(good, "rb").read()[:-100])
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        h3_config(str(tiny_h3_dir), dtype="float32", loras=[(cut, 1.0)]).validate()
    with pytest.raises(CheckpointError, match="safetensors only"):
        lora_choice(tmp_path / "x.pt")
    with pytest.raises(ValueError, match="finite"):
        lora_choice(good, float("nan"))


def test_nan_factors_are_refused_before_any_weight_changes(tiny_h3_dir, shapes, tmp_path):
    good = _good(shapes, tmp_path)
    tensors = load_file(good)
    key = sorted(k for k in tensors if k.endswith("lora_B.weight"))[-1]
    tensors[key][0, 0] = math.nan
    bad = tmp_path / "nan.safetensors"
    save_file(tensors, str(bad))
    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from comfyui_h3.backend.models.lora_apply import apply_loras

    with pytest.raises(CheckpointError, match="NaN") as err:
        apply_loras(model, [lora_choice(good), lora_choice(bad)])
    assert "nan.safetensors" in str(err.value) and key in str(err.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_file_changed_after_it_was_chosen_is_refused(tiny_h3_dir, shapes, tmp_path):
    from comfyui_h3.backend.models.lora_apply import apply_loras

    good = _good(shapes, tmp_path)
    choice = lora_choice(good)
    tensors = load_file(good)
    tensors[next(iter(tensors))] *= 2
    os.remove(good)
    save_file(tensors, good)
    model = load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, fuse=False)
    with pytest.raises(CheckpointError, match="changed since"):
        apply_loras(model, [choice])


def test_write_lora_never_replaces_a_file(shapes, tmp_path):
    factors, alphas, diffs = lora_parts(shapes, seed=4)
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        write_lora(path, factors, "kohya", shapes, alphas, diffs)
    assert path.read_bytes() == b"mine"


@pytest.mark.parametrize("text, want", [("a.safetensors", ("a.safetensors", 1.0)),
                                        ("a.safetensors:0.5", ("a.safetensors", 0.5)),
                                        ("C:/x/a.safetensors:-1", ("C:/x/a.safetensors", -1.0)),
                                        ("C:/x/a.safetensors", ("C:/x/a.safetensors", 1.0))])
def test_cli_lora_argument(text, want):
    assert parse_lora_arg(text) == want


# -- the node and the CLI ---------------------------------------------------------------------------------------------

def test_lora_node_lists_chains_and_refuses(tiny_h3_dir, shapes, tmp_path, monkeypatch):
    from comfyui_h3.comfy_services.errors import UnsafePathError
    from comfyui_h3.nodes import loader, lora as lora_node

    root = tmp_path / "loras"
    (root / "styles").mkdir(parents=True)
    factors, alphas, diffs = lora_parts(shapes, seed=6)
    write_lora(root / "styles" / "ink.safetensors", factors, "kohya", shapes, alphas, diffs)
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_A.weight": torch.ones(2, 4),
               "diffusion_model.blocks.0.self_attn.q.lora_B.weight": torch.ones(4, 2)}, str(root / "wan.safetensors"))
    monkeypatch.setenv("COMFYUI_H3_LORAS", str(root))
    monkeypatch.setattr(loader, "ensure_tiny_model", lambda: tiny_h3_dir)
    spec = lora_node.H3LoRA.INPUT_TYPES()
    names = spec["required"]["lora_name"][0]
    assert names == [lora_node.TINY_LORA_NAME, lora_node.TINY_TURBO_LORA_NAME, "styles/ink.safetensors",
                     "wan.safetensors"]
    assert all(opts.get("tooltip") for _, opts in list(spec["required"].values()) + list(spec["optional"].values()))
    base = loader.H3ModelLoader().load(loader.TINY_NAME, "cpu", "float32", "sdpa")[0]
    one = lora_node.H3LoRA().apply(base, "styles/ink.safetensors", 0.6)[0]
    two = lora_node.H3LoRA().apply(one, "styles/ink.safetensors", -0.2, 0.5)[0]
    assert base.config.options.loras == ()
    assert [(c.strength, c.adaln_strength) for c in two.config.options.loras] == [(0.6, None), (-0.2, -0.1)]
    assert two.config.options.loras[0].path == str((root / "styles" / "ink.safetensors").resolve())
    assert one.config != base.config and one.config != two.config  # each is its own engine
    with pytest.raises(CheckpointError, match="Wan LoRA"):
        lora_node.H3LoRA().apply(base, "wan.safetensors", 1.0)
    with pytest.raises(UnsafePathError):
        lora_node.H3LoRA().apply(base, "../loras/styles/ink.safetensors", 1.0)
    with pytest.raises(ValueError, match="H3 engine"):
        lora_node.H3LoRA().apply(object(), "styles/ink.safetensors", 1.0)


def test_tiny_lora_is_built_once_and_fits_the_tiny_model(tiny_h3_dir, shapes, tmp_path):
    from comfyui_h3.tiny_model import ensure_tiny_lora

    target = tmp_path / "cache" / "tiny.safetensors"
    first = ensure_tiny_lora(target)
    stamp = first.stat().st_mtime_ns
    assert ensure_tiny_lora(target).stat().st_mtime_ns == stamp
    assert len(read_lora(first, shapes).edits) == 2 * 7  # every block's seven projections


def test_cli_lora_flags_reach_the_engine_config(monkeypatch, tmp_path, shapes):
    from comfyui_h3 import cli_generate
    from comfyui_h3.cli import _parser

    factors, alphas, diffs = lora_parts(shapes, seed=9)
    path = write_lora(tmp_path / "a.safetensors", factors, "peft", shapes, peft_alphas(factors), diffs)
    monkeypatch.setattr("comfyui_h3.tiny_model.ensure_tiny_lora", lambda turbo=False: tmp_path / "tiny.safetensors")
    args = _parser().parse_args(["generate", "--model", "tiny", "--prompt", "x", "--lora", f"{path}:0.3",
                                 "--lora", "tiny"])
    assert cli_generate.lora_choices(args) == [(str(path), 0.3), (str(tmp_path / "tiny.safetensors"), 1.0)]
    for command in ("edit", "extend"):  # their engines are built by the same helper (cli_generate.run_job)
        help_text = _parser()._subparsers._group_actions[0].choices[command].format_help()
        assert "--lora FILE[:STRENGTH]" in help_text, command


@pytest.mark.slow
def test_cli_generate_with_a_lora_records_it_in_the_manifest(tmp_path, shapes):
    import json

    from comfyui_h3.cli import main

    factors, alphas, diffs = lora_parts(shapes, seed=10)
    path = write_lora(tmp_path / "a.safetensors", factors, "native", shapes, alphas, diffs)
    out = tmp_path / "out.mp4"
    assert main(["generate", "--model", "tiny", "--prompt", "surf", "--frames", "124", "--steps", "1", "--width",
                 "64", "--height", "64", "--lora", f"{path}:0.3", "--manifest", "--out", str(out)]) == 0
    manifest = json.loads(next(tmp_path.glob("out*.json")).read_text())
    assert manifest["engine"]["loras"] == [lora_choice(path, 0.3).record()]
