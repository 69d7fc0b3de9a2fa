"""Loading a model folder: every component strictly, with errors that name the folder/file and what is wrong."""

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
    with pytest.raises(CheckpointError, match=r"vae weights in .*vae do not match its config \(missing_keys: "
                       + dropped.replace(".", r"\.")):
        H3Components(folder_copy, EngineOptions(dtype=torch.float32))


def test_a_truncated_transformer_shard_names_the_file(folder_copy):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    shard = sorted((folder_copy / "transformer").glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=shard.name):
        load_h3_transformer(folder_copy / "transformer")
