"""Loading a model folder: every component strictly, with errors that name the folder/file and what is wrong."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.models.checkpoint import CheckpointError
from comfyui_h3.backend.pipelines.h3.components import EngineOptions, H3Components, check_model_folder


@pytest.fixture
def folder_copy(tmp_path, tiny_h3_dir):
    dst = tmp_path / "h3"
    shutil.copytree(tiny_h3_dir, dst)
    return dst


def test_missing_parts_are_named(folder_copy):
    shutil.rmtree(folder_copy / "audio_vae")
    with pytest.raises(CheckpointError, match="missing audio_vae"):
        check_model_folder(folder_copy)


def test_pickle_only_weights_are_refused(folder_copy):
    vae = folder_copy / "vae"
    for f in vae.glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    with pytest.raises(CheckpointError, match="only safetensors"):
        check_model_folder(folder_copy)


def test_vae_with_a_missing_tensor_is_an_error_not_a_random_init(folder_copy):
    (path,) = list((folder_copy / "vae").glob("*.safetensors"))
    state = load_file(path)
    dropped = sorted(state)[0]
    state.pop(dropped)
    save_file(state, path)
    with pytest.raises(CheckpointError, match=rf"vae weights {re.escape(str(path))} do not match .*vae/config\.json "
                                              rf"\(missing_keys: {re.escape(dropped)}"):
        H3Components(folder_copy, EngineOptions(dtype=torch.float32))


def test_a_truncated_transformer_shard_names_the_file(folder_copy):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    shard = sorted((folder_copy / "transformer").glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=shard.name):
        load_h3_transformer(folder_copy / "transformer")


# -- every file the loader opens: a fault is a CheckpointError that names the file -----------------------------------

CONFIGS = ["model_index.json", "modular_model_index.json", "transformer/config.json", "transformer_ref/config.json",
           "vae/config.json", "audio_vae/config.json", "text_encoder/config.json",
           "text_encoder/generation_config.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
           "processor/processor_config.json", "processor/tokenizer.json", "processor/tokenizer_config.json",
           "scheduler/scheduler_config.json",
           "audio_scheduler/scheduler_config.json", "transformer/diffusion_pytorch_model.safetensors.index.json"]


def test_every_json_the_loader_reads_is_in_the_list(tiny_h3_dir):
    """The list above is the tiny folder's every JSON file: a new one must be broken by the test below too."""
    assert sorted(str(p.relative_to(tiny_h3_dir)) for p in tiny_h3_dir.rglob("*.json")
                  if "transformer_ref/diffusion" not in str(p)) == sorted(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_invalid_json_names_the_file(folder_copy, name):
    (folder_copy / name).write_text('{"shift": 12.0,,}', encoding="utf-8")
    with pytest.raises(CheckpointError, match=rf"Unreadable JSON in .*{re.escape(name)}"):
        check_model_folder(folder_copy)


def test_invalid_transformer_config_is_named_when_the_loader_node_checks_the_folder(folder_copy):
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    (folder_copy / "transformer" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"transformer/config\.json"):
        h3_config(str(folder_copy)).validate()


def test_invalid_model_index_is_named_not_skipped(folder_copy):
    from comfyui_h3.backend.pipelines.h3.components import folder_settings

    (folder_copy / "modular_model_index.json").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"modular_model_index\.json"):
        folder_settings(folder_copy)


def test_a_config_value_the_model_cannot_take_names_the_file(folder_copy):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    path = folder_copy / "transformer" / "config.json"
    config = json.loads(path.read_text())
    config["num_attention_heads"] = "many"
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"transformer/config\.json"):
        load_h3_transformer(folder_copy / "transformer")


def test_a_truncated_text_encoder_names_the_file_before_any_weight_loads(folder_copy):
    (shard,) = (folder_copy / "text_encoder").glob("*.safetensors")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(shard))}.*damaged or incomplete"):
        check_model_folder(folder_copy)


def test_corrupt_text_encoder_bytes_name_the_file(folder_copy):
    (shard,) = (folder_copy / "text_encoder").glob("*.safetensors")
    data = bytearray(shard.read_bytes())
    data[8:40] = b"\xff" * 32  # the header's first bytes: not UTF-8 JSON any more
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(shard))}.*damaged or incomplete"):
        check_model_folder(folder_copy)


def test_a_text_encoder_config_that_does_not_fit_its_weights_names_file_and_keys(folder_copy):
    from comfyui_h3.backend.pipelines.h3.components import load_text_encoder

    path = folder_copy / "text_encoder" / "config.json"
    config = json.loads(path.read_text())
    config["text_config"]["intermediate_size"] *= 2
    path.write_text(json.dumps(config))
    (shard,) = (folder_copy / "text_encoder").glob("*.safetensors")
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(shard))} does not match {re.escape(str(path))} .*"
                                              r"model\.language_model\.layers\.0\.mlp\.down_proj\.weight"):
        load_text_encoder(folder_copy / "text_encoder", torch.float32)


def test_a_text_encoder_config_with_more_layers_names_the_missing_keys(folder_copy):
    from comfyui_h3.backend.pipelines.h3.components import load_text_encoder

    path = folder_copy / "text_encoder" / "config.json"
    config = json.loads(path.read_text())
    config["vision_config"]["depth"] += 1
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"text_encoder weights .*model\.safetensors do not match .*config\.json "
                                              r"\(missing_keys: model\.visual\.blocks\.2\."):
        load_text_encoder(folder_copy / "text_encoder", torch.float32)


@pytest.mark.parametrize("part", ["vae", "audio_vae"])
def test_a_vae_config_that_does_not_fit_its_weights_names_file_and_keys(folder_copy, part):
    path = folder_copy / part / "config.json"
    config = json.loads(path.read_text())
    key = "decoder_ffn_mult" if part == "vae" else "latent_channels"
    config[key] *= 2
    path.write_text(json.dumps(config))
    (shard,) = (folder_copy / part).glob("*.safetensors")
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(shard))} does not match {re.escape(str(path))} "
                                              r"\(stored shape vs the config's\): \S+ \("):
        H3Components(folder_copy, EngineOptions(dtype=torch.float32))


@pytest.mark.parametrize("part", ["tokenizer", "processor"])
def test_a_missing_tokenizer_json_is_named_when_the_folder_is_checked(folder_copy, part):
    (folder_copy / part / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=rf"{part}/tokenizer\.json is missing"):
        check_model_folder(folder_copy)


def test_vocab_and_merges_stand_in_for_tokenizer_json(folder_copy):
    tok = folder_copy / "tokenizer"
    model = json.loads((tok / "tokenizer.json").read_text())["model"]
    (tok / "vocab.json").write_text(json.dumps(model["vocab"]))
    (tok / "merges.txt").write_text("#version: 0.2\n" + "\n".join(
        m if isinstance(m, str) else " ".join(m) for m in model["merges"]))
    (tok / "tokenizer.json").unlink()
    check_model_folder(folder_copy)


def test_an_unreadable_file_is_named(folder_copy, monkeypatch):
    """An OSError while reading (permissions, an I/O error; simulated: the tests may run as root)."""
    from pathlib import Path

    path = folder_copy / "vae" / "config.json"
    read_text = Path.read_text

    def failing(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", failing)
    with pytest.raises(CheckpointError, match=rf"Cannot read {re.escape(str(path))}: .*Permission denied"):
        check_model_folder(folder_copy)


# -- schedule shifts: read from scheduler/ and audio_scheduler/ as diffusers 0.42.1 reads them ------------------------

def _set_shift(folder, name, value):
    path = folder / name / "scheduler_config.json"
    config = json.loads(path.read_text())
    if value is None:
        config.pop("shift")
    else:
        config["shift"] = value
    path.write_text(json.dumps(config))
    return path


def test_scheduler_shifts_are_the_folders(folder_copy):
    from comfyui_h3.backend.pipelines.h3.components import scheduler_shifts

    assert scheduler_shifts(folder_copy) == (12.0, 3.0)  # the tiny set carries the release's
    _set_shift(folder_copy, "scheduler", 5)
    _set_shift(folder_copy, "audio_scheduler", 7.5)
    assert scheduler_shifts(folder_copy) == (5.0, 7.5)
    _set_shift(folder_copy, "audio_scheduler", None)  # diffusers: MiniMaxH3Scheduler's own default
    assert scheduler_shifts(folder_copy) == (5.0, 12.0)
    shutil.rmtree(folder_copy / "audio_scheduler")  # no reference to follow: the release's value
    shutil.rmtree(folder_copy / "scheduler")
    assert scheduler_shifts(folder_copy) == (12.0, 3.0)


@pytest.mark.parametrize("value", [0, -3.0, "12", True, None])
def test_a_bad_scheduler_shift_names_the_file(folder_copy, value):
    path = folder_copy / "audio_scheduler" / "scheduler_config.json"
    config = json.loads(path.read_text())
    config["shift"] = value
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: shift must be a positive number"):
        check_model_folder(folder_copy)


def test_the_engine_error_a_node_shows_names_the_file(folder_copy):
    """What a user sees: the worker's load failure reaches the caller as one error that names the broken file."""
    from comfyui_h3.backend.engine import Engine, EngineError
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    (folder_copy / "tokenizer" / "tokenizer.json").unlink()
    engine = Engine(h3_config(str(folder_copy), dtype="float32"))
    try:
        with pytest.raises(EngineError, match=r"tokenizer/tokenizer\.json is missing"):
            engine.generate(H3Request(prompt="a lighthouse", num_frames=124, steps=1, width=64, height=64))
    finally:
        engine.shutdown()
