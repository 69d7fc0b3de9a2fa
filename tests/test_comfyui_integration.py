"""Integration lane: the pack inside a real ComfyUI, driven as a user would (HTTP API and `python -m comfyui_h3 run
--server`). Runs only when COMFYUI_DIR names a ComfyUI checkout (v0.8.0+) whose Python (COMFYUI_PYTHON, default: this
interpreter) has ComfyUI's requirements and torchvision; skipped otherwise.

The test links this repo into COMFYUI_DIR/custom_nodes/comfyui-h3 and removes the link afterwards (a link to this repo
that is already there is used and left alone; anything else of that name is never touched). It starts ComfyUI with
--cpu on 127.0.0.1 and a free port, loading only this pack, with its input/output/temp/user folders and database in a
temporary folder: nothing is written into the checkout (bar Python's __pycache__). ComfyUI's output goes to a log file
that failing assertions print. The tiny model is built into COMFYUI_H3_CACHE (COMFYUI_H3_TEST_CACHE to reuse one
across sessions, else a temporary folder).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / "workflows"
LINK_NAME = "comfyui-h3"
OUR_NODES = ("H3_ModelLoader", "H3_Sample", "H3_SaveVideo", "H3_LoadImage", "H3_LoadVideo", "H3_VideoComponents",
             "H3_Edit", "H3_MaskDraw", "H3_MaskPreview")
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(
    not COMFYUI_DIR, reason="COMFYUI_DIR is unset: point it at a ComfyUI checkout (v0.8.0+) to run this lane")


class Comfy:
    def __init__(self, proc: subprocess.Popen, url: str, root: Path, log_path: Path):
        self.proc, self.url, self.root, self.log_path = proc, url, root, log_path
        self.input_dir, self.output_dir = root / "input", root / "output"

    def log(self, tail: int = 12000) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(no ComfyUI log: {exc})"
        return text[-tail:]

    def why(self, what: str) -> str:
        return f"{what}\n--- ComfyUI log ({self.log_path}) ---\n{self.log()}"

    def request(self, path: str, body: dict | None = None, timeout: float = 60):
        """(status, parsed JSON or text) of a GET, or a POST when `body` is given."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def workers(self) -> list[int]:
        """Pids of the pack's spawned worker processes under this ComfyUI (empty without psutil)."""
        try:
            import psutil
        except ImportError:
            return []
        pids = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if any("spawn_main" in part for part in child.cmdline()):
                    pids.append(child.pid)
            except psutil.Error:
                continue
        return pids

    def cli(self, workflow: str, out_dir: Path, *sets: str, without_aiohttp: bool = False) -> tuple[list, dict]:
        """Command line and env of `python -m comfyui_h3 run WORKFLOW --server URL` (optionally as if aiohttp were
        not installed: the client then polls /history)."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        entry = ["-m", "comfyui_h3"]
        if without_aiohttp:
            entry = ["-c", "import sys; sys.modules['aiohttp'] = None; from comfyui_h3.cli import main; "
                           "sys.exit(main())"]
        cmd = [sys.executable, *entry, "run", str(WORKFLOWS / workflow), "--server", self.url, "--out-dir",
               str(out_dir)]
        for item in sets:
            cmd += ["--set", item]
        return cmd, env

    def run_cli(self, workflow: str, out_dir: Path, *sets: str, **kw) -> subprocess.CompletedProcess:
        cmd, env = self.cli(workflow, out_dir, *sets, **kw)
        return subprocess.run(cmd, cwd=str(out_dir.parent), env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen, workers: list[int]) -> None:
    """Ctrl-C first (ComfyUI exits normally, our atexit hook stops the workers), then harder; then any worker this
    ComfyUI started that is still there (workers block on their queue and outlive a SIGKILLed parent)."""
    if proc.poll() is None:
        for sig, wait_s in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            proc.send_signal(sig)
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    comfy_dir = Path(COMFYUI_DIR).resolve()
    if not (comfy_dir / "main.py").is_file() or not (comfy_dir / "custom_nodes").is_dir():
        pytest.fail(f"COMFYUI_DIR={COMFYUI_DIR} is not a ComfyUI checkout (no main.py / custom_nodes).")
    link = comfy_dir / "custom_nodes" / LINK_NAME
    ours_already = os.path.islink(link) and os.path.realpath(link) == str(REPO)  # e.g. a developer's own install
    if os.path.lexists(link) and not ours_already:
        pytest.fail(f"{link} already exists and is not a link to {REPO}; the test installs this repo there as a "
                    "symlink and never replaces what it did not create. Move it away, or use another checkout.")
    root = tmp_path_factory.mktemp("comfyui")
    for name in ("input", "output", "temp", "user", "downloads"):
        (root / name).mkdir()
    cache = os.environ.get("COMFYUI_H3_TEST_CACHE") or str(root / "h3_cache")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = root / "comfyui.log"
    env = dict(os.environ, COMFYUI_H3_CACHE=cache, PYTHONUNBUFFERED="1")
    cmd = [os.environ.get("COMFYUI_PYTHON", sys.executable), "main.py", "--cpu", "--listen", "127.0.0.1",
           "--port", str(port), "--output-directory", str(root / "output"), "--input-directory", str(root / "input"),
           "--temp-directory", str(root / "temp"), "--user-directory", str(root / "user"),
           "--database-url", "sqlite:///:memory:", "--disable-api-nodes",
           "--disable-all-custom-nodes", "--whitelist-custom-nodes", LINK_NAME]

    if not ours_already:
        os.symlink(REPO, link, target_is_directory=True)
    proc = None
    workers: list[int] = []
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=str(comfy_dir), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        server = Comfy(proc, url, root, log_path)
        started = time.monotonic()
        while True:
            if proc.poll() is not None:
                pytest.fail(server.why(f"ComfyUI exited with code {proc.returncode} while starting."))
            try:
                if server.request("/system_stats", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(server.why(f"ComfyUI did not answer on {url} within {START_TIMEOUT_S} s."))
            time.sleep(0.5)
        print(f"ComfyUI up in {time.monotonic() - started:.1f} s at {url}")
        yield server
        workers = server.workers()
    finally:
        if proc is not None:
            _stop(proc, workers)
        if not ours_already and os.path.islink(link) and os.path.realpath(link) == str(REPO):
            os.unlink(link)


def _probe_mp4(path: str) -> dict:
    import av

    with av.open(path) as container:
        video = container.streams.video[0]
        audio = container.streams.audio
        frames = sum(1 for _ in container.decode(video=0))
        return {"frames": frames, "fps": float(video.average_rate), "audio": len(audio),
                "size": (video.codec_context.width, video.codec_context.height)}


def _mp4s(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.endswith(".mp4")]


def _check_video(comfy: Comfy, result: subprocess.CompletedProcess, what: str) -> str:
    detail = f"{what}: exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, comfy.why(detail)
    files = _mp4s(result)
    assert len(files) == 1 and os.path.isfile(files[0]), comfy.why(detail)
    info = _probe_mp4(files[0])
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
    assert "tiny-h3 (built-in test model, makes noise)" in info["H3_ModelLoader"]["input"]["required"]["model"][0]


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
    deadline = time.monotonic() + 60
    while (entry := comfy.request(f"/history/{prompt_id}")[1].get(prompt_id)) is None:
        assert time.monotonic() < deadline, comfy.why(f"prompt {prompt_id} still running after Ctrl-C")
        time.sleep(0.2)
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
    width, height = _probe_mp4(path)["size"]
    assert abs(width / height - 1.5) < 0.05, (width, height)  # canvas follows the first keyframe's 3:2 aspect

    # A request the nodes accept at queue time but the sampler refuses (keyframes and references together): the run
    # fails on the server and the client reports the node's error.
    result = comfy.run_cli("h3_first_last_frame.api.json", comfy.root / "downloads", "4.steps=3",
                           '4.reference_images=["2", 0]')
    assert result.returncode == 2, result
    assert "node 4 (H3_Sample) failed" in result.stderr and "either keyframes" in result.stderr, result.stderr


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
        probe = _probe_mp4(saved)
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
