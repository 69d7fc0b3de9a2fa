"""A real ComfyUI with this pack, for the integration lane (the `comfy` fixture in conftest.py uses it).

`running_comfyui` links this repo into COMFYUI_DIR/custom_nodes/comfyui-h3 and removes the link afterwards (a link to
this repo that is already there is used and left alone; anything else of that name is never touched). It starts
ComfyUI with --cpu on 127.0.0.1 and a free port, loading only this pack, with its input/output/temp/user folders and
database in a given folder: nothing is written into the checkout (bar Python's __pycache__). ComfyUI's output goes to a
log file that failing assertions print. The tiny model is built into COMFYUI_H3_CACHE (COMFYUI_H3_TEST_CACHE to reuse
one across sessions, else a folder beside the server's). COMFYUI_FRONTEND_ROOT, when set, is a frontend's static
folder (comfyui_frontend_package/static of a `pip install --target`) that ComfyUI serves instead of its installed one
(--front-end-root): one venv serves several frontends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
NO_COMFYUI = "COMFYUI_DIR is unset: point it at a ComfyUI checkout (v0.8.0+) to run this lane"
FRONTEND_ROOT = os.environ.get("COMFYUI_FRONTEND_ROOT")
REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "example_workflows"  # UI workflows: what ComfyUI's template browser lists
WORKFLOWS = TEMPLATES / "api"  # their API-format twins
LINK_NAME = "comfyui-h3"
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 300


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

    def view(self, item: dict) -> bytes:
        """A file a node showed ({filename, subfolder, type} from /history outputs), fetched as the UI does (/view)."""
        query = urllib.parse.urlencode({key: item[key] for key in ("filename", "subfolder", "type")})
        with urllib.request.urlopen(f"{self.url}/view?{query}", timeout=60) as resp:
            return resp.read()

    def wait_for_prompt(self, prompt_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
        """The /history entry of a queued prompt once it has finished (success or not)."""
        deadline = time.monotonic() + timeout
        while True:
            entry = self.request(f"/history/{prompt_id}")[1].get(prompt_id)
            if entry is not None and entry.get("status", {}).get("completed") is not None:
                return entry
            assert time.monotonic() < deadline, self.why(f"prompt {prompt_id} still running after {timeout} s")
            assert self.proc.poll() is None, self.why(f"ComfyUI exited while running prompt {prompt_id}")
            time.sleep(0.2)

    def workers(self) -> list[int]:
        """Pids of the pack's worker processes under this ComfyUI (empty without psutil): spawned ones, and those
        forked from the pack's forkserver (its children; the forkserver itself holds no model)."""
        try:
            import psutil
        except ImportError:
            return []
        pids = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmdline = " ".join(child.cmdline())
                parent = child.parent()
                forked = parent is not None and "multiprocessing.forkserver" in " ".join(parent.cmdline())
                if "spawn_main" in cmdline or (forked and "resource_tracker" not in cmdline):
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


@contextlib.contextmanager
def running_comfyui(root: Path, extra_args: tuple[str, ...] = ()) -> Iterator[Comfy]:
    """ComfyUI (COMFYUI_DIR) serving this pack, with its folders under `root`; stopped on exit. `extra_args` go to
    ComfyUI's command line (e.g. --extra-model-paths-config)."""
    comfy_dir = Path(COMFYUI_DIR).resolve()
    if not (comfy_dir / "main.py").is_file() or not (comfy_dir / "custom_nodes").is_dir():
        pytest.fail(f"COMFYUI_DIR={COMFYUI_DIR} is not a ComfyUI checkout (no main.py / custom_nodes).")
    link = comfy_dir / "custom_nodes" / LINK_NAME
    ours_already = os.path.islink(link) and os.path.realpath(link) == str(REPO)  # e.g. a developer's own install
    if os.path.lexists(link) and not ours_already:
        pytest.fail(f"{link} already exists and is not a link to {REPO}; the test installs this repo there as a "
                    "symlink and never replaces what it did not create. Move it away, or use another checkout.")
    for name in ("input", "output", "temp", "user", "downloads"):
        (root / name).mkdir(exist_ok=True)
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
    if FRONTEND_ROOT:
        if not os.path.isfile(os.path.join(FRONTEND_ROOT, "index.html")):
            pytest.fail(f"COMFYUI_FRONTEND_ROOT={FRONTEND_ROOT} is not a frontend's static folder (no index.html).")
        cmd += ["--front-end-root", FRONTEND_ROOT]
    cmd += list(extra_args)

    if not ours_already:
        os.symlink(REPO, link, target_is_directory=True)
    proc = server = None
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
    finally:
        if proc is not None:
            _stop(proc, server.workers() if server is not None and proc.poll() is None else [])
        if not ours_already and os.path.islink(link) and os.path.realpath(link) == str(REPO):
            os.unlink(link)


def combo_choices(spec: list) -> list:
    """A combo input's choices as /object_info serves them: V1 nodes as `[[choices...], {...}]`, V3 nodes (io.Combo)
    as `["COMBO", {"options": [choices...], ...}]`."""
    if spec[0] == "COMBO":
        return list(spec[1].get("options") or [])
    return list(spec[0])


def probe_mp4(path: str) -> dict:
    import av

    with av.open(path) as container:
        video = container.streams.video[0]
        audio = container.streams.audio
        frames = sum(1 for _ in container.decode(video=0))
        return {"frames": frames, "fps": float(video.average_rate), "audio": len(audio),
                "size": (video.codec_context.width, video.codec_context.height)}


def frontend_model_lookup(error: str) -> bool:
    """A console error for a request the lane's CSP refused to huggingface.co: newer frontends (1.58 with ComfyUI
    0.33) check the model files of ComfyUI's own default graph there when they start. This pack's workflows name no
    URL (tests/lane/test_lane_tools.py checks), so such a look-up is never about them."""
    return "https://huggingface.co/" in error and "Content Security Policy" in error  # "Connecting to" / "Fetch API"


def our_page_errors(errors: list[str]) -> list[str]:
    """The page errors a lane browser script saw, less the frontend's own refused model look-ups."""
    return [e for e in errors if not frontend_model_lookup(e)]
