"""Weights that would load wrong without an error, and files that would break the model lists (issue 28, defects 12
and 14).

Every weight loader refuses, in one CheckpointError (TrackModelError for SAM) naming the file and its first bad keys:
scaled FP8 without (or with NaN / 0) scales, integer weights a cast would turn into floats, SAM folders whose
weights are not their config's, and weights holding NaN / Inf (backend/models/checkpoint.py FiniteCheck). A
crafted or damaged header in any listed folder leaves the loaders' lists whole: the file is skipped, said once in
the log, and loading it is the one-line error."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_h3.backend.models.checkpoint import CheckpointError

TINY_CONFIG = "transformer/config.json"


@pytest.fixture(scope="module")
def native(tiny_h3_dir, tmp_path_factory):
    from comfyui_h3.backend.models.native_write import write_native_transformer, write_native_vae

    out = tmp_path_factory.mktemp("native")
    write_native_transformer(tiny_h3_dir / "transformer", out / "dit.safetensors")
    write_native_transformer(tiny_h3_dir / "transformer", out / "quant.safetensors", fp8="comfy_quant")
    write_native_transformer(tiny_h3_dir / "transformer", out / "scaled.safetensors", fp8="scaled")
    write_native_vae(tiny_h3_dir / "vae", out / "vae.safetensors")
    return out


def _rewrite(src: Path, dst: Path, edit) -> Path:
    from safetensors import safe_open

    with safe_open(str(src), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(src)
    edit(tensors)
    save_file(tensors, dst, metadata=metadata)
    return dst


def _refused(load, path, *says):
    with pytest.raises(CheckpointError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message
    for text in says:
        assert text in message, message
    return message


def _load_dit(tiny_h3_dir):
    from comfyui_h3.backend.models.native_load import load_native_transformer

    return lambda p: load_native_transformer(p, tiny_h3_dir / TINY_CONFIG, dtype=torch.float32, fuse=False)


# -- defect 12: scaled FP8 and integer weights ------------------------------------------------------------------------

@pytest.mark.parametrize("layout, suffix", [("quant", ".weight_scale"), ("scaled", ".scale_weight")])
def test_scaled_fp8_dit_without_or_with_bad_scales_is_refused(native, tiny_h3_dir, tmp_path, layout, suffix):
    load = _load_dit(tiny_h3_dir)
    src = native / f"{layout}.safetensors"
    load(src)  # the whole file loads

    def drop(t):
        for key in [k for k in t if k.endswith(suffix)]:
            del t[key]

    _refused(load, _rewrite(src, tmp_path / "unscaled.safetensors", drop), "lack their scale tensors",
             "blocks.0.attn.qkv_proj.weight")
    scale = "blocks.0.mlp.fc1" + suffix
    for name, value in (("nan", float("nan")), ("zero", 0.0), ("neg", -1.0)):
        def poison(t, value=value):
            t[scale] = torch.full_like(t[scale], value)

        _refused(load, _rewrite(src, tmp_path / f"{name}.safetensors", poison), scale, "above 0")


def test_native_dit_with_integer_block_weights_is_refused(native, tiny_h3_dir, tmp_path):
    load = _load_dit(tiny_h3_dir)
    for dtype, name in ((torch.int8, "I8"), (torch.uint8, "U8"), (torch.int32, "I32")):
        def to_int(t, dtype=dtype):
            t["blocks.1.mlp.fc2.weight"] = (t["blocks.1.mlp.fc2.weight"].float() * 100).to(dtype)

        path = _rewrite(native / "dit.safetensors", tmp_path / f"int_{name}.safetensors", to_int)
        _refused(load, path, f"blocks.1.mlp.fc2.weight ({name})", "non-float")


def test_diffusers_folder_with_integer_weights_is_refused(tiny_h3_dir, tmp_path):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer

    folder = shutil.copytree(tiny_h3_dir / "transformer", tmp_path / "transformer")
    shard = next(f for f in sorted(folder.glob("*.safetensors")) if any(".attn.to_q." in k for k in load_file(f)))
    key = next(k for k in load_file(shard) if ".attn.to_q.weight" in k)
    _rewrite(shard, shard, lambda t: t.__setitem__(key, (t[key].float() * 100).to(torch.int8)))
    _refused(lambda p: load_h3_transformer(p, dtype=torch.float32), folder, str(shard), key, "int8")


# -- defect 12: NaN / Inf weights -------------------------------------------------------------------------------------

def _nan(key):
    def edit(t):
        t[key] = t[key].clone()
        t[key].view(-1)[0] = float("nan")
    return edit


def test_native_files_full_of_nan_are_refused_naming_the_file_and_keys(native, tiny_h3_dir, tmp_path):
    from comfyui_h3.backend.models.native_load import load_native_vae

    load = _load_dit(tiny_h3_dir)
    _refused(load, _rewrite(native / "dit.safetensors", tmp_path / "nan.safetensors", _nan("blocks.0.mlp.fc1.weight")),
             "NaN or infinite", "blocks.0.mlp.fc1.weight")

    def inf_fp8(t):  # an FP8 weight dequantised to Inf by a huge (finite) scale
        t["blocks.1.attn.qkv_proj.weight_scale"] = torch.full_like(t["blocks.1.attn.qkv_proj.weight_scale"], 3e38)

    _refused(load, _rewrite(native / "quant.safetensors", tmp_path / "inf.safetensors", inf_fp8),
             "NaN or infinite", "blocks.1.attn.qkv_proj.weight")
    vae = _rewrite(native / "vae.safetensors", tmp_path / "vae_nan.safetensors", _nan("decoder.x_embedder.weight"))
    _refused(lambda p: load_native_vae(p, tiny_h3_dir / "vae"), vae, "decoder.x_embedder.weight")


def test_diffusers_folders_with_nan_weights_are_refused_naming_the_shard(tiny_h3_dir, tmp_path):
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
    from comfyui_h3.backend.pipelines.h3.components import _load_diffusers

    folder = shutil.copytree(tiny_h3_dir / "transformer", tmp_path / "transformer")
    shard = sorted(folder.glob("*.safetensors"))[1]
    key = sorted(load_file(shard))[0]
    _rewrite(shard, shard, _nan(key))
    _refused(lambda p: load_h3_transformer(p, dtype=torch.float32), folder, str(shard), key, "NaN or infinite")

    vae = shutil.copytree(tiny_h3_dir / "vae", tmp_path / "vae")
    weights = vae / "diffusion_pytorch_model.safetensors"
    key = sorted(k for k in load_file(weights) if k.startswith("decoder."))[0]
    _rewrite(weights, weights, _nan(key))
    _refused(lambda p: _load_diffusers(AutoencoderKLMiniMaxH3, "vae", p, torch.float32), vae, str(weights), key)

    from comfyui_h3.backend.pipelines.h3.components import load_text_encoder

    text = shutil.copytree(tiny_h3_dir / "text_encoder", tmp_path / "text_encoder")
    weights = text / "model.safetensors"
    key = sorted(k for k in load_file(weights) if ".layers.0.mlp." in k)[0]
    _rewrite(weights, weights, _nan(key))
    _refused(lambda p: load_text_encoder(p, torch.float32), text, str(weights), key)


def test_fasth3_adapter_with_nan_or_integer_tensors_is_refused(tiny_h3_dir, tmp_path):
    from comfyui_h3.backend.models.h3_transformer import load_h3_transformer
    from comfyui_h3.backend.models.tiny_fasth3 import make_tiny_fasth3

    adapter = make_tiny_fasth3(tmp_path / "ok" / "adapter_model.safetensors")
    load = lambda p: load_h3_transformer(tiny_h3_dir / "transformer", dtype=torch.float32, adapter=p)  # noqa: E731
    load(adapter)
    key = sorted(k for k in load_file(adapter) if k.endswith(".lora_B.weight"))[0]
    _refused(load, _rewrite(adapter, tmp_path / "nan.safetensors", _nan(key)), "NaN or infinite", key)
    _refused(load, _rewrite(adapter, tmp_path / "int.safetensors", lambda t: t.__setitem__(key, t[key].to(torch.int8))),
             "non-float", key)


def test_check_finite_covers_every_float_dtype_and_names_the_first_keys(tmp_path):
    from comfyui_h3.backend.models.checkpoint import check_finite

    good = {"a": torch.ones(3), "b": torch.ones(2, dtype=torch.float8_e4m3fn), "c": torch.arange(3)}
    check_finite(good, tmp_path / "f.safetensors")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        bad = dict(good, z=torch.tensor([1.0, float("nan")]).to(dtype))
        with pytest.raises(CheckpointError, match=r"f\.safetensors holds NaN or infinite values in 1 tensor\(s\): z"):
            check_finite(bad, tmp_path / "f.safetensors")
    module = torch.nn.Linear(2, 2)
    with torch.no_grad():
        module.bias[1] = float("-inf")
    with pytest.raises(CheckpointError, match="in 1 tensor.*: bias;"):
        check_finite(module, tmp_path / "f.safetensors")


# -- defect 12: SAM folders that are not their config's ---------------------------------------------------------------

@pytest.fixture(scope="module")
def sam(tmp_path_factory):
    from comfyui_h3.backend.tracking.tiny import make_tiny_sam2, make_tiny_sam3

    root = tmp_path_factory.mktemp("sam")
    return make_tiny_sam2(root / "sam2"), make_tiny_sam3(root / "sam3")


def _sam_refused(folder, *says):
    from comfyui_h3.backend.tracking.sam_models import TrackModelError, clear_track_models, load_track_model

    clear_track_models()
    with pytest.raises(TrackModelError) as info:
        load_track_model(folder, "cpu").click_model()
    message = str(info.value)
    assert str(folder) in message and "\n" not in message, message
    for text in says:
        assert text in message, message


def test_sam_folders_whose_weights_are_not_their_configs_are_refused(sam, tmp_path):
    sam2, sam3 = sam
    swapped = shutil.copytree(sam2, tmp_path / "sam2_with_sam3_config")
    shutil.copy(sam3 / "config.json", swapped / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json"):
        shutil.copy(sam3 / name, swapped / name)
    _sam_refused(swapped, "do not match its config.json's SAM3 model", "missing")

    partial = shutil.copytree(sam2, tmp_path / "sam2_partial")
    weights = partial / "model.safetensors"
    tensors = load_file(weights)
    kept = dict(sorted(tensors.items())[: 2 * len(tensors) // 3])
    save_file(kept, weights, metadata={"format": "pt"})
    _sam_refused(partial, "do not match its config.json's SAM2 model", "missing")

    nan = shutil.copytree(sam2, tmp_path / "sam2_nan")
    key = sorted(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)[0]
    _rewrite(nan / "model.safetensors", nan / "model.safetensors", _nan(key))
    _sam_refused(nan, "NaN or infinite", key, str(nan / "model.safetensors"))


# -- defect 14: crafted headers never break a listing ------------------------------------------------------------------

_SIGNS = {"video_patch_proj.weight": torch.zeros(2, 2), "audio_patch_proj.weight": torch.zeros(2, 2)}
_CRAFTED_METADATA = ['{"layers": 5}', '[1, 2]', '{"layers": {"a": 7}}', '{"layers": [1]}', "[" * 100000,
                     '{"layers": {"blocks.0.mlp.fc1": {"format": ["float8_e4m3fn"]}}}', "not json"]


def _crafted(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, meta in enumerate(_CRAFTED_METADATA):
        files.append(folder / f"crafted{i}.safetensors")
        save_file(_SIGNS, files[-1], metadata={"_quantization_metadata": meta})
    for i, raw in enumerate((torch.zeros(2, 3, dtype=torch.uint8), torch.tensor(list(b"[1]"), dtype=torch.uint8),
                             torch.tensor([1.5, 2.0]), torch.tensor(list(b"\xff\xfe"), dtype=torch.uint8))):
        files.append(folder / f"quant{i}.safetensors")
        save_file(dict(_SIGNS, **{"blocks.0.mlp.fc1.comfy_quant": raw}), files[-1])
    return files


def test_crafted_quantisation_headers_are_one_checkpoint_error(tmp_path):
    from comfyui_h3.backend.models.native_load import check_native_file

    for path in _crafted(tmp_path):
        _refused(lambda p: check_native_file(p, "transformer"), path)


def test_loader_lists_survive_crafted_and_damaged_files_said_once_in_the_log(native, tmp_path, monkeypatch, caplog):
    from comfyui_h3.nodes.loader import H3ModelLoader
    from comfyui_h3.nodes.track_mask import H3TrackMask

    root = tmp_path / "models"
    crafted = _crafted(root / "crafted")
    shutil.copy(native / "dit.safetensors", root / "dit.safetensors")
    (root / "truncated.safetensors").write_bytes((native / "dit.safetensors").read_bytes()[:100])
    sam = root / "sam_bad"
    sam.mkdir()
    (sam / "config.json").write_text(json.dumps({"model_type": ["sam2_video"]}))
    deep = root / "sam_deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100000)
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(root))
    with caplog.at_level(logging.WARNING, logger="comfyui_h3"):
        for _ in range(2):
            optional = H3ModelLoader.INPUT_TYPES()["optional"]
            assert optional["transformer"][0][1:] == ["dit.safetensors"]
            assert H3TrackMask.INPUT_TYPES()["required"]["model"][0][2:] == []
    skipped = [r.getMessage() for r in caplog.records if "skip" in r.getMessage()]
    for path in crafted + [root / "truncated.safetensors"]:
        assert sum(str(path) in m for m in skipped) == 1, (path, skipped)


def test_every_model_list_walk_skips_an_entry_its_reader_raises_on(tmp_path, caplog):
    """The one walk of all the lists (H3, FastH3, native, SeedVR2, SAM): whatever a reader raises on a file or
    folder, the rest is still listed and the skipped entry is logged once per version of it."""
    from comfyui_h3.comfy_services._fs import find_below

    (tmp_path / "a.safetensors").write_bytes(b"x")
    (tmp_path / "b.safetensors").write_bytes(b"y")
    (tmp_path / "m").mkdir()

    def reader(path, parts=None):
        if path.endswith(("a.safetensors", "m")):
            raise TypeError("'int' object is not iterable")
        return True

    with caplog.at_level(logging.WARNING, logger="comfyui_h3"):
        for _ in range(2):
            assert find_below(str(tmp_path), 2, folder_match=reader, file_match=reader) == ["b.safetensors"]
    skipped = [r.getMessage() for r in caplog.records if "skip" in r.getMessage()]
    assert len(skipped) == 2 and all("TypeError" in m for m in skipped), skipped


def test_cli_names_a_crafted_file_in_one_line(native, tiny_h3_dir, tmp_path, capsys):
    from comfyui_h3 import cli

    path = tmp_path / "crafted.safetensors"
    save_file(_SIGNS, path, metadata={"_quantization_metadata": '{"layers": 5}'})
    code = cli.main(["generate", "--prompt", "x", "--model", str(tiny_h3_dir), "--transformer", str(path),
                     "--steps", "1", "--out", str(tmp_path / "out.mp4")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and str(path) in err and "_quantization_metadata" in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
