"""ComfyUI's native MiniMax-H3 single files and AV LATENT (issue 17; docs/NATIVE_H3.md).

The native layout is written from the tiny folder with the documented key maps (backend/models/native_write.py) and
read back (native_load.py): every component equals its folder-loaded twin bit for bit, and so does what the engine
makes from them. tests/fixtures/native_h3_layout.json holds the key patterns and shapes of ComfyUI's own native
modules at the released sizes; the maps, applied to our release-size modules on the meta device, must produce
exactly those. The native LATENT round trip is exact, and H3 Extend continues a native latent as it continues the
same latents given as H3_LATENTS."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from repo_paths import FIXTURES
from comfyui_h3.backend.models.checkpoint import CheckpointError
from native_comfy import FakeNestedTensor, nested_tensor_comfy

FIXTURE = FIXTURES / "native_h3_layout.json"
PARTS = {"transformer": "dit.safetensors", "text_encoder": "te.safetensors", "vae": "vae.safetensors",
         "audio_vae": "avae.safetensors"}


@pytest.fixture(scope="module")
def native(tiny_h3_dir, tmp_path_factory):
    """The tiny set's components as ComfyUI native single files."""
    from comfyui_h3.backend.models.native_write import (write_native_audio_vae, write_native_text_encoder,
                                                        write_native_transformer, write_native_vae)
    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    out = tmp_path_factory.mktemp("native")
    write_native_transformer(tiny_h3_dir / "transformer", out / PARTS["transformer"])
    write_native_transformer(tiny_h3_dir / "transformer_ref", out / "dit_ref.safetensors")
    write_native_text_encoder(tiny_h3_dir / "text_encoder", out / PARTS["text_encoder"], TEXT_LAYER)
    write_native_vae(tiny_h3_dir / "vae", out / PARTS["vae"])
    write_native_audio_vae(tiny_h3_dir / "audio_vae", out / PARTS["audio_vae"])
    return out


def _patterns(shapes: dict) -> dict:
    out: dict = {}
    for key, shape in shapes.items():
        pattern = re.sub(r"\.\d+\.", ".N.", re.sub(r"\.\d+\.", ".N.", key))
        entry = out.setdefault(pattern, {})
        entry[json.dumps(list(shape))] = entry.get(json.dumps(list(shape)), 0) + 1
    return {p: sorted([[json.loads(s), c] for s, c in d.items()]) for p, d in out.items()}


def _equal_states(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


# -- the key maps against ComfyUI's own modules ------------------------------------------------------------------------

@pytest.mark.slow
def test_key_maps_make_comfyuis_native_layout_at_the_released_sizes():
    import accelerate
    import diffusers
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig
    from comfyui_h3.backend.models.native_keys import (audio_vae_map, text_encoder_map, transformer_map,
                                                       video_vae_map)
    from comfyui_h3.backend.models.native_load import fold_weight_norm
    from comfyui_h3.backend.pipelines.h3.release_config import AUDIO_VAE, VIDEO_VAE, text_encoder_config
    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    expected = json.loads(FIXTURE.read_text())

    def native_shapes(km, module, extras):
        ours = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        shapes = km.native_shapes(ours)
        shapes.update({k: v for k, v in extras.items() if k in km.extras})
        assert set(km.extras) <= set(extras)
        return shapes

    with torch.device("meta"):
        dit = H3Transformer(H3TransformerConfig())  # the defaults are the release's
        vae = diffusers.AutoencoderKLMiniMaxH3.from_config({k: v for k, v in VIDEO_VAE.items() if k[0] != "_"})
        config = Qwen3VLConfig(**text_encoder_config())
        config.text_config.num_hidden_layers = TEXT_LAYER
        text = Qwen3VLForConditionalGeneration._from_config(config)
    with accelerate.init_empty_weights():
        audio = fold_weight_norm(diffusers.AutoencoderKLMiniMaxH3Audio.from_config(
            {k: v for k, v in AUDIO_VAE.items() if k[0] != "_"}))
    got = {
        "transformer": native_shapes(transformer_map(dit.state_dict()), dit, {"rope.inv_freq": (16,)}),
        "vae": native_shapes(video_vae_map(vae.state_dict(), VIDEO_VAE["decoder_num_attention_heads"]), vae,
                             {"latents_mean": (24,), "latents_std": (24,), "decoder.mask_token": (1, 1, 2048)}),
        "audio_vae": native_shapes(audio_vae_map(audio.state_dict()), audio,
                                   {"latents_mean": (32,), "latents_std": (32,)}),
        "text_encoder": native_shapes(text_encoder_map(text.state_dict(), TEXT_LAYER), text, {}),
    }
    for part, shapes in got.items():
        assert _patterns(shapes) == expected[part], part


def test_links_convert_both_ways_exactly():
    from comfyui_h3.backend.models.native_keys import Link

    q, k, v = (torch.randn(8, 5) for _ in range(3))
    heads = Link("qkv", ("q", "k", "v"), "heads", heads=2)
    fused = heads.to_native([q, k, v])
    # per head h: rows [q_h | k_h | v_h], as the native decoder splits view(heads, 3 * head_dim) in three
    assert torch.equal(fused.view(2, 3, 4, 5)[1, 1], k.view(2, 4, 5)[1])
    assert all(torch.equal(a, b) for a, b in zip(heads.from_native(fused), (q, k, v)))
    swap = Link("fc1", ("proj",), "swap")
    w = torch.randn(6, 3)
    assert torch.equal(swap.to_native([w])[:3], w[3:]) and torch.equal(swap.from_native(swap.to_native([w]))[0], w)


# -- bit for bit against the folder -----------------------------------------------------------------------------------

def test_dit_from_a_native_file_equals_the_folders(native, tiny_h3_dir):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
    from comfyui_h3.backend.models.native_load import load_native_transformer

    for dtype in (None, torch.float32):
        ours = load_h3_transformer(tiny_h3_dir / "transformer", dtype=dtype, fuse=False)
        theirs = load_native_transformer(native / PARTS["transformer"], tiny_h3_dir / "transformer" / "config.json",
                                         dtype=dtype, fuse=False)
        _equal_states(ours, theirs)
        assert ours.config.to_dict() == theirs.config.to_dict()
    # a full checkpoint's "model.diffusion_model." prefix is stripped, as ComfyUI does
    prefixed = native / "prefixed.safetensors"
    save_file({"model.diffusion_model." + k: v for k, v in load_file(native / PARTS["transformer"]).items()},
              prefixed)
    _equal_states(ours, load_native_transformer(prefixed, tiny_h3_dir / "transformer" / "config.json",
                                                dtype=torch.float32, fuse=False))
    # without a folder the file must be the released DiT: the tiny one is named as another model
    with pytest.raises(CheckpointError, match=r"does not match the released MiniMax-H3 DiT .*num_layers 2 \(file\) "
                                              r"vs 50"):
        load_native_transformer(native / PARTS["transformer"], None)


@pytest.mark.slow
def test_text_encoder_and_vaes_from_native_files_equal_the_folders(native, tiny_h3_dir):
    import diffusers

    from comfyui_h3.backend.models.native_load import (fold_weight_norm, load_native_audio_vae,
                                                       load_native_text_encoder, load_native_vae)
    from comfyui_h3.backend.pipelines.h3.components import load_text_encoder
    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    for dtype in (torch.bfloat16, torch.float32):
        _equal_states(load_text_encoder(tiny_h3_dir / "text_encoder", dtype),
                      load_native_text_encoder(native / PARTS["text_encoder"], tiny_h3_dir / "text_encoder", dtype,
                                               TEXT_LAYER))
    folder_vae = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(tiny_h3_dir / "vae", torch_dtype=torch.float32)
    native_vae = load_native_vae(native / PARTS["vae"], tiny_h3_dir / "vae")
    _equal_states(folder_vae, native_vae)
    assert torch.equal(torch.tensor(native_vae.config.latents_std), torch.tensor(folder_vae.config.latents_std))
    folder_audio = diffusers.AutoencoderKLMiniMaxH3Audio.from_pretrained(tiny_h3_dir / "audio_vae",
                                                                          torch_dtype=torch.float32)
    native_audio = load_native_audio_vae(native / PARTS["audio_vae"], tiny_h3_dir / "audio_vae")
    z = torch.randn(2, 32, 6)
    with torch.no_grad():  # the folder's weight norms computed per call == the file's folded weights
        assert torch.equal(folder_audio.decode(z).sample, native_audio.decode(z).sample)
        wave = torch.randn(2, 1, 4000) * 0.1
        assert torch.equal(folder_audio.encode(wave).latent_dist.mode(), native_audio.encode(wave).latent_dist.mode())
    _equal_states(fold_weight_norm(folder_audio), native_audio)


@pytest.mark.slow
def test_the_engine_makes_from_native_files_what_it_makes_from_the_folder(native, tiny_h3_dir):
    """Every component from its file, and mixed (a file for the DiT only): latents, frames and sound equal."""
    from comfyui_h3.backend.pipelines.h3.components import EngineOptions, H3Components
    from comfyui_h3.backend.pipelines.h3.pipeline import H3Pipeline
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    every = tuple(sorted((part, str(native / name)) for part, name in PARTS.items()))
    results = []
    for files in ((), every, (("transformer", str(native / PARTS["transformer"])),)):
        components = H3Components(tiny_h3_dir, EngineOptions(device="cpu", dtype=torch.float32, files=files))
        results.append(H3Pipeline(components).run(H3Request(prompt="a cat", num_frames=124, width=128, height=64,
                                                             steps=2, seed=3)))
    for other in results[1:]:
        assert torch.equal(other.video_latents, results[0].video_latents)
        assert torch.equal(other.audio_latents, results[0].audio_latents)
        assert (other.frames == results[0].frames).all() and torch.equal(other.audio, results[0].audio)


# -- FP8 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["comfy_quant", "scaled", "plain"])
def test_fp8_native_dit_loads_dequantised_per_tensor_and_runs(native, tiny_h3_dir, tmp_path, layout):
    from comfyui_h3.backend.models.native_load import load_native_transformer
    from comfyui_h3.backend.models.native_write import write_native_transformer
    from comfyui_h3.backend.pipelines.h3.components import EngineOptions, H3Components
    from comfyui_h3.backend.pipelines.h3.pipeline import H3Pipeline
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    path = write_native_transformer(tiny_h3_dir / "transformer", tmp_path / "fp8.safetensors", fp8=layout)
    with safe_open(str(path), "pt") as handle:
        stored = {k: handle.get_tensor(k) for k in handle.keys()}
    qkv = stored["blocks.0.attn.qkv_proj.weight"]
    assert qkv.dtype == torch.float8_e4m3fn
    scale = {"comfy_quant": "blocks.0.attn.qkv_proj.weight_scale", "scaled": "blocks.0.attn.qkv_proj.scale_weight",
             "plain": None}[layout]
    expected = qkv.float() * (stored[scale] if scale else 1.0)
    config = tiny_h3_dir / "transformer" / "config.json"
    dit = load_native_transformer(path, config, dtype=torch.float32, fuse=False)
    attn = dit.transformer_blocks[0].attn
    assert torch.equal(torch.cat([attn.to_q.weight, attn.to_k.weight, attn.to_v.weight]), expected)
    bf16 = load_native_transformer(native / PARTS["transformer"], config, dtype=torch.float32, fuse=False)
    assert torch.equal(dit.proj_in.weight, bf16.proj_in.weight)  # only the blocks' matmul weights were FP8
    components = H3Components(tiny_h3_dir, EngineOptions(device="cpu", dtype=torch.bfloat16,
                                                         files=(("transformer", str(path)),)))
    result = H3Pipeline(components).run(H3Request(prompt="a cat", num_frames=124, width=128, height=64, steps=1,
                                                  seed=0, decode=False))
    assert torch.isfinite(result.video_latents).all() and result.video_latents.shape == (1, 24, 37, 4, 8)


# -- wrong and partial files ------------------------------------------------------------------------------------------

def _write(path, tensors, metadata=None):
    save_file(tensors, path, metadata=metadata)
    return path


def test_wrong_and_partial_files_are_errors_naming_the_file_and_keys(native, tiny_h3_dir, tmp_path):
    from comfyui_h3.backend.models.native_load import (load_native_audio_vae, load_native_transformer,
                                                       load_native_vae)

    dit = load_file(native / PARTS["transformer"])
    cases = []
    partial = {k: v for k, v in dit.items() if not k.startswith("blocks.1.")}
    cases.append((_write(tmp_path / "partial.safetensors", partial), "transformer", "does not match",
                  "num_layers 1 (file) vs 2"))
    no_mlp = {k: v for k, v in dit.items() if not k.startswith("blocks.1.mlp.")}
    cases.append((_write(tmp_path / "no_mlp.safetensors", no_mlp), "transformer", "is missing DiT weights",
                  "blocks.1.mlp.fc1.weight"))
    extra = dict(dit, **{"blocks.0.attn.extra.weight": torch.zeros(2)})
    cases.append((_write(tmp_path / "extra.safetensors", extra), "transformer", "holds keys", "blocks.0.attn.extra"))
    cases.append((native / PARTS["vae"], "transformer", "is a native MiniMax-H3 video VAE file", "vae input"))
    cases.append((tiny_h3_dir / "vae" / "diffusion_pytorch_model.safetensors", "vae", "diffusers-layout", "folder"))
    mixed = dict({"model.diffusion_model." + k: v for k, v in dit.items()}, other=torch.zeros(1))
    cases.append((_write(tmp_path / "mixed.safetensors", mixed), "transformer", "mixes keys", "other"))
    # a curve table beside the time embedder: neither the full nor the pruned form (tests/pipelines/h3/test_native_pruned.py)
    pruned = dict(dit, adaln_t_table=torch.zeros(4, 24))
    cases.append((_write(tmp_path / "pruned.safetensors", pruned), "transformer", "holds keys", "time_embedder."))
    rope = dict(dit, **{"rope.inv_freq": dit["rope.inv_freq"] * 2})
    cases.append((_write(tmp_path / "rope.safetensors", rope), "transformer", "rope.inv_freq", "rope_theta"))
    quant = dict(dit, **{"blocks.0.mlp.fc2.comfy_quant": torch.tensor(list(b'{"format": "int8_tensorwise"}'),
                                                                      dtype=torch.uint8)})
    cases.append((_write(tmp_path / "int8.safetensors", quant), "transformer", "quantised as 'int8_tensorwise'",
                  "fp8_scaled"))
    audio = {k: v for k, v in load_file(native / PARTS["audio_vae"]).items() if k != "latents_std"}
    cases.append((_write(tmp_path / "audio.safetensors", audio), "audio_vae", "missing latents_std", "partial"))
    vae = load_file(native / PARTS["vae"])
    vae["decoder.x_embedder.weight"] = torch.zeros(8, 24)
    cases.append((_write(tmp_path / "vae_shape.safetensors", vae), "vae", "does not match", "decoder.x_embedder"))
    loaders = {"transformer": lambda p: load_native_transformer(p, tiny_h3_dir / "transformer" / "config.json"),
               "vae": lambda p: load_native_vae(p, tiny_h3_dir / "vae"),
               "audio_vae": lambda p: load_native_audio_vae(p, tiny_h3_dir / "audio_vae")}
    for path, part, says, names in cases:
        with pytest.raises(CheckpointError) as info:
            loaders[part](path)
        message = str(info.value)
        assert str(path) in message and says in message and names in message and "\n" not in message, message


def test_engine_config_checks_files_before_anything_loads(native, tiny_h3_dir, tmp_path):
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.release_config import release_folder

    with pytest.raises(CheckpointError, match="is a native MiniMax-H3 audio VAE file"):
        h3_config(str(tiny_h3_dir), files={"vae": str(native / PARTS["audio_vae"])}).validate()
    with pytest.raises(ValueError, match="Unknown component"):
        h3_config(str(tiny_h3_dir), files={"unet": str(native / PARTS["transformer"])})
    with pytest.raises(CheckpointError, match="Model file not found"):
        h3_config(str(tiny_h3_dir), files={"vae": str(tmp_path / "nope.safetensors")}).validate()
    release = release_folder(_tokenizer_dir(tiny_h3_dir, tmp_path), tmp_path / "cache")
    with pytest.raises(ValueError, match="missing: text_encoder, vae, audio_vae"):
        h3_config(str(release), files={"transformer": str(native / PARTS["transformer"])}).validate()
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        h3_config(str(tiny_h3_dir), world_size=3, files={"transformer": str(native / PARTS["transformer"])}).validate()
    ok = h3_config(str(tiny_h3_dir), files={"transformer_ref": str(native / "dit_ref.safetensors")})
    ok.validate()
    assert ok.options.files == (("transformer_ref", str(native / "dit_ref.safetensors")),)


# -- the release's configs, for setups without a diffusers folder -----------------------------------------------------

def _tokenizer_dir(tiny_h3_dir, tmp_path) -> Path:
    """A Qwen2 BPE tokenizer folder in ComfyUI's qwen25_tokenizer form (vocab.json, merges.txt, tokenizer_config.json
    with the special tokens), made from the tiny set's tokenizer."""
    folder = tmp_path / "qwen_tokenizer"
    if folder.is_dir():
        return folder
    folder.mkdir()
    data = json.loads((tiny_h3_dir / "tokenizer" / "tokenizer.json").read_text())
    model = data["model"]
    specials = {t["content"]: t["id"] for t in data["added_tokens"]}
    vocab = {k: v for k, v in model["vocab"].items() if k not in specials}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    added = {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for c, i in specials.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": added, "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None, "errors": "replace",
        "add_prefix_space": False, "chat_template": "unused", "processor_class": "Qwen2_5_VLProcessor"}))
    return folder


def test_release_configs_folder_with_a_tokenizer_runs_the_native_files(native, tiny_h3_dir, tmp_path):
    """model 'none' / --model release: the shipped configs (release sizes) + a Qwen tokenizer folder. The tiny
    files do not fit the release's configs; a file that does not is named with its first mismatched keys."""
    from transformers import AutoProcessor, AutoTokenizer

    from comfyui_h3.backend.pipelines.h3.components import EngineOptions, H3Components, check_model_folder
    from comfyui_h3.backend.pipelines.h3.release_config import MARKER, is_release_folder, release_folder

    source = _tokenizer_dir(tiny_h3_dir, tmp_path)
    folder = release_folder(source, tmp_path / "cache")
    assert is_release_folder(folder) and release_folder(source, tmp_path / "cache") == folder  # made once
    assert json.loads((folder / MARKER).read_text())["tokenizer_from"] == str(source.resolve())
    ids = AutoTokenizer.from_pretrained(folder / "tokenizer")("a cat", add_special_tokens=False)["input_ids"]
    assert ids and ids == AutoTokenizer.from_pretrained(source)("a cat", add_special_tokens=False)["input_ids"]
    processor = AutoProcessor.from_pretrained(folder / "processor")
    assert processor.image_processor.merge_size == 2 and processor.video_processor.temporal_patch_size == 2
    files = {part: str(native / name) for part, name in PARTS.items()}
    check_model_folder(folder, files)
    with pytest.raises(CheckpointError, match="No vae weights: pick its ComfyUI single file"):
        check_model_folder(folder, {"transformer": files["transformer"]})
    with pytest.raises(CheckpointError, match=r"vae\.safetensors holds keys .* not with .*/vae/config\.json\): "
                                              r"encoder\.down\.2\.block\.0\.nin_shortcut"):
        H3Components(folder, EngineOptions(device="cpu", dtype=torch.float32, files=tuple(files.items())))


@pytest.mark.skipif(not __import__("os").environ.get("COMFYUI_DIR"),
                    reason="COMFYUI_DIR unset: ComfyUI's own qwen25_tokenizer folder is tried only with a checkout "
                           "(test_release_configs_folder_with_a_tokenizer_runs_the_native_files covers the logic)")
def test_release_configs_take_comfyuis_own_qwen_tokenizer(tmp_path):
    import os

    from transformers import AutoProcessor, AutoTokenizer

    from comfyui_h3.backend.pipelines.h3.release_config import IMAGE_PAD, VISION_END, VISION_START, release_folder

    source = Path(os.environ["COMFYUI_DIR"]) / "comfy" / "text_encoders" / "qwen25_tokenizer"
    folder = release_folder(source, tmp_path)
    tok = AutoTokenizer.from_pretrained(folder / "tokenizer")
    assert tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]) == [
        VISION_START, VISION_END, IMAGE_PAD]
    assert tok("a red kite", add_special_tokens=False)["input_ids"] == [64, 2518, 98119]
    assert AutoProcessor.from_pretrained(folder / "processor").image_processor.patch_size == 16


# -- the native LATENT ------------------------------------------------------------------------------------------------

@pytest.fixture
def with_nested_tensor(monkeypatch):
    with nested_tensor_comfy(monkeypatch) as modules:
        yield modules


def test_native_latent_round_trip_is_exact(with_nested_tensor):
    from comfyui_h3.native_latent import from_native, to_native
    from comfyui_h3.types import H3Latents

    ours = H3Latents(torch.randn(1, 24, 7, 4, 6), torch.randn(2, 32, 83))
    latent = to_native(ours)
    video, audio = latent["samples"].tensors
    assert video.shape == (1, 24, 7, 4, 6) and audio.shape == (1, 32, 2, 83)
    assert torch.equal(audio[0, :, 1], ours.audio[1])  # stereo channel 1 of the native pair is our batch item 1
    back = from_native(latent)
    assert torch.equal(back.video, ours.video) and torch.equal(back.audio, ours.audio)
    again = to_native(back)["samples"].tensors
    assert torch.equal(again[0], video) and torch.equal(again[1], audio)
    # values pass unchanged: both sides hold the VAEs' normalised latents (nothing rescaled on the way)
    assert video.data_ptr() != ours.video.data_ptr() and torch.equal(video, ours.video)


def test_native_latent_that_is_not_an_h3_av_latent_is_refused(with_nested_tensor):
    from comfyui_h3.backend.pipelines.h3.geometry import RequestError
    from comfyui_h3.native_latent import from_native

    bad = [({"samples": torch.zeros(1, 16, 5, 8, 8)}, "is not a MiniMax-H3 AV latent"),
           ({"samples": FakeNestedTensor([torch.zeros(1, 24, 7, 4, 4)])}, "holds 1 streams"),
           ({"samples": FakeNestedTensor([torch.zeros(1, 128, 7, 4, 4), torch.zeros(1, 8, 83)])}, "has streams"),
           ({"samples": FakeNestedTensor([torch.zeros(2, 24, 7, 4, 4), torch.zeros(2, 32, 2, 83)])}, "batch of 2"),
           ({"samples": FakeNestedTensor([torch.full((1, 24, 7, 4, 4), float("nan")), torch.zeros(1, 32, 2, 83)])},
            "NaN")]
    for latent, says in bad:
        with pytest.raises(RequestError, match=says):
            from_native(latent)


def test_nodes_show_the_native_latent_only_where_comfyui_has_nested_tensor(with_nested_tensor):
    io, sample, edit, extend, _ = with_nested_tensor
    assert io.SUPPORTED
    assert sample.H3Sample.RETURN_TYPES[-1] == "LATENT" and sample.H3Sample.RETURN_NAMES[-1] == "native_latent"
    assert edit.H3Edit.RETURN_TYPES[-1] == "LATENT" and extend.H3Extend.RETURN_TYPES[-1] == "LATENT"
    assert "native_latent" in sample.H3Sample.INPUT_TYPES()["optional"]
    assert "native_latent" in extend.H3Extend.INPUT_TYPES()["optional"]
    assert len(sample.H3Sample.OUTPUT_TOOLTIPS) == len(sample.H3Sample.RETURN_TYPES)


def test_nodes_hide_the_native_latent_without_nested_tensor():
    from comfyui_h3.nodes import native_latent_io
    from comfyui_h3.nodes.extend import H3Extend
    from comfyui_h3.nodes.sample import H3Sample

    assert "comfy.nested_tensor" not in sys.modules and not native_latent_io.SUPPORTED
    assert H3Sample.RETURN_TYPES == ("VIDEO", "AUDIO", "H3_LATENTS") and H3Extend.RETURN_TYPES == ("VIDEO",
                                                                                                   "H3_LATENTS")
    assert "native_latent" not in H3Sample.INPUT_TYPES()["optional"]
    assert "native_latent" not in H3Extend.INPUT_TYPES()["optional"]


def test_sample_takes_size_and_length_from_a_native_latent(with_nested_tensor):
    io = with_nested_tensor[0]
    empty = {"samples": FakeNestedTensor([torch.zeros(1, 24, 37, 24, 42), torch.zeros(1, 32, 2, 207)])}
    assert io.latent_geometry(empty, 0, 0) == (124, 672, 384)
    assert io.latent_geometry(empty, 672, 384) == (124, 672, 384)
    with pytest.raises(ValueError, match="native_latent is 672x384 but width/height say 640x384"):
        io.latent_geometry(empty, 640, 384)
    odd = {"samples": FakeNestedTensor([torch.zeros(1, 24, 6, 24, 42), torch.zeros(1, 32, 2, 40)])}
    with pytest.raises(ValueError, match="6 latent frames"):
        io.latent_geometry(odd, 0, 0)


@pytest.fixture(scope="module")
def handle(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.types import H3EngineHandle

    h = H3EngineHandle(h3_config(model_dir=str(tiny_h3_dir), device="cpu", dtype="float32"))
    yield h
    h.engine().shutdown()


@pytest.mark.slow
def test_extending_a_native_latent_equals_extending_the_same_latents(with_nested_tensor, handle, tmp_path,
                                                                     monkeypatch):
    from comfyui_h3.native_latent import to_native
    from comfyui_h3.types import H3Latents

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("COMFYUI_H3_TEMP", str(tmp_path / "temp"))
    extend = with_nested_tensor[3]
    generator = torch.Generator().manual_seed(5)
    source = H3Latents(torch.randn(1, 24, 7, 4, 6, generator=generator), torch.randn(2, 32, 37, generator=generator))
    args = dict(prompt="the kite lands", seconds=0.5, windows=0, window_frames=56, overlap_frames=22,
                audio_mode="continue", steps=1, video_shift=12.0, audio_shift=3.0, seed=1)
    ours = extend.H3Extend().extend(handle, latents=source, **args)["result"]
    theirs = extend.H3Extend().extend(handle, native_latent=to_native(source), **args)["result"]
    assert torch.equal(ours[1].video, theirs[1].video) and torch.equal(ours[1].audio, theirs[1].audio)
    assert torch.equal(ours[2]["samples"].tensors[0], theirs[2]["samples"].tensors[0])
    assert torch.equal(ours[2]["samples"].tensors[1], theirs[2]["samples"].tensors[1])
    assert torch.equal(ours[1].video[:, :, :7], source.video)  # the source rows stay as given
    with pytest.raises(ValueError, match="needs one source"):
        extend.H3Extend().extend(handle, latents=source, native_latent=to_native(source), **args)


# -- the CLI and the loader node --------------------------------------------------------------------------------------

def test_cli_single_file_flags_reach_the_engine(monkeypatch, native, tiny_h3_dir, tmp_path):
    from cli_engine_configs import engine_configs_for

    flags = ["--transformer", str(native / PARTS["transformer"]), "--transformer-ref",
             str(native / "dit_ref.safetensors"), "--text-encoder", str(native / PARTS["text_encoder"]),
             "--vae", str(native / PARTS["vae"]), "--audio-vae", str(native / PARTS["audio_vae"])]
    want = {"transformer": native / PARTS["transformer"], "transformer_ref": native / "dit_ref.safetensors",
            "text_encoder": native / PARTS["text_encoder"], "vae": native / PARTS["vae"],
            "audio_vae": native / PARTS["audio_vae"]}
    for config in engine_configs_for(monkeypatch, flags, request=types.SimpleNamespace(steps=1)):
        assert dict(config.options.files) == {k: str(v) for k, v in want.items()}
    assert all(c.options.files == () for c in engine_configs_for(monkeypatch, [], types.SimpleNamespace(steps=1)))

    from comfyui_h3 import cli

    monkeypatch.setenv("COMFYUI_H3_CACHE", str(tmp_path / "cache"))
    args = cli._parser().parse_args(["generate", "--prompt", "x", "--model", "release", "--tokenizer",
                                     str(_tokenizer_dir(tiny_h3_dir, tmp_path))])
    assert Path(cli._model_folder(args)).name.startswith("h3-release-configs-")
    args = cli._parser().parse_args(["generate", "--prompt", "x", "--model", "release"])
    with pytest.raises(FileNotFoundError, match="--tokenizer DIR"):
        cli._model_folder(args)


def test_loader_lists_native_files_by_what_they_are_and_mixes_them(native, tiny_h3_dir, tmp_path, monkeypatch):
    from comfyui_h3 import comfy_services as services
    from comfyui_h3.native_setup import NATIVE_ONLY
    from comfyui_h3.nodes.loader import H3ModelLoader
    from comfyui_h3.tiny_model import TINY_NAME

    root = tmp_path / "models"
    (root / "sub").mkdir(parents=True)
    for name in ("dit.safetensors", "vae.safetensors", "avae.safetensors", "te.safetensors"):
        (root / "sub" / name).write_bytes((native / name).read_bytes())
    (root / "notes.safetensors").write_bytes(b"not a model")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(root))
    optional = H3ModelLoader.INPUT_TYPES()["optional"]
    assert optional["transformer"][0] == [services.FROM_FOLDER, "sub/dit.safetensors"]
    assert optional["vae"][0] == [services.FROM_FOLDER, "sub/vae.safetensors"]
    assert optional["audio_vae"][0] == [services.FROM_FOLDER, "sub/avae.safetensors"]
    assert optional["text_encoder"][0] == [services.FROM_FOLDER, "sub/te.safetensors"]
    assert NATIVE_ONLY in H3ModelLoader.INPUT_TYPES()["required"]["model"][0]
    (handle,) = H3ModelLoader().load(TINY_NAME, "cpu", "float32", "sdpa", transformer="sub/dit.safetensors",
                                     vae=services.FROM_FOLDER)
    assert handle.config.options.files == (("transformer", str(root / "sub" / "dit.safetensors")),)
    with pytest.raises(services.UnsafePathError):
        H3ModelLoader().load(TINY_NAME, "cpu", "float32", "sdpa", vae="../../etc/passwd")
    with pytest.raises(FileNotFoundError, match="needs? a Qwen tokenizer"):
        H3ModelLoader().load(NATIVE_ONLY, "cpu", "float32", "sdpa", transformer="sub/dit.safetensors")


def test_native_files_come_from_comfyuis_folders_extra_model_paths_included(native, tmp_path, monkeypatch):
    """Inside ComfyUI the files are listed from its folder types (diffusion_models / unet, text_encoders / clip,
    vae), so an extra_model_paths.yaml entry is searched too; its own Qwen tokenizer folder is found."""
    from comfyui_h3 import comfy_services as services

    base = tmp_path / "ComfyUI"
    extra = tmp_path / "yaml_dit"  # as extra_model_paths.yaml adds it to diffusion_models
    folders = {"diffusion_models": [base / "models" / "diffusion_models", extra], "unet": [],
               "text_encoders": [base / "models" / "text_encoders"], "clip": [], "vae": [base / "models" / "vae"]}
    for paths in folders.values():
        for path in paths:
            path.mkdir(parents=True)
    (extra / "dit.safetensors").write_bytes((native / PARTS["transformer"]).read_bytes())
    (base / "models" / "vae" / "avae.safetensors").write_bytes((native / PARTS["audio_vae"]).read_bytes())
    (base / "models" / "text_encoders" / "te.safetensors").write_bytes((native / PARTS["text_encoder"]).read_bytes())
    tokenizer = base / "comfy" / "text_encoders" / "qwen25_tokenizer"
    tokenizer.mkdir(parents=True)
    (tokenizer / "vocab.json").write_text("{}")
    fp = types.ModuleType("folder_paths")
    fp.base_path = str(base)
    fp.get_folder_paths = lambda kind: [str(p) for p in folders[kind]]
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    monkeypatch.delenv("COMFYUI_H3_MODELS", raising=False)
    assert services.native_files("transformer") == services.native_files("transformer_ref") == ["dit.safetensors"]
    assert services.native_files("audio_vae") == ["avae.safetensors"] and services.native_files("vae") == []
    assert services.native_files("text_encoder") == ["te.safetensors"]
    assert services.resolve_native_file("transformer", "dit.safetensors") == str(extra / "dit.safetensors")
    with pytest.raises(FileNotFoundError, match="models/vae/"):
        services.resolve_native_file("vae", "avae2.safetensors")
    assert services.comfy_tokenizer_dir() == str(tokenizer)
