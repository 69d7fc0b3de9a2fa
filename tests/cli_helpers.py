"""Helpers the CLI tests share: the command as a subprocess, an MP4's streams, a canned generate result and run, a
folder's listing, and Ctrl-C / SIGTERM delivered to a running command as a terminal delivers it."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, cwd, cache, timeout=600):
    env = dict(os.environ, PYTHONPATH=REPO, COMFYUI_H3_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "comfyui_h3", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_shipped_4_step_workflow(name, tmp_path, cache):
    """A shipped 4-step workflow (example_workflows/api/NAME.api.json) through `run` in float32 on the tiny models:
    the path of the one 5-s MP4 with its sound it must make (and its 4 steps seen in the progress)."""
    wf = os.path.join(REPO, "example_workflows", "api", f"{name}.api.json")
    out = cli("run", wf, "--set", "1.dtype=\"float32\"", "--out-dir", tmp_path / "out", cwd=tmp_path, cache=cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "4/4" in out.stderr
    (path,) = out.stdout.split()
    assert path.endswith(".mp4") and streams(path) == (124, 24.0, 32000, 2)
    return path


def streams(path):
    import av

    with av.open(str(path)) as container:
        frames = sum(1 for _ in container.decode(video=0))
        audio = container.streams.audio[0]
        return frames, float(container.streams.video[0].average_rate), audio.rate, audio.channels


def canned_result():
    from comfyui_h3.backend.pipelines.h3.request import H3Result

    frames = torch.linspace(0, 255, 124).round().to(torch.uint8).view(124, 1, 1, 1).expand(124, 32, 64, 3)
    return H3Result(task="t2va", video_latents=torch.randn(1, 24, 37, 2, 4), audio_latents=torch.randn(2, 32, 207),
                    frames=frames.contiguous(), audio=torch.zeros(2, 165334), sample_rate=32000)


def run_generate(tmp_path, *extra):
    from comfyui_h3.cli import main

    return main(["generate", "--prompt", "x", "--frames", "124", "--width", "64", "--height", "32", *map(str, extra)])


def listing(root):
    return sorted(os.path.relpath(os.path.join(folder, name), root)
                  for folder, _, names in os.walk(root) for name in names)


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                ppid = int(re.search(r"^PPid:\s*(\d+)", handle.read(), re.M).group(1))
        except (OSError, AttributeError):
            continue
        if ppid == pid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return not re.search(r"^State:\s*Z", handle.read(), re.M)
    except OSError:
        return False


def run_and_interrupt(cmd, cwd, env, ready, sig=signal.SIGINT):
    """Start `cmd` in its own session, send SIGINT to its whole process group (what a terminal does) once a stderr
    line satisfies `ready`. -> (returncode, stdout, stderr with a '<SIGINT>' line where it was sent, worker pids).
    `sig` SIGTERM: sent to the command's process only, as `timeout` or a service manager does."""
    # Its own session: the test's process group (pytest) never sees the SIGINT, as a terminal's other jobs do not.
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines, interrupted, workers = [], threading.Event(), []

    def read_stderr():
        for line in proc.stderr:
            lines.append(line)
            if ready(line) and not interrupted.is_set():
                workers.extend(children(proc.pid))
                interrupted.set()
                lines.append("<SIGINT>\n")
                if sig == signal.SIGINT:
                    os.killpg(proc.pid, signal.SIGINT)
                else:
                    os.kill(proc.pid, sig)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        stdout = proc.stdout.read()
        proc.wait(timeout=300)
        reader.join(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = "".join(lines)
    assert interrupted.is_set(), f"the run ended before it was interrupted:\n{stderr}"
    return proc.returncode, stdout, stderr, workers


def lines_after_sigint(stderr: str) -> list[str]:
    """What the command printed after the SIGINT, progress lines aside."""
    return [ln for ln in stderr.split("<SIGINT>\n", 1)[1].splitlines() if ln.strip() and "[comfyui-h3]" not in ln]


def assert_no_worker_left(workers):
    assert workers, "no worker process was seen"
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)], "a worker outlived the CLI"
