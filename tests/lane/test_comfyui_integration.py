"""Integration lane: the pack inside a real ComfyUI, driven as a user would (HTTP API and `python -m comfyui_h3 run
--server`). Runs only when COMFYUI_DIR names a ComfyUI checkout (v0.8.0+) whose Python (COMFYUI_PYTHON, default: this
interpreter) has ComfyUI's requirements and torchvision; skipped otherwise. How the server is started and what it may
touch: tests/comfyui_lane.py (the `comfy` fixture, one server for this module).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from comfyui_lane import COMFYUI_DIR, LINK_NAME, NO_COMFYUI, RUN_TIMEOUT_S, WORKFLOWS, Comfy, combo_choices, probe_mp4

OUR_NODES = ("H3_ModelLoader", "H3_Sample", "H3_SaveVideo", "H3_LoadImage", "H3_LoadVideo", "H3_VideoComponents",
             "H3_Edit", "H3_MaskDraw", "H3_MaskPreview", "H3_LoRA")

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)


def _mp4s(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.endswith(".mp4")]


def _check_video(comfy: Comfy, result: subprocess.CompletedProcess, what: str) -> str:
    detail = f"{what}: exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, comfy.why(detail)
    files = _mp4s(result)
    assert len(files) == 1 and os.path.isfile(files[0]), comfy.why(detail)
    info = probe_mp4(files[0])
    assert info["frames"] == 124 and info["fps"] == 24.0 and info["audio"] == 1, info
    return files[0]


def test_object_info_lists_our_nodes(comfy):
    status, info = comfy.request("/object_info")
    assert status == 200
    missing = [name for name in OUR_NODES if name not in info]
    assert not missing, comfy.why(f"nodes missing from /object_info: {missing}")
    for name in OUR_NODES:
        node = info[name]
        assert node["python_module"] == f"custom_nodes.{LINK_NAME}", node["python_module"]
        assert node["category"] == "H3" and node["description"]
        for section in ("required", "optional"):
            for input_name, spec in node["input"].get(section, {}).items():
                options = spec[1] if len(spec) > 1 else {}
                assert options.get("tooltip"), f"{name}.{input_name} has no tooltip"
    assert info["H3_SaveVideo"]["output_node"] is True
    models = combo_choices(info["H3_ModelLoader"]["input"]["required"]["model"])
    assert "tiny-h3 (built-in test model, makes noise)" in models


def test_text_to_video_through_the_cli(comfy):
    checkout_output = sorted(os.listdir(Path(COMFYUI_DIR) / "output"))
    started = time.monotonic()
    result = comfy.run_cli("h3_text_to_video.api.json", comfy.root / "downloads", "2.steps=3")
    path = _check_video(comfy, result, "text-to-video run")
    print(f"text-to-video (tiny model build + engine start + 3 steps) in {time.monotonic() - started:.1f} s")
    assert "node 2: 3/3" in result.stderr, result.stderr  # progress came over the websocket
    assert Path(path).relative_to(comfy.root / "downloads") == Path("H3/text_to_video_00001.mp4")
    assert (comfy.output_dir / "H3" / "text_to_video_00001.mp4").is_file()  # ComfyUI wrote to our --output-directory
    assert sorted(os.listdir(Path(COMFYUI_DIR) / "output")) == checkout_output


def test_lora_node_chains_into_a_text_to_video_prompt(comfy):
    """Two H3 LoRA nodes between the loader and H3 Sample (the built-in tiny LoRA, stacked): the prompt runs and the
    video is saved; a negative strength is a valid choice."""
    status, info = comfy.request("/object_info/H3_LoRA")
    assert status == 200 and "tiny-h3-lora (built-in test LoRA for the tiny model)" in combo_choices(
        info["H3_LoRA"]["input"]["required"]["lora_name"]), comfy.why(str(info)[:2000])
    with open(WORKFLOWS / "h3_text_to_video.api.json") as handle:
        prompt = json.load(handle)
    tiny = "tiny-h3-lora (built-in test LoRA for the tiny model)"
    prompt["10"] = {"class_type": "H3_LoRA", "inputs": {"engine": ["1", 0], "lora_name": tiny, "strength": 0.8}}
    prompt["11"] = {"class_type": "H3_LoRA", "inputs": {"engine": ["10", 0], "lora_name": tiny, "strength": -0.3,
                                                        "time_scale": 0.5}}
    prompt["2"]["inputs"].update(engine=["11", 0], steps=2)
    prompt["3"]["inputs"].update(filename_prefix="H3/lora_text_to_video")
    status, body = comfy.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 200, body
    entry = comfy.wait_for_prompt(body["prompt_id"])
    assert entry["status"]["status_str"] == "success", comfy.why(json.dumps(entry["status"])[:3000])
    saved = sorted((comfy.output_dir / "H3").glob("lora_text_to_video_*.mp4"))
    assert len(saved) == 1 and probe_mp4(str(saved[0]))["frames"] == 124
    # another strength on the next prompt: the loaded engine switches in place (the same worker processes)
    workers = comfy.workers()
    prompt["10"]["inputs"]["strength"] = 0.5
    status, body = comfy.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 200, body
    entry = comfy.wait_for_prompt(body["prompt_id"])
    assert entry["status"]["status_str"] == "success", comfy.why(json.dumps(entry["status"])[:3000])
    assert len(sorted((comfy.output_dir / "H3").glob("lora_text_to_video_*.mp4"))) == 2
    assert comfy.workers() == workers, comfy.why(f"workers {workers} -> {comfy.workers()}: the model loaded again")


def test_bad_input_is_refused_before_running(comfy):
    prompt = json.loads((WORKFLOWS / "h3_text_to_video.api.json").read_text())
    cases = [("2", "prompt", "", "H3_Sample", "prompt is empty"),
             ("2", "steps", 0, "H3_Sample", "smaller than min"),
             ("1", "model", "no-such-model", "H3_ModelLoader", "not in list")]
    for node_id, name, value, class_type, message in cases:
        bad = json.loads(json.dumps(prompt))
        bad[node_id]["inputs"][name] = value
        status, reply = comfy.request("/prompt", {"prompt": bad, "client_id": uuid.uuid4().hex})
        assert status == 400, (name, status, reply)
        errors = reply["node_errors"]
        assert list(errors) == [node_id] and errors[node_id]["class_type"] == class_type, (name, errors)
        text = json.dumps(errors[node_id]["errors"])
        assert message in text, (name, text)
    status, queue = comfy.request("/queue")
    assert status == 200 and not queue["queue_running"] and not queue["queue_pending"]

    result = comfy.run_cli("h3_text_to_video.api.json", comfy.root / "downloads", '2.prompt=""')
    assert result.returncode == 2, result
    assert "node 2 (H3_Sample)" in result.stderr and "prompt is empty" in result.stderr, result.stderr


def test_free_stops_the_engine_and_the_next_run_restarts_it(comfy):
    before = comfy.workers()
    status, _ = comfy.request("/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    if before:  # psutil present and an earlier run started the engine: the workers must go
        deadline = time.monotonic() + 30
        while set(before) & set(comfy.workers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not set(before) & set(comfy.workers()), comfy.why(f"workers {before} still running after /free")

    # The server's next file is text_to_video_00002.mp4: a local file of that name must survive the download.
    downloads = comfy.root / "downloads"
    keep = downloads / "H3" / "text_to_video_00002.mp4"
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_bytes(b"mine")
    started = time.monotonic()
    result = comfy.run_cli("h3_text_to_video.api.json", downloads, "2.steps=3", "2.seed=1")
    path = _check_video(comfy, result, "run after /free")
    print(f"text-to-video after /free (engine restart + 3 steps) in {time.monotonic() - started:.1f} s")
    assert Path(path).name == "text_to_video_00002_1.mp4" and keep.read_bytes() == b"mine"
    if before:
        assert comfy.workers(), "no worker running after the run that followed /free"


def test_ctrl_c_in_the_cli_interrupts_the_prompt(comfy):
    cmd, env = comfy.cli("h3_text_to_video.api.json", comfy.root / "downloads", "2.steps=200", "2.seconds=14")
    proc = subprocess.Popen(cmd, cwd=str(comfy.root), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    seen, deadline = [], time.monotonic() + RUN_TIMEOUT_S
    try:
        while not any(line.startswith("node 2: ") for line in seen):  # denoising has started
            assert time.monotonic() < deadline and proc.poll() is None, comfy.why("".join(seen))
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    while not lines.empty():
        seen.append(lines.get())
    stderr = "".join(seen)
    assert "asked ComfyUI to stop prompt" in stderr, stderr
    prompt_id = next(line.split()[-1] for line in seen if line.startswith("queued as prompt "))
    entry = comfy.wait_for_prompt(prompt_id, timeout=60)
    events = [event for event, _ in entry["status"]["messages"]]
    assert "execution_interrupted" in events, comfy.why(str(entry["status"]))


def test_first_last_frame_workflow(comfy):
    import numpy as np
    from PIL import Image

    gradient = np.linspace(0, 255, 96 * 64 * 3).reshape(64, 96, 3).astype(np.uint8)
    Image.fromarray(gradient).save(comfy.input_dir / "h3_demo_first.png")
    Image.fromarray(gradient[::-1, ::-1]).save(comfy.input_dir / "h3_demo_last.png")
    started = time.monotonic()
    result = comfy.run_cli("h3_first_last_frame.api.json", comfy.root / "downloads", "4.steps=3",
                           without_aiohttp=True)  # the /history polling fallback of the client
    path = _check_video(comfy, result, "first/last-frame run")
    print(f"first/last-frame (3 steps, polling client) in {time.monotonic() - started:.1f} s")
    assert "aiohttp is not installed" in result.stderr, result.stderr
    assert Path(path).name.startswith("first_last_frame_")
    width, height = probe_mp4(path)["size"]
    assert abs(width / height - 1.5) < 0.05, (width, height)  # canvas follows the first keyframe's 3:2 aspect

    # A request the nodes accept at queue time but the sampler refuses (keyframes and references together): the run
    # fails on the server and the client reports the node's error.
    result = comfy.run_cli("h3_first_last_frame.api.json", comfy.root / "downloads", "4.steps=3",
                           '4.reference_images=["2", 0]')
    assert result.returncode == 2, result
    assert "node 4 (H3_Sample) failed" in result.stderr and "either keyframes" in result.stderr, result.stderr


def test_the_two_routes_to_1080p_and_a_restyle(comfy):
    """The shipped workflows of the latent route: one clip through H3 Refine and SeedVR2 x1.43 (both saved, each at
    its own grid's size), and a restyle from the pack's sample clip at denoise 0.35 (its soundtrack kept)."""
    result = comfy.run_cli("h3_refine_vs_upscale.api.json", comfy.root / "downloads", "2.steps=2", "3.steps=4")
    detail = f"two routes: exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, comfy.why(detail)
    files = sorted(_mp4s(result))
    assert [Path(f).name.split("_0")[0] for f in files] == ["route_h3_refine", "route_seedvr2"], files
    infos = [probe_mp4(f) for f in files]
    assert all(i["frames"] == 124 and i["audio"] == 1 for i in infos), infos
    refined, upscaled = (i["size"] for i in infos)
    assert refined[0] % 32 == 0 and refined[1] % 32 == 0 and abs(upscaled[0] - refined[0]) <= 16, (refined, upscaled)
    result = comfy.run_cli("h3_video_restyle.api.json", comfy.root / "downloads", "3.steps=4")
    _check_video(comfy, result, "restyle")


def _defaults_from_object_info(info: dict, class_type: str, **given) -> dict:
    """API inputs for a node: `given` plus each other required widget at its default (a combo's first choice)."""
    inputs = dict(given)
    for name, spec in info[class_type]["input"]["required"].items():
        if name in inputs:
            continue
        kind, options = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
        if isinstance(kind, list):
            inputs[name] = options.get("default", kind[0])
        elif kind == "COMBO":  # newer ComfyUI spells combos as ("COMBO", {"options": [...]})
            inputs[name] = options.get("default", (options.get("options") or [None])[0])
        elif "DYNAMICCOMBO" in str(kind):  # 0.3x: a combo whose choices bring inputs ({"key": ..., "inputs": ...})
            first = (options.get("options") or [{}])[0]
            inputs[name] = options.get("default", first.get("key") if isinstance(first, dict) else first)
        elif "default" in options:
            inputs[name] = options["default"]
    return inputs


def test_video_nodes_interoperate_with_core(comfy, tmp_path):
    """Our Load Video feeds core SaveVideo, and core LoadVideo feeds our Save Video."""
    import numpy as np

    from comfyui_h3.backend.media.encode import Mp4Writer

    clip = comfy.input_dir / "interop_clip.mp4"
    frames = np.zeros((30, 48, 64, 3), np.uint8)
    frames[..., 0] = np.arange(30, dtype=np.uint8)[:, None, None] * 8
    t = np.arange(32000) / 32000
    with Mp4Writer(str(clip), 64, 48, 24, audio_sample_rate=32000) as writer:
        writer.write_frames(frames)
        writer.write_audio(np.stack([np.sin(2 * np.pi * 440 * t)] * 2).astype(np.float32) * 0.2)
    status, info = comfy.request("/object_info")
    assert status == 200 and "SaveVideo" in info and "LoadVideo" in info, comfy.why("core video nodes missing")

    ours_to_core = {
        "1": {"class_type": "H3_LoadVideo", "inputs": _defaults_from_object_info(info, "H3_LoadVideo", video=clip.name)},
        "2": {"class_type": "SaveVideo", "inputs": _defaults_from_object_info(
            info, "SaveVideo", video=["1", 0], filename_prefix="interop/ours_to_core")},
    }
    core_to_ours = {
        "1": {"class_type": "LoadVideo", "inputs": _defaults_from_object_info(info, "LoadVideo", file=clip.name)},
        "2": {"class_type": "H3_SaveVideo", "inputs": _defaults_from_object_info(
            info, "H3_SaveVideo", video=["1", 0], filename_prefix="interop/core_to_ours")},
    }
    for name, prompt in (("ours_to_core", ours_to_core), ("core_to_ours", core_to_ours)):
        path = tmp_path / f"{name}.api.json"
        path.write_text(json.dumps(prompt))
        result = comfy.run_cli(str(path), tmp_path / name)
        detail = f"{name}: exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        assert result.returncode == 0, comfy.why(detail)
        (saved,) = [line for line in result.stdout.splitlines() if line.strip()]
        probe = probe_mp4(saved)
        assert probe["frames"] == 30 and probe["fps"] == 24.0 and probe["size"] == (64, 48), (name, probe)
        assert probe["audio"] == 1, (name, probe)


def test_mask_widget_assets_and_frame_route(comfy):
    """The mask editor's script is served, and its frame route reads only the input folder."""
    import numpy as np

    from comfyui_h3.backend.media.encode import Mp4Writer

    with Mp4Writer(str(comfy.input_dir / "route_clip.mp4"), 64, 48, 24) as writer:
        writer.write_frames(np.full((12, 48, 64, 3), 90, np.uint8))
    for script in ("mask_draw.js", "mask_logic.js", "mask_canvas.js"):
        with urllib.request.urlopen(f"{comfy.url}/extensions/{LINK_NAME}/{script}", timeout=10) as resp:
            assert resp.status == 200 and b"function" in resp.read(), script
    with urllib.request.urlopen(f"{comfy.url}/h3/video_frame?video=route_clip.mp4&frame=3&max_size=64",
                                timeout=30) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("image/jpeg")
        assert resp.read()[:2] == b"\xff\xd8"
    status, _ = comfy.request("/h3/video_frame?video=../../etc/passwd&frame=0")
    assert status in (400, 403, 404), status
