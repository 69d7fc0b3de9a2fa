"""Run an API-format workflow on a running ComfyUI (`python -m comfyui_h3 run WORKFLOW --server URL`).

Submits the prompt (POST /prompt), follows it over the websocket (/ws?clientId=...) and prints `node X: value/max`
progress lines on stderr, then reads /history/<prompt_id> and downloads every file the output nodes list (via /view)
into a local folder, never overwriting a local file.

The websocket needs `aiohttp` (ComfyUI itself depends on it). Without it, or when the websocket cannot be opened or
drops, the client falls back to polling /history every 0.5 s: the result is the same, only the per-step progress
lines are missing. HTTP calls use the standard library. Ctrl-C while waiting stops the prompt on the server
(POST /interrupt, and removes it from the queue if it has not started) before re-raising KeyboardInterrupt.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

POLL_S = 0.5


def run_on_server(url: str, prompt: dict, out_dir: str, timeout_s: float = 3600) -> list[str]:
    """Run `prompt` on the ComfyUI at `url`; returns the local paths of the downloaded outputs.

    Raises RuntimeError when the server is unreachable, refuses the prompt (400: the node errors are in the message),
    the run fails or is interrupted, or `timeout_s` passes (the prompt is then left running on the server)."""
    base = base_url(url)
    return _download_outputs(base, run_prompt(base, prompt, timeout_s), out_dir)


def base_url(url: str) -> str:
    return url.rstrip("/") if "://" in url else "http://" + url.rstrip("/")


class Stopped(RuntimeError):
    """The caller asked to stop: the prompt was interrupted on the server (or dropped from its queue)."""


def run_prompt(base: str, prompt: dict, timeout_s: float = 3600, on_event=None, should_stop=None) -> dict:
    """Submit `prompt`, follow it to its end, return its /history entry. `on_event(kind, data)` gets the
    websocket's events of this prompt (executing, progress, ...); `should_stop()` true: the prompt is interrupted
    and Stopped raised. Ctrl-C does the same, re-raising KeyboardInterrupt."""
    client_id = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    names = {nid: node.get("class_type", "?") for nid, node in prompt.items()}
    prompt_id = None
    try:
        watcher = _Watcher(base, client_id, names, on_event, should_stop)
        watcher.connect()  # before submitting, so no event of a fast prompt is missed
        try:
            prompt_id = _submit(base, prompt, client_id)
            _log(f"queued as prompt {prompt_id}")
            watcher.follow(prompt_id, deadline)
        finally:
            watcher.close()
        return _wait_history(base, prompt_id, deadline, should_stop)
    except KeyboardInterrupt:
        if prompt_id is not None:
            _stop(base, prompt_id)
        raise
    except Stopped:
        if prompt_id is not None:
            _stop(base, prompt_id)
        raise


# ----------------------------------------------------------------------------------------------------------------------
# HTTP


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _request(base: str, path: str, body: dict | None = None, timeout: float = 60.0, keep_http_error: bool = False):
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if keep_http_error:
            raise
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise RuntimeError(f"ComfyUI answered {exc.code} to {req.get_method()} {path}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeError(f"Cannot reach ComfyUI at {base}: {reason}") from None


def _get_json(base: str, path: str):
    with _request(base, path) as resp:
        return json.loads(resp.read().decode("utf-8"))


def _submit(base: str, prompt: dict, client_id: str) -> str:
    try:
        with _request(base, "/prompt", {"prompt": prompt, "client_id": client_id}, keep_http_error=True) as resp:
            reply = json.loads(resp.read().decode("utf-8"))
        if reply.get("node_errors"):  # accepted, but some output nodes failed validation and will not run
            _log("\n".join(["warning: ComfyUI skips the outputs that failed validation:"] + _node_error_lines(reply)))
        return reply["prompt_id"]
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        try:
            reply = json.loads(text)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise RuntimeError(f"ComfyUI answered {exc.code} to POST /prompt: {text[:2000]}") from None
        raise RuntimeError(format_prompt_errors(reply)) from None


def format_prompt_errors(reply: dict) -> str:
    """A 400 reply of POST /prompt as readable lines: the overall error, then each node's errors."""
    error = reply.get("error") or {}
    head = error.get("message", "error") if isinstance(error, dict) else str(error)
    if isinstance(error, dict) and error.get("details"):
        head += f": {error['details']}"
    return "\n".join([f"ComfyUI refused the workflow ({head})"] + _node_error_lines(reply))


def _node_error_lines(reply: dict) -> list[str]:
    lines = []
    for node_id, info in (reply.get("node_errors") or {}).items():
        for err in info.get("errors", []):
            detail = f" ({err['details']})" if err.get("details") else ""
            lines.append(f"  node {node_id} ({info.get('class_type', '?')}): {err.get('message', '?')}{detail}")
    return lines


def _stop(base: str, prompt_id: str) -> None:
    """Best effort: interrupt the prompt if it runs, drop it from the queue if it waits."""
    for path, body in (("/interrupt", {"prompt_id": prompt_id}), ("/queue", {"delete": [prompt_id]})):
        try:
            _request(base, path, body, timeout=5).close()
        except Exception:  # noqa: BLE001 - the user is leaving; never mask the KeyboardInterrupt
            pass
    _log(f"asked ComfyUI to stop prompt {prompt_id}")


def _wait_history(base: str, prompt_id: str, deadline: float, should_stop=None) -> dict:
    """Poll /history/<id> until the prompt is finished; raise RuntimeError if it failed."""
    while True:
        if should_stop is not None and should_stop():
            raise Stopped("Stopped by the caller.")
        entry = _get_json(base, f"/history/{urllib.parse.quote(prompt_id)}").get(prompt_id)
        if entry is not None:
            status = entry.get("status") or {}
            if status.get("status_str") == "error" or status.get("completed") is False:
                raise RuntimeError(_failure_from_messages(status.get("messages") or []))
            return entry
        if time.monotonic() > deadline:
            raise RuntimeError(f"Timed out waiting for prompt {prompt_id}; it is still queued or running on ComfyUI.")
        time.sleep(POLL_S)


def _failure_from_messages(messages: list) -> str:
    for event, data in messages:
        if event in ("execution_error", "execution_interrupted"):
            return _failure(event, data)
    return "The prompt failed on ComfyUI (no error message in its history)."


def _failure(event: str, data: dict) -> str:
    where = f"node {data.get('node_id')} ({data.get('node_type')})"
    if event == "execution_interrupted":
        return f"Interrupted on ComfyUI at {where}."
    return f"{where} failed: {data.get('exception_type', 'Error')}: {data.get('exception_message', '').strip()}"


# ----------------------------------------------------------------------------------------------------------------------
# Websocket progress (aiohttp) with a polling fallback


class _Watcher:
    """Follows one prompt over the websocket. If aiohttp is missing or the socket fails, `follow` returns at once
    (or when the socket drops) and the caller's /history polling takes over."""

    def __init__(self, base: str, client_id: str, names: dict, on_event=None, should_stop=None):
        self.base, self.client_id, self.names = base, client_id, names
        self.on_event, self.should_stop = on_event, should_stop
        self.loop = self.session = self.ws = None

    def connect(self) -> None:
        try:
            import asyncio

            import aiohttp
        except ImportError:
            _log("(aiohttp is not installed: no progress lines; `pip install aiohttp` to see them)")
            return
        ws_url = "ws" + self.base[len("http"):] + "/ws?clientId=" + self.client_id
        self.loop = asyncio.new_event_loop()

        async def open_socket():
            self.session = aiohttp.ClientSession()
            self.ws = await self.session.ws_connect(ws_url, heartbeat=30, max_msg_size=0)

        try:
            self.loop.run_until_complete(asyncio.wait_for(open_socket(), 10))
        except Exception as exc:  # noqa: BLE001 - any socket trouble: poll instead
            _log(f"(no websocket: {str(exc) or type(exc).__name__}; polling for the result)")
            self.close()

    def follow(self, prompt_id: str, deadline: float) -> None:
        if self.ws is None:
            return
        try:
            self.loop.run_until_complete(self._follow(prompt_id, deadline))
        except (RuntimeError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - socket dropped: poll instead
            _log(f"(websocket lost: {str(exc) or type(exc).__name__}; polling for the result)")

    async def _follow(self, prompt_id: str, deadline: float) -> None:
        import asyncio

        import aiohttp

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"Timed out waiting for prompt {prompt_id}; it is still queued or running on "
                                   "ComfyUI.")
            if self.should_stop is not None and self.should_stop():
                raise Stopped("Stopped by the caller.")
            try:
                msg = await self.ws.receive(timeout=min(left, 0.5))  # wakes to look at should_stop
            except asyncio.TimeoutError:
                continue
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                raise ConnectionError("websocket closed")
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue  # binary frames are previews
            event = json.loads(msg.data)
            kind, data = event.get("type"), event.get("data") or {}
            if data.get("prompt_id") != prompt_id:
                continue
            if self.on_event is not None:
                self.on_event(kind, data)
            if kind == "executing":
                node = data.get("node")
                if node is None:
                    return  # finished (sent after the history is written)
                _log(f"[{node}] {self.names.get(node, '?')}")
            elif kind == "execution_cached" and data.get("nodes"):
                _log("cached: " + ", ".join(f"[{n}] {self.names.get(n, '?')}" for n in data["nodes"]))
            elif kind == "progress":
                _log(f"node {data.get('node')}: {data.get('value')}/{data.get('max')}")
            elif kind in ("execution_error", "execution_interrupted"):
                raise RuntimeError(_failure(kind, data))
            elif kind == "execution_success":
                return

    def close(self) -> None:
        if self.loop is None:
            return

        import asyncio

        for task in asyncio.all_tasks(self.loop):  # a receive left pending by Ctrl-C
            task.cancel()

        async def shut():
            if self.ws is not None:
                await self.ws.close()
            if self.session is not None:
                await self.session.close()

        try:
            self.loop.run_until_complete(shut())
        except Exception:  # noqa: BLE001
            pass
        self.loop.close()
        self.loop = self.session = self.ws = None


# ----------------------------------------------------------------------------------------------------------------------
# Downloads


def _download_outputs(base: str, history: dict, out_dir: str) -> list[str]:
    files = []
    for ui in (history.get("outputs") or {}).values():
        for items in ui.values():
            if not isinstance(items, list):
                continue
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("filename"), str):
                    files.append(_download(base, item, out_dir))
    return files


def _safe_parts(subfolder: str) -> list[str]:
    parts = [p for p in subfolder.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." or ":" in p for p in parts):
        raise RuntimeError(f"ComfyUI listed an output in an unsafe subfolder: {subfolder!r}")
    return parts


def _download(base: str, item: dict, out_dir: str) -> str:
    filename = os.path.basename(item["filename"].replace("\\", "/"))
    subfolder = item.get("subfolder") or ""
    folder = os.path.join(os.path.abspath(out_dir), *_safe_parts(subfolder))
    os.makedirs(folder, exist_ok=True)
    query = urllib.parse.urlencode({"filename": item["filename"], "subfolder": subfolder,
                                    "type": item.get("type") or "output"})
    stem, ext = os.path.splitext(filename)
    with _request(base, "/view?" + query, timeout=300) as resp:
        for n in range(0, 100000):
            path = os.path.join(folder, filename if n == 0 else f"{stem}_{n}{ext}")
            try:
                handle = open(path, "xb")  # exclusive: an existing file is never overwritten
            except FileExistsError:
                continue
            break
        try:
            with handle:
                while chunk := resp.read(1 << 20):
                    handle.write(chunk)
        except BaseException:
            os.unlink(path)
            raise
    return path
