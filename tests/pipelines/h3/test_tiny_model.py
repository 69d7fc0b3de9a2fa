"""The tiny MiniMax-H3 set (backend/models/tiny.py): released folder layout, sharded mixed-precision transformers,
deterministic build, and diffusers' MiniMaxH3ModularPipeline loading it and running t2va / fl2va / ref2va on CPU.

Uses the session fixture `tiny_h3_dir` from conftest.py (one build per session)."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
safetensors = pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402

from comfyui_h3.backend.models.tiny import (  # noqa: E402
    COMPONENTS,
    TINY_PIPELINE_CONFIG,
    TRANSFORMER_FP32_PREFIXES,
    make_tiny_h3,
)

PARTITIONS = ("transformer", "transformer_ref")
SHARD_INDEX = "diffusion_pytorch_model.safetensors.index.json"


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors file under `folder`, keyed `relative/file.safetensors::name`."""
    tensors = {}
    for path in sorted(folder.rglob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensors[f"{path.relative_to(folder)}::{name}"] = handle.get_tensor(name)
    return tensors


def partition_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of one sharded transformer partition, keyed by parameter name."""
    return {key.split("::", 1)[1]: value for key, value in read_safetensors(folder).items()}


# ---------------------------------------------------------------------------------------------------- layout


def test_layout_and_indexes(tiny_h3_dir):
    root = Path(tiny_h3_dir)
    for name in COMPONENTS:
        assert (root / name).is_dir(), f"missing component folder {name}/"

    modular = json.loads((root / "modular_model_index.json").read_text())
    assert modular["_class_name"] == "MiniMaxH3ModularPipeline"
    assert modular["_blocks_class_name"] == "MiniMaxH3Blocks"
    for name, (library, class_name) in COMPONENTS.items():
        entry = modular[name]
        assert entry[:2] == [library, class_name]
        assert entry[2]["subfolder"] == name and entry[2]["type_hint"] == [library, class_name]
    for key, value in TINY_PIPELINE_CONFIG.items():
        assert modular[key] == value

    classic = json.loads((root / "model_index.json").read_text())
    assert classic["_class_name"] == "MiniMaxH3ModularPipeline"
    assert {name: tuple(classic[name]) for name in COMPONENTS} == COMPONENTS

    shifts = {name: json.loads((root / name / "scheduler_config.json").read_text())["shift"]
              for name in ("scheduler", "audio_scheduler")}
    assert shifts == {"scheduler": 12.0, "audio_scheduler": 3.0}

    vae = json.loads((root / "vae" / "config.json").read_text())
    assert vae["latent_channels"] == 24 and vae["clip_length"] == 17 and vae["token_drop"] == 3
    assert np.prod(vae["spatial_downsample_factors"]) == 16 and np.prod(vae["temporal_downsample_factors"]) == 4
    audio_vae = json.loads((root / "audio_vae" / "config.json").read_text())
    assert audio_vae["sampling_rate"] == 32000 and audio_vae["latent_channels"] == 32
    assert np.prod(audio_vae["encoder_rates"]) == 800
    text = json.loads((root / "text_encoder" / "config.json").read_text())
    assert text["text_config"]["num_hidden_layers"] > 50  # H3 reads hidden_states[50]
    dit = json.loads((root / "transformer" / "config.json").read_text())
    assert dit["text_dim"] == text["text_config"]["hidden_size"]
    assert (dit["in_channels"], dit["audio_in_channels"], dit["patch_size"]) == (24, 32, [1, 2, 2])

    total = sum(path.stat().st_size for path in root.rglob("*") if path.is_file())
    assert total < 30 * 2**20, f"tiny set is {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("partition", PARTITIONS)
def test_transformer_is_sharded(tiny_h3_dir, partition):
    folder = Path(tiny_h3_dir) / partition
    index = json.loads((folder / SHARD_INDEX).read_text())
    shards = sorted(path.name for path in folder.glob("*.safetensors"))
    assert len(shards) >= 2
    assert sorted(set(index["weight_map"].values())) == shards
    stored = {}
    for shard in shards:
        with safe_open(str(folder / shard), framework="pt") as handle:
            stored.update(dict.fromkeys(handle.keys(), shard))
    assert stored == index["weight_map"]


@pytest.mark.parametrize("partition", PARTITIONS)
def test_transformer_released_mixed_precision(tiny_h3_dir, partition):
    tensors = partition_tensors(Path(tiny_h3_dir) / partition)
    fp32 = {name for name, value in tensors.items() if value.dtype == torch.float32}
    bf16 = {name for name, value in tensors.items() if value.dtype == torch.bfloat16}
    assert fp32 | bf16 == set(tensors)
    assert fp32 == {name for name in tensors if name.startswith(TRANSFORMER_FP32_PREFIXES)}
    assert {name.split(".")[0] for name in fp32} == {"proj_in", "audio_proj_in", "time_embedder", "proj_out",
                                                     "audio_proj_out"}
    assert any(name.startswith("transformer_blocks.") for name in bf16)


def test_partitions_have_different_weights(tiny_h3_dir):
    main = partition_tensors(Path(tiny_h3_dir) / "transformer")
    ref = partition_tensors(Path(tiny_h3_dir) / "transformer_ref")
    assert main.keys() == ref.keys()
    assert all(main[name].dtype == ref[name].dtype and main[name].shape == ref[name].shape for name in main)
    assert not any(torch.equal(main[name], ref[name]) for name in main)


def test_component_precisions(tiny_h3_dir):
    root = Path(tiny_h3_dir)
    assert {v.dtype for v in read_safetensors(root / "vae").values()} == {torch.float32}
    assert {v.dtype for v in read_safetensors(root / "audio_vae").values()} == {torch.float32}
    assert {v.dtype for v in read_safetensors(root / "text_encoder").values()} == {torch.bfloat16}


def test_tokenizer_matches_text_encoder(tiny_h3_dir):
    from transformers import Qwen2TokenizerFast, Qwen3VLProcessor

    root = Path(tiny_h3_dir)
    tokenizer = Qwen2TokenizerFast.from_pretrained(root / "tokenizer")
    processor = Qwen3VLProcessor.from_pretrained(root / "processor")
    config = json.loads((root / "text_encoder" / "config.json").read_text())
    ids = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
    assert ids == [config["image_token_id"], config["video_token_id"], config["vision_start_token_id"],
                   config["vision_end_token_id"]]
    assert len(tokenizer) <= config["text_config"]["vocab_size"]
    assert processor.image_token_id == config["image_token_id"]
    assert processor.image_processor.patch_size == 16 and processor.image_processor.merge_size == 2
    # Plain text round-trips through the byte-level BPE, including bytes outside ASCII.
    text = "a cat <Picture 1>: naïve 猫"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


# ---------------------------------------------------------------------------------------------------- determinism


def test_build_is_deterministic_and_overwrites(tiny_h3_dir, tmp_path):
    target = tmp_path / "again"
    target.mkdir()
    (target / "stale.txt").write_text("from an earlier build")
    with pytest.raises(FileExistsError):
        make_tiny_h3(target)
    again = make_tiny_h3(target, overwrite=True)
    assert again == target.resolve() and not (target / "stale.txt").exists()

    first, second = read_safetensors(Path(tiny_h3_dir)), read_safetensors(again)
    assert first.keys() == second.keys() and len(first) > 0
    for key in first:
        assert first[key].dtype == second[key].dtype and torch.equal(first[key], second[key]), key
    # Same library versions -> byte-identical files, configs and tokenizer included.
    files = sorted(p.relative_to(tiny_h3_dir) for p in Path(tiny_h3_dir).rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for relative in files:
        assert (Path(tiny_h3_dir) / relative).read_bytes() == (again / relative).read_bytes(), relative


# ---------------------------------------------------------------------------------------------------- diffusers


@pytest.fixture
def one_thread():
    """Run tiny-model compute on one intra-op thread. The ops are far too small to gain from a second thread, and on a
    busy 2-core machine two spinning OpenMP threads were measured 10-20x slower than one."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def h3_pipe(tiny_h3_dir):
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)  # torch weight_norm deprecation (audio VAE)
            pipe = diffusers.ModularPipeline.from_pretrained(str(tiny_h3_dir))
            pipe.load_components(dtype=torch.float32)
    finally:
        diffusers_logging.set_verbosity(verbosity)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_diffusers_loads_every_component(h3_pipe):
    assert isinstance(h3_pipe, diffusers.MiniMaxH3ModularPipeline)
    for name, (_, class_name) in COMPONENTS.items():
        component = getattr(h3_pipe, name, None)
        assert component is not None, f"{name} did not load"  # load_components only warns on failure
        if class_name != "Qwen2TokenizerFast":  # transformers 5 aliases it to Qwen2Tokenizer
            assert type(component).__name__ == class_name
    for name in ("transformer", "transformer_ref", "vae", "audio_vae", "text_encoder"):
        assert {p.dtype for p in getattr(h3_pipe, name).parameters()} == {torch.float32}
    assert h3_pipe.scheduler.config.shift == 12.0 and h3_pipe.audio_scheduler.config.shift == 3.0
    for key, value in TINY_PIPELINE_CONFIG.items():
        assert h3_pipe.config[key] == value
    assert h3_pipe.canvas_multiple == 32
    assert (h3_pipe.vae_frames_per_chunk, h3_pipe.vae_latents_per_chunk) == (17, 5)


def keyframe(height=48, width=80, seed=0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def workflows():
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    yield "t2va", {}
    yield "fl2va", {"image": keyframe()}
    yield "ref2va", {"references": [MiniMaxH3ImageReference(image=keyframe(seed=1))]}


@pytest.mark.parametrize("workflow,inputs", list(workflows()), ids=[w[0] for w in workflows()])
def test_diffusers_pipeline_end_to_end(h3_pipe, one_thread, workflow, inputs):
    out = h3_pipe(
        prompt="a cat",
        num_frames=124,  # 5 s at 24 fps, the minimum; already 17n+5 -> 5n+2 = 37 latent frames
        height=64,
        width=64,
        num_inference_steps=3,  # 3 sigmas, terminal 0 included -> 2 transformer calls
        generator=torch.Generator("cpu").manual_seed(0),
        output=["latents", "audio_latents", "videos", "audio", "sampling_rate", "text_token_tags",
                "normalized_references"],
        **inputs,
    )
    assert out["latents"].shape == (1, 24, 37, 4, 4)
    assert out["audio_latents"].shape == (2, 32, 207)  # round(124 / 24 * 40)
    assert torch.isfinite(out["latents"]).all() and torch.isfinite(out["audio_latents"]).all()
    (video,) = out["videos"]
    assert len(video) == 124 and all(frame.size == (64, 64) for frame in video)
    assert out["audio"].shape == (1, 2, 207 * 800) and out["sampling_rate"] == 32000
    assert torch.isfinite(out["audio"]).all() and out["audio"].abs().max() < 1.0  # not saturated by the clamp
    has_vision_rows = bool((out["text_token_tags"] == h3_pipe.video_tag).any())
    assert has_vision_rows == (workflow != "t2va")
    if workflow == "ref2va":
        (reference,) = out["normalized_references"]
        assert min(reference.image.size) == TINY_PIPELINE_CONFIG["reference_image_short_edge"]
