"""Ctrl-C (SIGINT) and SIGTERM in the CLI: one rule for every subcommand and every stage.

The first signal is a Stop. While a request is in an engine (loading or running: backend.engine.jobs_running) it is
the agreed Stop, honoured at the workers' next step boundary, so what the job finished is kept where the command
promises it (an extension's windows, an upscale's batches); a request that finishes anyway counts as stopped (the
command checks `requested` before it writes its outputs, the workflow runner before each node). At any other stage
(reading inputs, encoding or saving on this process, between workflows) nothing could be kept, and the signal quits
at once: KeyboardInterrupt unwinds the command, which removes its temporaries. A second signal quits at once in any
stage (the engine kills workers that are inside a step); later ones are ignored so the clean-up runs to its end.

SIGTERM (a service manager, `timeout`) is taken exactly as Ctrl-C: the default would end the process with no clean-up
at all, leaving hidden temporaries and workers behind. The exit status is 128 + the signal (130, 143).
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


class StopSignals:
    def __init__(self):
        self.signum: int | None = None  # the first signal taken
        self.count = 0
        self.quitting = False  # KeyboardInterrupt was raised: the clean-up must not be interrupted again

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)

    def handle(self, signum, frame) -> None:
        from . import comfy_services as services
        from .backend.engine import jobs_running

        if self.quitting:
            return
        self.count += 1
        if self.signum is None:
            self.signum = signum
        services.request_interrupt()  # the nodes' Stop (run / demo): they poll the same flag as in ComfyUI
        if self.count > 1 or not jobs_running():
            self.quitting = True
            raise KeyboardInterrupt


_current: StopSignals | None = None


def stop_requested() -> bool:
    """A Stop was asked (by a signal, or a node's Stop flag when a host program drives us)."""
    return _current is not None and _current.requested


@contextlib.contextmanager
def stop_signals():
    """Take SIGINT and SIGTERM for the command's whole run (main thread only: a host program calling `main` from
    another thread keeps its own handling)."""
    global _current
    from . import comfy_services as services

    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    handler = StopSignals()
    previous = {sig: signal.signal(sig, handler.handle) for sig in SIGNALS}
    _current = handler
    try:
        yield handler
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _current = None
        services.clear_interrupt()
