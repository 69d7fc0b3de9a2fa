"""SeedVR2 release files: variant sniffing from the header, strict loads, fp8 files, the text embedding, and the
errors a user meets with the wrong or a damaged file (all on the package's tiny files, CPU)."""

from __future__ import annotations

import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.engine_config import EngineConfig
from comfyui_h3.backend.models.checkpoint import CheckpointError
from comfyui_h3.backend.models.seedvr2 import checkpoints as ck
from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
from comfyui_h3.backend.pipelines.seedvr2.family import SeedVR2Options, seedvr2_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-seedvr2")
    make_tiny_seedvr2(root / "a", "3b")
    make_tiny_seedvr2(root / "b", "7b")
    return root


def _dit(tiny, variant):
    return tiny / ("a" if variant == "3b" else "b") / DIT_FILE.format(variant=variant)


@pytest.mark.parametrize("variant", ["3b", "7b"])
def test_variant_and_config_come_from_the_header(tiny, variant):
    path = _dit(tiny, variant)
    shapes = ck.header_shapes(path)
    assert ck.dit_variant(shapes, path) == variant
    config = ck.dit_config_from_header(shapes, path)
    model = ck.load_dit(path, "cpu", torch.float32, expect=variant)
    assert model.config == config
    stored = load_file(str(path))
    state = model.state_dict()
    assert set(state) == set(stored)
    for key, value in stored.items():
        assert torch.equal(state[key], value), key


def test_the_other_variant_is_refused_naming_both(tiny):
    with pytest.raises(CheckpointError, match=r"holds a SeedVR2 3B DiT, but the 7B model was chosen"):
        ck.load_dit(_dit(tiny, "3b"), "cpu", torch.float32, expect="7b")
    config = seedvr2_config(_dit(tiny, "3b"), tiny / "a" / VAE_FILE, tiny / "a" / TEXT_FILE, variant="7b",
                            dtype="float32")
    with pytest.raises(CheckpointError, match=r"3B DiT, but the 7B model"):
        config.validate()  # before any process starts or weight moves


def test_a_vae_chosen_as_the_dit_is_named(tiny):
    with pytest.raises(CheckpointError, match="is a VAE, not a SeedVR2 DiT"):
        ck.load_dit(tiny / "a" / VAE_FILE, "cpu", torch.float32)


def test_truncated_file_names_itself(tiny, tmp_path):
    data = _dit(tiny, "3b").read_bytes()
    bad = tmp_path / "seedvr2_ema_3b_fp16.safetensors"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=str(bad.name)):
        ck.load_dit(bad, "cpu", torch.float32)


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_strict_keys(tiny, tmp_path, change):
    state = load_file(str(_dit(tiny, "7b")))
    key = "blocks.1.attn.proj_out.vid.bias"
    if change == "missing":
        del state[key]
    elif change == "unexpected":
        state["blocks.1.attn.extra.weight"] = torch.zeros(2)
    else:
        state[key] = torch.zeros(state[key].shape[0] + 1)
    path = tmp_path / "x.safetensors"
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=r"missing|does not have|shape"):
        ck.load_dit(path, "cpu", torch.float32)


def test_fp8_file_is_cast_per_tensor(tiny, tmp_path):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    state = load_file(str(_dit(tiny, "3b")))
    # like the 7B "mixed" release: most tensors fp8, some kept in fp16
    stored = {k: (v.to(torch.float16) if k.startswith("blocks.3.") else v.to(torch.float8_e4m3fn))
              for k, v in state.items()}
    path = tmp_path / "seedvr2_ema_3b_fp8_e4m3fn.safetensors"
    save_file(stored, str(path))
    model = ck.load_dit(path, "cpu", torch.bfloat16)
    loaded = model.state_dict()
    for key, value in stored.items():
        if key.endswith(".rope.rope.freqs"):  # RoPE buffers: float32, the stored fp16 ones, fp8 -> the formula
            want = value.float() if value.dtype == torch.float16 else state[key].float()
            assert torch.equal(loaded[key], want), key
            continue
        assert loaded[key].dtype == torch.bfloat16
        assert torch.equal(loaded[key], value.to(torch.bfloat16)), key


def test_vae_loads_strictly_and_mismatch_is_named(tiny, tmp_path):
    vae = ck.load_vae(tiny / "a" / VAE_FILE, "cpu", torch.float32)
    assert vae.config.block_channels == (8, 16, 24, 24)
    state = load_file(str(tiny / "a" / VAE_FILE))
    del state[next(k for k in state if k.startswith("decoder.conv_out"))]
    path = tmp_path / "vae.safetensors"
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match="does not match the SeedVR2 VAE"):
        ck.load_vae(path, "cpu", torch.float32)


def test_vae_with_older_attention_names_loads(tiny, tmp_path):
    state = load_file(str(tiny / "a" / VAE_FILE))
    old = {k.replace(".to_q.", ".query.").replace(".to_k.", ".key.").replace(".to_v.", ".value.")
           .replace(".to_out.0.", ".proj_attn."): v for k, v in state.items()}
    assert old.keys() != state.keys()
    path = tmp_path / "ema_vae_legacy.safetensors"
    save_file(old, str(path))
    loaded = ck.load_vae(path, "cpu", torch.float32).state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_text_embedding_from_pickle_is_read_as_a_tensor_and_copied_once(tmp_path):
    emb = torch.randn(58, 5120).to(torch.bfloat16)
    torch.save(emb, tmp_path / "pos_emb.pt")
    found = ck.find_text_embedding([tmp_path / "nowhere", tmp_path])
    assert found == tmp_path / "pos_emb.pt"
    out = ck.load_text_embedding(found)  # no copy asked: nothing written
    assert out.dtype == torch.float32 and torch.equal(out, emb.float())
    copy = tmp_path / "pos_emb.safetensors"
    assert not copy.exists()
    ck.load_text_embedding(found, copy_to=tmp_path)
    assert copy.is_file()
    assert ck.find_text_embedding([tmp_path]) == copy  # safetensors preferred from now on
    assert torch.equal(ck.load_text_embedding(copy), emb.float())


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_text_embedding_pickle_with_code_is_refused(tmp_path, capsys):
    path = tmp_path / "pos_emb.pt"
    with open(path, "wb") as f:
        pickle.dump({"x": _Evil()}, f)
    with pytest.raises(CheckpointError, match="pos_emb.pt"):
        ck.load_text_embedding(path)
    assert "must never run" not in capsys.readouterr().out
    assert not (tmp_path / "pos_emb.safetensors").exists()


def test_family_memory_counts_compute_width(tiny):
    config = seedvr2_config(_dit(tiny, "3b"), tiny / "a" / VAE_FILE, tiny / "a" / TEXT_FILE, dtype="float32",
                            vae_dtype="float32")
    assert isinstance(config, EngineConfig) and isinstance(config.options, SeedVR2Options)
    config.validate()
    numel = sum(v.numel() for v in load_file(str(_dit(tiny, "3b"))).values())
    numel += sum(v.numel() for v in load_file(str(tiny / "a" / VAE_FILE)).values())
    assert config.family_impl().memory_bytes(config) == 4 * numel


def test_weight_policies_it_cannot_apply_are_refused(tiny):
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy
    from comfyui_h3.backend.runtime import WeightPolicy

    files = (_dit(tiny, "3b"), tiny / "a" / VAE_FILE, tiny / "a" / TEXT_FILE)
    refused = [(H3WeightPolicy(adaln="cache"), "bfloat16", "takes the shared weight policy"),
               (WeightPolicy(storage="fp8"), "bfloat16", "FP8 weights need an NVIDIA GPU"),  # the CPU has none
               (WeightPolicy(storage="fp8_emulated"), "float32", "FP8 weights run with bfloat16 compute")]
    for policy, dtype, message in refused:
        with pytest.raises(ValueError, match=message):
            seedvr2_config(*files, weights=policy, dtype=dtype).validate()
    for policy in (WeightPolicy(placement="offload"), WeightPolicy(placement="offload", resident_blocks=3),
                   WeightPolicy(storage="fp8_emulated", placement="offload")):
        seedvr2_config(*files, weights=policy).validate()  # what SeedVR2 now applies


def _legacy_vae(tiny, tmp_path, change):
    state = load_file(str(tiny / "a" / VAE_FILE))
    old = {k.replace(".to_q.", ".query.").replace(".to_k.", ".key.").replace(".to_v.", ".value.")
           .replace(".to_out.0.", ".proj_attn."): v for k, v in state.items()}
    key = next(k for k in old if k.startswith("decoder.") and k.endswith(".weight"))
    old[key] = change(old[key])
    path = tmp_path / "ema_vae_legacy.safetensors"
    save_file(old, str(path))
    return path, key


def test_vae_with_older_names_is_checked_for_nan(tiny, tmp_path):
    path, key = _legacy_vae(tiny, tmp_path, lambda t: torch.full_like(t, float("nan")))
    with pytest.raises(CheckpointError, match=r"ema_vae_legacy.safetensors holds NaN or infinite values"):
        ck.load_vae(path, "cpu", torch.float32)


def test_vae_with_older_names_refuses_integer_weights_naming_the_key(tiny, tmp_path):
    path, key = _legacy_vae(tiny, tmp_path, lambda t: t.to(torch.int8))
    with pytest.raises(CheckpointError, match=rf"ema_vae_legacy.safetensors: {key} is stored as int8"):
        ck.load_vae(path, "cpu", torch.float32)


def test_text_embedding_copy_is_written_only_after_the_checks(tmp_path):
    for bad in (torch.full((58, 5120), float("nan")), torch.zeros(58, 5120, dtype=torch.int64), torch.zeros(58)):
        torch.save(bad, tmp_path / "pos_emb.pt")
        with pytest.raises(CheckpointError, match="pos_emb.pt"):
            ck.load_text_embedding(tmp_path / "pos_emb.pt", copy_to=tmp_path)
        assert not (tmp_path / "pos_emb.safetensors").exists()
    torch.save(torch.randn(58, 4096), tmp_path / "pos_emb.pt")
    with pytest.raises(CheckpointError, match=r"pos_emb.pt: the text embedding is \(58, 4096\).*\[tokens, 5120\]"):
        ck.load_text_embedding(tmp_path / "pos_emb.pt", copy_to=tmp_path, width=5120)
    assert not (tmp_path / "pos_emb.safetensors").exists()


def test_a_stale_copy_is_passed_over_for_the_pickle_beside_it(tmp_path):
    from comfyui_h3.comfy_services.seedvr2_models import find_seedvr2_text_embedding

    torch.save(torch.randn(58, 5120), tmp_path / "pos_emb.pt")
    ck.load_text_embedding(tmp_path / "pos_emb.pt", copy_to=tmp_path)
    copy = tmp_path / "pos_emb.safetensors"
    assert ck.find_text_embedding([tmp_path]) == copy
    fresh = torch.randn(58, 5120)
    torch.save(fresh, tmp_path / "pos_emb.pt")  # the user replaced the pickle: the old copy no longer speaks for it
    dit = tmp_path / "seedvr2_ema_3b_fp16.safetensors"
    assert ck.find_text_embedding([tmp_path]) == tmp_path / "pos_emb.pt"
    assert find_seedvr2_text_embedding(str(dit)) == str(tmp_path / "pos_emb.pt")
    assert torch.equal(ck.load_text_embedding(tmp_path / "pos_emb.pt", copy_to=tmp_path), fresh)


def test_a_users_own_safetensors_is_taken_and_never_overwritten(tmp_path):
    own = torch.randn(58, 5120)
    save_file({"pos_emb": own}, str(tmp_path / "pos_emb.safetensors"))
    before = (tmp_path / "pos_emb.safetensors").read_bytes()
    torch.save(torch.randn(58, 5120), tmp_path / "pos_emb.pt")
    assert ck.find_text_embedding([tmp_path]) == tmp_path / "pos_emb.safetensors"
    ck.load_text_embedding(tmp_path / "pos_emb.pt", copy_to=tmp_path)
    assert (tmp_path / "pos_emb.safetensors").read_bytes() == before


def test_a_pickle_refused_by_weights_only_is_one_plain_line(tmp_path):
    path = tmp_path / "pos_emb.pt"
    with open(path, "wb") as f:
        pickle.dump({"x": _Evil()}, f)
    with pytest.raises(CheckpointError) as info:
        ck.load_text_embedding(path)
    text = str(info.value)
    assert str(path) in text and "\n" not in text and "\x1b" not in text


def test_a_text_embedding_of_another_width_fails_when_the_pipeline_is_built(tiny, tmp_path):
    width = ck.dit_config_from_header(ck.header_shapes(_dit(tiny, "3b")), _dit(tiny, "3b")).txt_dim
    text = tmp_path / "pos_emb.pt"
    torch.save(torch.randn(58, width + 8), text)
    config = seedvr2_config(_dit(tiny, "3b"), tiny / "a" / VAE_FILE, text, dtype="float32", vae_dtype="float32")
    with pytest.raises(CheckpointError, match=rf"pos_emb.pt: the text embedding is \(58, {width + 8}\).*{width}\]"):
        config.build_pipeline(0)
