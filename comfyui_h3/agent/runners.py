"""Where the agent tools' graphs run: `LocalRunner` (this process's headless runner, workflow_runner.py: the pack's
nodes, its input / output folders) or `ServerRunner` (a running ComfyUI, through its own routes: /object_info,
/prompt with the websocket, /interrupt, /history, /view, /upload/image). Both give the same things: the node inputs
the tools' schemas are made from, a run with progress and Stop, the files it saved (with their manifests), reads
of output files and uploads into the input folder -- nothing outside those two folders.

A run's progress is (done, total, message): done counts finished nodes plus the running node's fraction, total the
nodes that run, so it only grows (MCP's rule for progress notifications)."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Callable

from .schema import ArgumentError

Progress = Callable[[float, float, str], None]
UPLOAD_EXTENSIONS = (".mp4", ".mov", ".webm", ".mkv", ".m4v", ".png", ".jpg", ".jpeg", ".webp", ".wav", ".flac",
                     ".mp3", ".json")
MAX_FILE_BYTES = 512 * 1024 * 1024  # an upload or a read through the tools (base64 in a JSON message)
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,199}$")
MANIFEST_SUFFIX = ".manifest.json"  # nodes/save_video.py writes one beside each saved video


@dataclass(frozen=True)
class OutputFile:
    filename: str
    subfolder: str
    type: str = "output"

    def record(self) -> dict:
        return {"filename": self.filename, "subfolder": self.subfolder, "type": self.type}


def check_upload_name(name: str) -> str:
    """A plain file name with a media / workflow extension: no folders, nothing hidden."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise ArgumentError(f"name must be a plain file name (letters, digits, spaces, . _ ( ) + -; no folders), got "
                            f"{name!r}.")
    if not name.lower().endswith(UPLOAD_EXTENSIONS):
        raise ArgumentError(f"{name}: uploads are media or workflow files ({', '.join(UPLOAD_EXTENSIONS)}).")
    return name


def _outputs_of(ui_outputs) -> list[OutputFile]:
    files = []
    for ui in ui_outputs:
        for items in (ui or {}).values():
            for item in items if isinstance(items, list) else ():
                if isinstance(item, dict) and isinstance(item.get("filename"), str) \
                        and (item.get("type") or "output") == "output":
                    files.append(OutputFile(item["filename"], item.get("subfolder") or ""))
    return files


class LocalRunner:
    """The pack's nodes in this process (no ComfyUI): one run at a time."""

    kind = "local"

    def __init__(self):
        self._lock = threading.Lock()

    def node_inputs(self) -> dict:
        from ..registration import NODE_CLASS_MAPPINGS
        from .schema import node_inputs_of

        return node_inputs_of(NODE_CLASS_MAPPINGS)

    def run(self, prompt: dict, report: Progress, stop: threading.Event) -> list[OutputFile]:
        from .. import comfy_services as services
        from ..comfy_services.progress import add_progress_listener
        from ..headless_temp import temp_folder
        from ..workflow_runner import execute, planned_nodes

        order = planned_nodes(prompt)  # WorkflowError before anything runs
        with self._lock:
            services.clear_interrupt()
            state = {"done": -1, "name": "", "at": 0.0}

            def on_node(node_id, class_type):
                state["done"] += 1
                state["name"], state["at"] = f"[{node_id}] {class_type}", float(state["done"])
                report(state["at"], float(len(order)), state["name"])

            def on_update(desc, value, total):  # a node may run several bars (a storyboard's shots): never back
                fraction = value / total if total else 0.0
                state["at"] = max(state["at"], state["done"] + min(fraction, 0.999))
                report(state["at"], float(len(order)), f"{state['name']} {desc}: {value}/{total}")

            remove = add_progress_listener(on_update)
            try:
                with temp_folder(services.output_directory()):
                    outputs = execute(prompt, on_node=on_node, should_stop=stop.is_set)
            finally:
                remove()
                services.clear_interrupt()
        report(float(len(order)), float(len(order)), "done")
        return _outputs_of(outputs.values())

    def interrupt(self) -> None:
        from .. import comfy_services as services

        services.request_interrupt()  # the running node stops at its next step

    def _path(self, file: OutputFile) -> str:
        from .. import comfy_services as services

        return services.resolve_in_directory(services.output_directory(),
                                             os.path.join(file.subfolder, file.filename) if file.subfolder
                                             else file.filename, must_exist=True)

    def read_output(self, file: OutputFile) -> bytes:
        path = self._path(file)
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise ArgumentError(f"{file.filename} is larger than {MAX_FILE_BYTES >> 20} MiB: read it from ComfyUI's "
                                "output folder instead.")
        with open(path, "rb") as handle:
            return handle.read()

    def manifest(self, file: OutputFile) -> dict | None:
        try:
            with open(self._path(OutputFile(file.filename + MANIFEST_SUFFIX, file.subfolder)), "rb") as handle:
                return json.loads(handle.read())
        except (FileNotFoundError, ValueError):
            return None

    def local_path(self, file: OutputFile) -> str | None:
        return self._path(file)

    def upload(self, name: str, data: bytes) -> str:
        """Into the input folder under `name`, or `name (N)` when taken: never over a file."""
        from .. import comfy_services as services

        check_upload_name(name)
        folder = services.input_directory()
        os.makedirs(folder, exist_ok=True)
        stem, ext = os.path.splitext(name)
        for n in range(1000):
            stored = name if n == 0 else f"{stem} ({n}){ext}"
            try:
                handle = open(os.path.join(folder, stored), "xb")
            except FileExistsError:
                continue
            with handle:
                handle.write(data)
            return stored
        raise ArgumentError(f"{name}: too many files of that name in the input folder.")


class ServerRunner:
    """A running ComfyUI with this pack: everything through its HTTP routes."""

    kind = "comfyui"
    CLASSES = ("H3_ModelLoader", "H3_LoRA", "H3_Sample", "H3_Refine", "H3_Edit", "H3_Extend", "H3_Storyboard",
               "H3_LoadVideo",
               "H3_LoadImage", "H3_TrackMask", "H3_MaskDraw", "H3_SaveVideo", "H3_SeedVR2Loader", "H3_SeedVR2Upscale")

    def __init__(self, url: str, timeout_s: float = 6 * 3600):
        from ..server_client import base_url

        self.base, self.timeout_s = base_url(url), timeout_s

    def node_inputs(self) -> dict:
        from ..server_client import _get_json

        info = {}
        for name in self.CLASSES:
            info.update(_get_json(self.base, f"/object_info/{name}"))
        return info

    def run(self, prompt: dict, report: Progress, stop: threading.Event) -> list[OutputFile]:
        from ..server_client import run_prompt

        total = float(len(prompt))
        state = {"done": -1.0, "at": 0.0}

        def on_event(kind, data):  # progress never goes back (a node may run several bars)
            if kind == "executing" and data.get("node") is not None:
                state["done"], node = state["done"] + 1, data["node"]
                state["at"] = max(state["at"], state["done"])
                report(state["at"], total, f"[{node}] {prompt.get(node, {}).get('class_type', '?')}")
            elif kind == "execution_cached":
                state["done"] += len(data.get("nodes") or ())
            elif kind == "progress" and data.get("max"):
                fraction = min(float(data.get("value", 0)) / float(data["max"]), 0.999)
                state["at"] = max(state["at"], max(state["done"], 0.0) + fraction)
                report(state["at"], total, f"[{data.get('node')}] {data.get('value')}/{data.get('max')}")

        history = run_prompt(self.base, prompt, self.timeout_s, on_event, stop.is_set)
        report(total, total, "done")
        return _outputs_of((history.get("outputs") or {}).values())

    def interrupt(self) -> None:
        """Nothing to do here: the run polls its stop event and interrupts the prompt on the server."""

    def read_input(self, name: str) -> bytes:
        """A file of the server's input folder (a workflow the caller put there)."""
        sub, _, base = name.replace("\\", "/").rpartition("/")
        return self.read_output(OutputFile(base, sub, "input"))

    def read_output(self, file: OutputFile) -> bytes:
        from ..server_client import _request

        query = urllib.parse.urlencode({"filename": file.filename, "subfolder": file.subfolder, "type": file.type})
        with _request(self.base, "/view?" + query, timeout=300) as resp:
            data = resp.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ArgumentError(f"{file.filename} is larger than {MAX_FILE_BYTES >> 20} MiB: read it from ComfyUI's "
                                "output folder instead.")
        return data

    def manifest(self, file: OutputFile) -> dict | None:
        try:
            return json.loads(self.read_output(OutputFile(file.filename + MANIFEST_SUFFIX, file.subfolder)))
        except (RuntimeError, ValueError):
            return None

    def local_path(self, file: OutputFile) -> str | None:
        return None  # on the server's disk

    def upload(self, name: str, data: bytes) -> str:
        """POST /upload/image (ComfyUI's upload route, any file type; overwrite off: it renames on a clash)."""
        import urllib.request

        check_upload_name(name)
        boundary = uuid.uuid4().hex
        parts = []
        for field, value in (("type", "input"), ("overwrite", "false")):
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"\r\n\r\n{value}\r\n'.encode())
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
                     f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        req = urllib.request.Request(self.base + "/upload/image", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                reply = json.loads(resp.read().decode("utf-8"))
        except OSError as exc:
            raise RuntimeError(f"ComfyUI refused the upload of {name}: {exc}") from None
        sub = reply.get("subfolder") or ""
        return f"{sub}/{reply['name']}" if sub else reply["name"]
