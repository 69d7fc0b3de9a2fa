"""A frozen worker in a real ComfyUI (the integration lane; skipped without COMFYUI_DIR): the worker process of a
running prompt is SIGSTOPped (what a hung driver or a deadlocked collective looks like from outside); the prompt ends
with a node error naming the rank and the heartbeat bound within that bound (set short for this server through
COMFYUI_H3_WORKER_TIMEOUT_S), the frozen process is gone, and the next prompt succeeds."""

import contextlib
import json
import os
import signal
import time
import uuid

import pytest

from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, WORKFLOWS, running_comfyui

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)

BOUND_S = 6
ENV_WORKER = "COMFYUI_H3_WORKER_TIMEOUT_S"


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """The lane's ComfyUI (conftest's `comfy`), started with a short heartbeat bound in its environment."""
    pytest.importorskip("psutil", reason="finds the worker processes under ComfyUI with psutil")
    with contextlib.ExitStack() as stack:
        previous = os.environ.get(ENV_WORKER)
        os.environ[ENV_WORKER] = str(BOUND_S)
        try:
            server = stack.enter_context(running_comfyui(tmp_path_factory.mktemp("comfyui")))
        finally:
            if previous is None:
                os.environ.pop(ENV_WORKER, None)
            else:
                os.environ[ENV_WORKER] = previous
        yield server


def _text_to_video(steps: int) -> dict:
    with open(WORKFLOWS / "h3_text_to_video.api.json") as handle:
        prompt = json.load(handle)
    prompt["1"]["inputs"]["dtype"] = "float32"
    prompt["2"]["inputs"].update(steps=steps, seconds=5.0, width=64, height=64)
    return prompt


def _queue(comfy, prompt: dict) -> str:
    status, body = comfy.request("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 200, comfy.why(str(body))
    return body["prompt_id"]


def _wait_running(comfy, prompt_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(item[1] == prompt_id for item in comfy.request("/queue")[1].get("queue_running", [])):
        assert time.monotonic() < deadline, comfy.why(f"prompt {prompt_id} did not start within {timeout} s")
        time.sleep(0.1)


def _error_of(entry: dict) -> dict:
    messages = dict(entry["status"]["messages"])
    assert entry["status"]["status_str"] == "error" and "execution_error" in messages, entry["status"]
    return messages["execution_error"]


def test_frozen_worker_is_a_node_error_within_the_bound_and_the_next_prompt_runs(comfy):
    import psutil

    # The engine is loaded first, so the long prompt below is mid-job (not loading) when its worker is frozen.
    warm = comfy.wait_for_prompt(_queue(comfy, _text_to_video(steps=1)))
    assert warm["status"]["status_str"] == "success", comfy.why(str(warm["status"]))
    (worker,) = comfy.workers()

    prompt_id = _queue(comfy, _text_to_video(steps=200))
    _wait_running(comfy, prompt_id)
    time.sleep(1.0)  # into the job: text encoding, then steps
    assert comfy.workers() == [worker], "the prompt should run on the loaded worker"
    os.kill(worker, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        entry = comfy.wait_for_prompt(prompt_id, timeout=BOUND_S + 60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)  # only matters if the server did not kill it
    waited = time.monotonic() - frozen
    error = _error_of(entry)
    message = error["exception_message"]
    assert error["node_id"] == "2", error
    assert f"rank 0 sent no heartbeat for {BOUND_S} s ({ENV_WORKER})" in message, message
    assert "Traceback" not in message and "\n" not in message.strip(), message
    assert waited < BOUND_S + 20, f"the node error came {waited:.1f} s after the freeze"
    deadline = time.monotonic() + 10
    while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the frozen worker is still there"
        time.sleep(0.2)

    again = comfy.wait_for_prompt(_queue(comfy, _text_to_video(steps=1)))
    assert again["status"]["status_str"] == "success", comfy.why(str(again["status"]))
    assert worker not in comfy.workers()


def test_sigterm_ends_comfyui_its_workers_and_forkserver_within_seconds_leaking_nothing(tmp_path):
    """Issue 28 #10: SIGTERM (a service manager's stop) to a ComfyUI that ran an H3 prompt: ComfyUI ends by the signal
    as before, soon nothing it started is left (the workers, the forkserver), and the resource tracker reports no
    leaked semaphore. The bound counts ComfyUI's own interpreter shutdown too: under 2 s on a quiet machine (the 2-s
    rule on our side is tests/test_worker_start.py's), 2.1 s seen with the four lane jobs and the suite on two cores,
    so the lane allows 4 s."""
    import psutil

    with running_comfyui(tmp_path) as server:
        done = server.wait_for_prompt(_queue(server, _text_to_video(steps=1)))
        assert done["status"]["status_str"] == "success", server.why(str(done["status"]))
        started = [p for p in psutil.Process(server.proc.pid).children(recursive=True)]
        assert server.workers(), server.why("no worker ran the prompt")
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
        assert server.proc.returncode == -signal.SIGTERM, server.why(f"exit {server.proc.returncode}")

        def left():
            return [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

        while left() and time.monotonic() - sent < 30:
            time.sleep(0.05)
        waited = time.monotonic() - sent
        assert not left() and waited < 4.0, server.why(f"processes {left()} were there {waited:.1f} s after SIGTERM")
        time.sleep(1.0)  # the resource tracker writes its report when its pipe closes
        assert "leaked semaphore" not in server.log(), server.why("semaphores leaked")
