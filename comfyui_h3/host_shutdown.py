"""What the pack does when its ComfyUI is told to stop (SIGTERM: a service manager, `docker stop`, `kill`).

ComfyUI leaves SIGTERM at its default: the process ends on the spot, no exit hook runs, and what the pack started
outlived it (the workers' forkserver still importing torch for ~20 s, workers waiting on their queues) while the
resource tracker reported the queues' semaphores as leaked. The hook installed here (main thread only, and only over
the default disposition or a Python handler it then calls) first kills the workers and the forkserver and drops the
queues (their semaphores are released), then lets SIGTERM do what it did before: ComfyUI still ends at once, by the
same signal.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading


def release_workers() -> None:
    """Kill every engine's workers and the forkserver now, and release the queues' semaphores."""
    from .backend.engine import kill_all

    with contextlib.suppress(Exception):
        kill_all()
    _kill_forkserver()
    gc.collect()  # the dropped queues' semaphores are unlinked (and unregistered) by their finalizers


def _kill_forkserver() -> None:
    """The forkserver the pack started, if any (on Linux it would follow its host anyway, parent_death.py)."""
    try:
        from multiprocessing import forkserver

        pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    except Exception:  # noqa: BLE001 - an interpreter without the attribute: the server ends with its pipe
        return
    if pid:
        with contextlib.suppress(OSError):  # not reaped here: a host that lives on restarts it (ensure_running
            os.kill(pid, signal.SIGKILL)  # reaps the old one first)


def install_sigterm_hook() -> bool:
    """Run `release_workers` when SIGTERM arrives, before the host's own handling of it; True when installed."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (None, signal.SIG_IGN) or getattr(previous, "comfyui_h3_hook", False):
        return False  # set outside Python (not ours to chain), ignored on purpose, or already ours

    def on_sigterm(signum, frame):
        release_workers()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as before: the process ends by SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)

    on_sigterm.comfyui_h3_hook = True
    signal.signal(signal.SIGTERM, on_sigterm)
    return True
