"""The pack as ComfyUI sees it: loaded by path as a package, node schemas (tooltips, IDs), queue-time validation,
and the nodes run end to end (loader -> sample -> save) into an output folder without overwriting."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_loads_by_path_like_comfyui_without_shadowing_its_nodes_module(tmp_path):
    # A clean interpreter, no install, cwd elsewhere: exactly how ComfyUI's loader imports custom_nodes/<folder>.
    script = textwrap.dedent(f"""
        import importlib.util, json, sys, types
        sys.modules["nodes"] = types.ModuleType("nodes")  # ComfyUI's own top-level module
        sentinel = sys.modules["nodes"]
        path = {os.path.join(REPO, "__init__.py")!r}
        spec = importlib.util.spec_from_file_location("custom_nodes.comfyui-h3", path,
                                                      submodule_search_locations=[{REPO!r}])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        assert sys.modules["nodes"] is sentinel, "the pack shadowed ComfyUI's nodes module"
        print(json.dumps({{"nodes": sorted(module.NODE_CLASS_MAPPINGS), "web": module.WEB_DIRECTORY,
                           "names": module.NODE_DISPLAY_NAME_MAPPINGS}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"H3_LoadImage", "H3_LoadVideo", "H3_ModelLoader", "H3_Sample", "H3_SaveVideo",
            "H3_VideoComponents"} <= set(info["nodes"])
    assert set(info["names"]) == set(info["nodes"])
    assert os.path.isdir(os.path.join(REPO, info["web"]))


def test_every_input_has_a_tooltip_and_ids_have_the_pack_prefix():
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        assert node_id.startswith("H3_") and not node_id.startswith(("MiniMax", "SeedVR2", "Minimax"))
        spec = cls.INPUT_TYPES()
        for section in ("required", "optional"):
            for name, value in spec.get(section, {}).items():
                assert len(value) > 1 and value[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
        assert cls.CATEGORY == "H3" and hasattr(cls, cls.FUNCTION)


@pytest.mark.parametrize("inputs,message", [
    (dict(prompt="  ", seconds=5.0, width=0, height=0), "prompt is empty"),
    (dict(prompt="x", seconds=16.0, width=0, height=0), "5 to 15 s"),
    (dict(prompt="x", seconds=5.0, width=1344, height=0), "both width and height"),
    (dict(prompt="x", seconds=5.0, width=1344, height=100), "multiples of 32"),
    (dict(prompt="x", seconds=5.0, width=2048, height=256), "aspect ratios"),
])
def test_sample_refuses_bad_input_at_queue_time(inputs, message):
    from comfyui_h3.nodes.sample import H3Sample

    verdict = H3Sample.VALIDATE_INPUTS(**inputs)
    assert verdict is not True and message in verdict
    assert H3Sample.VALIDATE_INPUTS(prompt="x", seconds=5.0, width=1344, height=768) is True
    assert H3Sample.VALIDATE_INPUTS(prompt=None, seconds=None, width=None, height=None) is True  # linked inputs


def test_nodes_end_to_end_and_never_overwrite(tmp_path, monkeypatch, tiny_h3_dir):
    import av
    import numpy as np
    import torch

    from comfyui_h3.backend.engine import shutdown_all
    from comfyui_h3.nodes.load_image import H3LoadImage
    from comfyui_h3.nodes.loader import H3ModelLoader
    from comfyui_h3.nodes.sample import H3Sample
    from comfyui_h3.nodes.save_video import H3SaveVideo
    from PIL import Image

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path / "in"))
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    os.makedirs(tmp_path / "in")
    Image.fromarray(np.full((40, 72, 3), 200, np.uint8)).save(tmp_path / "in" / "key.png")
    assert "key.png" in H3LoadImage.INPUT_TYPES()["required"]["image"][0]
    assert tiny_h3_dir.name in H3ModelLoader.INPUT_TYPES()["required"]["model"][0]

    (handle,) = H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa")
    (image,) = H3LoadImage().load("key.png")
    assert tuple(image.shape) == (1, 40, 72, 3) and image.dtype == torch.float32
    try:
        video, audio, latents = H3Sample().sample(handle, "waves on rocks", 5.0, 0, 0, 2, 12.0, 3.0, 3,
                                                   first_frame=image)
    finally:
        shutdown_all()
    assert video.get_frame_count() == 124 and float(video.get_frame_rate()) == 24.0
    assert video.get_dimensions() == (128, 64)  # the keyframe's ~16:9 aspect on the tiny canvas
    assert audio["sample_rate"] == 32000 and audio["waveform"].shape[:2] == (1, 2)
    assert tuple(latents.video.shape) == (1, 24, 37, 4, 8)

    first = H3SaveVideo().save(video, "clips/h3", 18, "ultrafast")["ui"]["images"][0]
    second = H3SaveVideo().save(video, "clips/h3", 18, "ultrafast")["ui"]["images"][0]
    assert first["filename"] != second["filename"] and first["subfolder"] == "clips"
    with av.open(str(tmp_path / "out" / "clips" / first["filename"])) as container:
        assert container.streams.video[0].frames in (0, 124)
        frames = sum(1 for _ in container.decode(video=0))
        assert frames == 124 and container.streams.audio[0].rate == 32000
        assert container.streams.audio[0].channels == 2


def test_outside_paths_are_refused(monkeypatch, tmp_path):
    from comfyui_h3.comfy_services import UnsafePathError
    from comfyui_h3.nodes.load_image import H3LoadImage

    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path))
    assert H3LoadImage.VALIDATE_INPUTS("../../etc/passwd") is not True
    with pytest.raises((UnsafePathError, ValueError, FileNotFoundError)):
        H3LoadImage().load("../../etc/passwd")


@pytest.mark.parametrize("device,degree,gpus,want", [
    ("cpu", 2, "", ("cpu", 2)),
    ("cuda", 1, "", ("cuda", 1)),
    ("cuda", 4, "0,1,2,3", ("cuda:0,1,2,3", 4)),
    ("cuda", 2, "3, 5", ("cuda:3,5", 2)),
])
def test_loader_device_resolution(device, degree, gpus, want):
    from comfyui_h3.nodes.loader import resolve_devices

    assert resolve_devices(device, degree, gpus) == want


def test_loader_refuses_bad_gpu_lists_and_degrees(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes.loader import H3ModelLoader, resolve_devices

    with pytest.raises(ValueError, match="one GPU per rank"):
        resolve_devices("cuda", 4, "0,1")
    with pytest.raises(ValueError, match="GPU ids"):
        resolve_devices("cuda", 2, "zero,one")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    with pytest.raises(ValueError, match="does not divide"):
        H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa", 3, "")
    (handle,) = H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa", 2, "")
    assert handle.config.world_size == 2 and handle.config.device_for(1) == "cpu"
