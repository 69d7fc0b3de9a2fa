"""This pack beside ComfyUI's own MiniMax-H3 nodes (comfy_extras/nodes_minimax_h3.py, ComfyUI 0.30.0+), in a real
ComfyUI (the integration lane; skipped without COMFYUI_DIR, and on a core without those nodes, saying which).

Both load with no node ID, display name or socket type of one taken by the other, and the two native-interop
workflows run as far as tiny weights allow. The tiny set's files, under the release's names, go in a model folder of
ComfyUI's own (extra_model_paths.yaml). Where they stop, exactly: ComfyUI's native loaders build the released
architectures at their released widths, except UNETLoader, which reads the DiT's widths from the file. So the tiny
DiT loads natively, but the native VAELoader (video VAE: MiniMaxH3VideoVAE; audio VAE: MiniMaxH3AudioVAE) and the
native CLIPLoader of type minimax (the released Qwen3-VL-32B text encoder: MiniMaxQwen3VL) refuse the tiny files with
a size mismatch. "Our H3 Sample -> native decode": our loader as shipped (model "none", the release's configs)
refuses the tiny files itself, naming one; given the tiny set's configs it runs its H3 half on the same native files,
and the whole workflow stops at the native video VAELoader;
"native sample -> our H3 Extend -> SeedVR2" stops before the native conditioning (MiniMaxH3ImageToVideo needs the
native text encoder and video VAE), so KSampler and everything after it never run on tiny weights."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from comfyui_lane import COMFYUI_DIR, LINK_NAME, NO_COMFYUI, WORKFLOWS, probe_mp4, running_comfyui

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)

NATIVE_MODULE = "comfy_extras.nodes_minimax_h3"
PACK_MODULE = f"custom_nodes.{LINK_NAME}"
# The native MiniMax-H3 nodes the shipped workflows use and where ComfyUI keeps them.
NATIVE_H3_NODES = ("MiniMaxH3ImageToVideo", "MiniMaxH3SigmaShift")


def _release_named_files(tiny: Path, models: Path) -> None:
    """The tiny set as the release's native single files, in ComfyUI's folder layout."""
    from comfyui_h3.backend.models.native_write import (write_native_audio_vae, write_native_text_encoder,
                                                        write_native_transformer, write_native_vae)
    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    write_native_transformer(tiny / "transformer", models / "diffusion_models" / "minimax_h3_fl2va_bf16.safetensors")
    write_native_transformer(tiny / "transformer_ref",
                             models / "diffusion_models" / "minimax_h3_ref2va_bf16.safetensors")
    write_native_text_encoder(tiny / "text_encoder",
                              models / "text_encoders" / "qwen3vl_32b_minimax_h3_bf16.safetensors", TEXT_LAYER)
    write_native_vae(tiny / "vae", models / "vae" / "minimax_h3_video_vae_fp16.safetensors")
    write_native_audio_vae(tiny / "audio_vae", models / "vae" / "minimax_h3_audio_vae_fp32.safetensors")


@pytest.fixture(scope="module")
def native(tmp_path_factory, tiny_h3_dir):
    """(server, /object_info) of a ComfyUI whose model folders hold the tiny set under the release's names; a skip
    on a core without the native MiniMax-H3 nodes."""
    if not (Path(COMFYUI_DIR) / "comfy_extras" / "nodes_minimax_h3.py").is_file():
        version = (Path(COMFYUI_DIR) / "comfyui_version.py").read_text().split('"')[-2]
        pytest.skip(f"this lane's ComfyUI {version} has no native MiniMax-H3 nodes (comfy_extras/nodes_minimax_h3.py, "
                    "ComfyUI 0.30.0+)")
    root = tmp_path_factory.mktemp("native_comfyui")
    models = root / "models"
    _release_named_files(tiny_h3_dir, models)
    config = root / "extra_model_paths.yaml"
    config.write_text(f"h3_lane:\n  base_path: {models}\n  diffusion_models: diffusion_models/\n"
                      "  text_encoders: text_encoders/\n  vae: vae/\n")
    (root / "server").mkdir()
    with running_comfyui(root / "server", ("--extra-model-paths-config", str(config))) as server:
        status, info = server.request("/object_info")
        assert status == 200, server.why(str(info)[:2000])
        # the file is there, so its nodes must load (an import error, e.g. no torchaudio, fails here)
        assert any(node.get("python_module") == NATIVE_MODULE for node in info.values()), server.why(
            f"{NATIVE_MODULE} is in this ComfyUI but none of its nodes loaded")
        yield server, info


def _run(server, prompt: dict) -> dict:
    status, reply = server.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 200, server.why(json.dumps(reply)[:3000])
    return server.wait_for_prompt(reply["prompt_id"])


def _error(server, entry: dict) -> dict:
    """The execution_error of a finished prompt (it must have failed)."""
    assert entry["status"]["status_str"] == "error", server.why(json.dumps(entry["status"])[:3000])
    (error,) = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    return error


def _tiny_settings(prompt: dict) -> dict:
    """A shipped workflow at the tiny model's scale: CPU, float32, a small canvas, one step."""
    for node in prompt.values():
        inputs = node["inputs"]
        if node["class_type"] in ("H3_ModelLoader", "H3_SeedVR2Loader"):
            inputs.update(device="cpu", dtype="float32")
        if node["class_type"] == "H3_Sample":
            inputs.update(width=128, height=64, steps=1)
        if node["class_type"] == "MiniMaxH3ImageToVideo":
            inputs.update(width=128, height=64, length=5)
        if node["class_type"] in ("KSampler", "H3_Extend"):
            inputs.update(steps=1)
    return prompt


def _workflow(name: str) -> dict:
    return _tiny_settings(json.loads((WORKFLOWS / f"{name}.api.json").read_text()))


def _types(node: dict) -> set[str]:
    found = set(node.get("output", ()))
    for section in ("required", "optional"):
        for spec in node.get("input", {}).get(section, {}).values():
            if isinstance(spec, list) and spec and isinstance(spec[0], str):
                found.add(spec[0])
    return found


def test_pack_loads_beside_the_native_h3_nodes_with_no_collision(native):
    """ComfyUI drops a custom node whose ID a core node already has (and a later one replaces an earlier display
    name or socket type silently), so: every ID of ours is served by this pack, every native MiniMax-H3 node by
    ComfyUI, no display name is both, and the socket types both sides use are ComfyUI's general ones (used by core
    nodes other than the native H3 ones too), never a type one side made up (H3_ENGINE, ...)."""
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    server, info = native
    log = server.log(200000)
    assert not re.search(r"IMPORT FAILED.*(comfyui-h3|nodes_minimax_h3)|Cannot import .*(comfyui-h3|nodes_minimax_h3)",
                         log), server.why("an import failed")
    ours = {name: node for name, node in info.items() if node.get("python_module") == PACK_MODULE}
    natives = {name: node for name, node in info.items() if node.get("python_module") == NATIVE_MODULE}
    assert set(ours) == set(NODE_CLASS_MAPPINGS), server.why(f"not ours: {set(NODE_CLASS_MAPPINGS) - set(ours)}")
    assert set(NATIVE_H3_NODES) <= set(natives), sorted(natives)
    assert not set(ours) & set(natives)
    assert not {n["display_name"] for n in ours.values()} & {n["display_name"] for n in natives.values()}

    general = set().union(*(_types(node) for name, node in info.items()
                            if node.get("python_module") not in (PACK_MODULE, NATIVE_MODULE)))
    our_types = set().union(*(_types(node) for node in ours.values()))
    native_types = set().union(*(_types(node) for node in natives.values()))
    shared = our_types & native_types
    assert shared <= general, f"types both sides use that ComfyUI's other nodes do not: {shared - general}"
    assert "LATENT" in shared  # the native LATENT is what crosses between the two sides
    assert our_types - general == {"H3_ENGINE", "H3_LATENTS", "SEEDVR2_ENGINE"}  # ours alone, not the core's


def test_sample_then_native_decode_runs_its_h3_half_and_stops_at_the_native_vae(native, tmp_path):
    from comfyui_h3.tiny_model import TINY_NAME

    server, _ = native
    prompt = _workflow("h3_sample_then_native_decode")
    half = {key: prompt[key] for key in ("1", "2")}  # our half: the H3 loader on the native files, H3 Sample
    half["9"] = {"class_type": "H3_SaveVideo", "inputs": {"video": ["2", 0], "filename_prefix": "H3/native_half",
                                                          "crf": 18, "preset": "veryfast", "fps": 24.0}}
    # As shipped (model "none": the release's configs) our loader refuses the tiny files itself, naming one.
    error = _error(server, _run(server, half))
    assert error["node_type"] == "H3_Sample" and "CheckpointError" in error["exception_message"], error
    assert re.search(r"minimax_h3_\w+\.safetensors", error["exception_message"]), error
    # With the tiny set's configs (model: the tiny folder) it takes the same native single files and runs; the whole
    # workflow then reaches the native decode.
    prompt["1"]["inputs"]["model"] = TINY_NAME
    entry = _run(server, half)
    assert entry["status"]["status_str"] == "success", server.why(json.dumps(entry["status"])[:3000])
    (item,) = entry["outputs"]["9"]["images"]
    saved = tmp_path / "half.mp4"
    saved.write_bytes(server.view(item))
    assert probe_mp4(str(saved))["size"] == (128, 64)
    # The whole workflow: the native VAELoader builds the released video VAE and refuses the tiny one.
    error = _error(server, _run(server, prompt))
    assert (error["node_id"], error["node_type"]) == ("3", "VAELoader"), error
    assert "MiniMaxH3VideoVAE" in error["exception_message"] and "size mismatch" in error["exception_message"]
    assert not set(error["executed"]) & {"4", "5", "6", "7"}, error  # nothing native decoded, nothing saved


def test_native_sample_workflow_stops_at_the_native_loaders_that_need_released_weights(native):
    server, _ = native
    prompt = _workflow("h3_native_sample_then_extend_upscale")
    error = _error(server, _run(server, prompt))
    assert error["node_type"] in ("VAELoader", "CLIPLoader") and error["node_id"] in ("2", "3"), error
    assert "size mismatch" in error["exception_message"], error
    assert not set(error["executed"]) & {"4", "6", "8", "10", "11"}, error  # no conditioning, sampling, H3, save

    def alone(node_id: str) -> dict:
        """One native node of the workflow (and what it reads), shown by ComfyUI's Preview as Text."""
        needed, todo = {}, [node_id]
        while todo:
            key = todo.pop()
            needed[key] = prompt[key]
            todo += [v[0] for v in prompt[key]["inputs"].values() if isinstance(v, list)]
        return _run(server, dict(needed, show={"class_type": "PreviewAny", "inputs": {"source": [node_id, 0]}}))

    # The native DiT path takes the tiny DiT: UNETLoader reads its widths from the file.
    entry = alone("5")  # UNETLoader -> MiniMaxH3SigmaShift
    assert entry["status"]["status_str"] == "success", server.why(json.dumps(entry["status"])[:3000])
    # The text encoder and both VAEs are built at the release's widths.
    for node_id, architecture in (("2", "MiniMaxQwen3VL"), ("3", "MiniMaxH3VideoVAE")):
        error = _error(server, alone(node_id))
        assert error["node_id"] == node_id and architecture in error["exception_message"], error
        assert "size mismatch" in error["exception_message"], error
    audio = {"a": {"class_type": "VAELoader", "inputs": {"vae_name": "minimax_h3_audio_vae_fp32.safetensors"}},
             "show": {"class_type": "PreviewAny", "inputs": {"source": ["a", 0]}}}
    error = _error(server, _run(server, audio))
    assert error["node_id"] == "a" and "MiniMaxH3AudioVAE" in error["exception_message"], error
