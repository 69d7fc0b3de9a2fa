"""The shipped workflows that use ComfyUI's own MiniMax-H3 nodes (comfyui_h3/native_workflows.py): "native H3 sample
-> our H3 Extend -> SeedVR2 upscale" and "our H3 Sample -> native VAE decode". They need ComfyUI 0.30.0+ and the
Comfy-Org/MiniMax-H3 files, so here they are checked structurally: every node is ours or one of the core nodes the
list names (tests/native_nodes.py declares those as ComfyUI does), the UI file exports to its API twin, and the API
workflow validates as ComfyUI's /prompt would (links, types, required inputs, ranges, choices) with the release's
file names present in the model folders. The lane compares the stand-ins with a real ComfyUI's /object_info when it
has the native nodes, and says why it cannot otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, TEMPLATES, WORKFLOWS, probe_mp4
from native_comfy import nested_tensor_comfy
from native_nodes import NATIVE_NODE_CLASSES

from comfyui_h3.native_workflows import MIN_COMFYUI, NATIVE_WORKFLOWS


def _ui(name: str) -> dict:
    return json.loads((TEMPLATES / f"{name}.json").read_text())


def _api(name: str) -> dict:
    return json.loads((WORKFLOWS / f"{name}.api.json").read_text())


def test_native_workflows_are_shipped_and_say_what_they_need():
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    shipped = sorted(p.stem for p in TEMPLATES.glob("*.json"))
    assert set(NATIVE_WORKFLOWS) <= set(shipped)
    for name in shipped:
        types = {n["class_type"] for n in _api(name).values()}
        foreign = types - set(NODE_CLASS_MAPPINGS)
        if name not in NATIVE_WORKFLOWS:
            assert not foreign, (name, foreign)  # every other workflow runs with this pack alone
            continue
        assert foreign == set(NATIVE_WORKFLOWS[name]) and foreign <= set(NATIVE_NODE_CLASSES), (name, foreign)
        notes = [n["widgets_values"][0] for n in _ui(name)["nodes"] if n["type"] == "Note"]
        assert any(f"ComfyUI {MIN_COMFYUI} or newer" in note for note in notes), name


@pytest.fixture
def release_named_files(tmp_path, monkeypatch, tiny_h3_dir):
    """The tiny set's native files under the release's file names in a model folder (the loader lists what its
    folders hold)."""
    from comfyui_h3.backend.models.native_write import (write_native_audio_vae, write_native_text_encoder,
                                                        write_native_transformer, write_native_vae)
    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    root = tmp_path / "models"
    write_native_transformer(tiny_h3_dir / "transformer", root / "minimax_h3_fl2va_bf16.safetensors")
    write_native_transformer(tiny_h3_dir / "transformer_ref", root / "minimax_h3_ref2va_bf16.safetensors")
    write_native_text_encoder(tiny_h3_dir / "text_encoder", root / "qwen3vl_32b_minimax_h3_bf16.safetensors",
                              TEXT_LAYER)
    write_native_vae(tiny_h3_dir / "vae", root / "minimax_h3_video_vae_fp16.safetensors")
    write_native_audio_vae(tiny_h3_dir / "audio_vae", root / "minimax_h3_audio_vae_fp32.safetensors")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(root))
    return root


@pytest.mark.parametrize("name", sorted(NATIVE_WORKFLOWS))
def test_native_workflow_exports_to_its_twin_and_validates(name, monkeypatch, release_named_files):
    from comfyui_h3.workflow_format import ui_to_api
    from comfyui_h3.workflow_validation import validate_workflow

    with nested_tensor_comfy(monkeypatch) as modules:  # a ComfyUI with NestedTensor: the native LATENT sockets
        classes = dict(modules[-1].NODE_CLASS_MAPPINGS, **NATIVE_NODE_CLASSES)
        api = _api(name)
        assert ui_to_api(_ui(name), classes) == api
        prompt, outputs = validate_workflow(api, classes)
    assert [prompt[o]["class_type"] for o in outputs] == ["H3_SaveVideo"]
    latent_links = [(nid, k) for nid, n in api.items() for k, v in n["inputs"].items()
                    if isinstance(v, list) and classes[api[v[0]]["class_type"]].RETURN_TYPES[v[1]] == "LATENT"]
    assert latent_links  # the native LATENT crosses between the two sides


def test_without_native_nodes_the_runner_names_them(release_named_files):
    """`python -m comfyui_h3 run` (no --server) refuses them before anything runs, saying where they run."""
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS
    from comfyui_h3.workflow_validation import WorkflowError, validate_workflow

    for name, types in NATIVE_WORKFLOWS.items():
        with pytest.raises(WorkflowError, match="Not nodes of this pack: .*--server URL") as info:
            validate_workflow(_api(name), NODE_CLASS_MAPPINGS)
        assert all(t in str(info.value) for t in types)


@pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)
def test_stand_ins_match_the_lane_comfyui_or_it_says_why_not(comfy):
    """The stand-ins' inputs (names, order) and outputs are the real nodes' for every node type this ComfyUI has;
    the native MiniMax-H3 ones exist only from 0.30.0 on (then the whole check runs)."""
    status, info = comfy.request("/object_info")
    assert status == 200
    for node_type, cls in NATIVE_NODE_CLASSES.items():
        if node_type not in info:
            continue
        spec, real = cls.INPUT_TYPES(), info[node_type]["input"]
        for section in ("required", "optional"):
            assert list(spec[section]) == [k for k in real.get(section, {}) if k in spec[section]], node_type
            assert set(spec["required"]) <= set(real["required"]), node_type
        assert tuple(info[node_type]["output"]) == cls.RETURN_TYPES, node_type
    missing = sorted({t for types in NATIVE_WORKFLOWS.values() for t in types} - set(info))
    if missing:
        version = (Path(COMFYUI_DIR) / "comfyui_version.py").read_text().split('"')[-2]
        pytest.skip(f"this lane's ComfyUI {version} lacks {', '.join(missing)}: the native-interop workflows need "
                    f"ComfyUI {MIN_COMFYUI}+ (checked structurally by the tests above)")


@pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)
def test_native_latent_crosses_nodes_in_a_real_comfyui(comfy, tmp_path):
    """With a ComfyUI that has NestedTensor (the lane's 0.8.0 does) our nodes show the native LATENT; H3 Sample's
    native_latent output, ComfyUI's own NestedTensor, continues in H3 Extend through /prompt (tiny model, 1 step)."""
    import uuid

    from comfyui_h3.tiny_model import TINY_NAME

    status, info = comfy.request("/object_info")
    assert info["H3_Sample"]["output"][-1] == "LATENT" and info["H3_Sample"]["output_name"][-1] == "native_latent"
    assert "native_latent" in info["H3_Extend"]["input"]["optional"]
    prompt = {
        "1": {"class_type": "H3_ModelLoader", "inputs": {"model": TINY_NAME, "device": "cpu", "dtype": "float32",
                                                         "attention": "sdpa", "sp_degree": 1, "gpus": "",
                                                         "executor": "mp", "ray_address": ""}},
        "2": {"class_type": "H3_Sample", "inputs": {"engine": ["1", 0], "prompt": "a kite", "seconds": 5.0,
                                                    "width": 128, "height": 64, "steps": 1, "video_shift": 0.0,
                                                    "audio_shift": 0.0, "seed": 1}},
        "3": {"class_type": "H3_Extend", "inputs": {"engine": ["1", 0], "prompt": "it lands", "seconds": 0.5,
                                                    "windows": 0, "window_frames": 56, "overlap_frames": 22,
                                                    "audio_mode": "continue", "steps": 1, "video_shift": 0.0,
                                                    "audio_shift": 0.0, "seed": 1, "native_latent": ["2", 3]}},
        "4": {"class_type": "H3_SaveVideo", "inputs": {"video": ["3", 0], "filename_prefix": "H3/native_latent",
                                                       "crf": 18, "preset": "veryfast", "fps": 24.0}},
    }
    status, reply = comfy.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 200, reply
    entry = comfy.wait_for_prompt(reply["prompt_id"])
    assert entry["status"]["status_str"] == "success", comfy.why(str(entry["status"]))
    (item,) = entry["outputs"]["4"]["images"]
    saved = tmp_path / "native_latent.mp4"
    saved.write_bytes(comfy.view(item))
    # 124 frames, then windows of 56 (34 new frames each) until 0.5 s more (12 frames, a whole 17-frame chunk)
    assert probe_mp4(str(saved))["frames"] == 124 + 17 and probe_mp4(str(saved))["size"] == (128, 64)
