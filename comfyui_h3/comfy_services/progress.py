"""Progress for a node run: ComfyUI's progress bar when it is loaded, throttled stderr lines headless."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional

from ._comfy import _comfy
from .interrupt import _is_comfy_interrupt

__all__ = ["ProgressReporter", "add_progress_listener"]

_listeners: list = []  # headless: callables (desc, value, total) told of every update (the agent server's progress)
_listeners_lock = threading.Lock()


def add_progress_listener(listener: Callable[[str, int, int], None]) -> Callable[[], None]:
    """Headless runs: `listener(desc, value, total)` on every reporter update, from whichever thread updates;
    returns the function that removes it."""
    with _listeners_lock:
        _listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


class ProgressReporter:
    """Progress for one node run: ComfyUI's ``comfy.utils.ProgressBar`` when available, stderr lines otherwise.

    ``update(n)`` advances by ``n``; ``update_absolute(value, total=None, preview=None)`` sets the position (clamped to
    ``total``, as ComfyUI does). Inside ComfyUI the progress hook also checks the interrupt flag: called from the thread
    that created the reporter (the node's thread) an update raises ComfyUI's ``InterruptProcessingException`` exactly
    like a core node's progress bar. Called from any other thread (an engine event listener) it never raises: it sets
    the interrupt flag again (the hook cleared it when raising) so the node thread still sees the cancel at its next
    :func:`raise_if_interrupted`.

    ``node_id`` defaults to the node ComfyUI is executing when the reporter is created, so that updates sent from other
    threads are still attributed to it. Headless lines are throttled to one per ``min_interval`` seconds (the first and
    the last one always print).
    """

    def __init__(self, total: int, node_id: Optional[str] = None, desc: str = "H3", min_interval: float = 0.25,
                 stream=None):
        self.total = max(int(total), 0)
        self.current = 0
        self.desc = desc
        self.min_interval = float(min_interval)
        self._stream = stream
        self._thread = threading.get_ident()
        self._last_print = None  # (time, value) of the last headless line
        self._bar = None
        utils = _comfy("comfy.utils")
        if utils is not None and hasattr(utils, "ProgressBar"):
            if node_id is None:
                node_id = _executing_node_id()
            self._bar = utils.ProgressBar(self.total, node_id=node_id)
        self.node_id = node_id

    @property
    def uses_comfy(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        self.update_absolute(self.current + n)

    def update_absolute(self, value: int, total: Optional[int] = None, preview=None) -> None:
        if total is not None:
            self.total = max(int(total), 0)
        value = min(max(int(value), 0), self.total)
        self.current = value
        if self._bar is None:
            self._print(value)
            for listener in list(_listeners):
                try:
                    listener(self.desc, value, self.total)
                except Exception:  # a listener must never fail a generation
                    pass
            return
        try:
            self._bar.update_absolute(value, self.total, preview)
        except Exception as exc:
            if threading.get_ident() == self._thread or not _is_comfy_interrupt(exc):
                raise
            # Another thread consumed the interrupt: hand it back to the node thread.
            mm = _comfy("comfy.model_management")
            if mm is not None and hasattr(mm, "interrupt_current_processing"):
                mm.interrupt_current_processing(True)

    def set_text(self, text: str) -> None:
        """A status line for the node (e.g. "window 2/6"): shown on the node by ComfyUI's progress-text message,
        or put in front of the headless progress lines."""
        if self._bar is None:
            self.desc = text
            return
        server = _comfy("server")
        instance = getattr(getattr(server, "PromptServer", None), "instance", None) if server is not None else None
        if instance is not None and hasattr(instance, "send_progress_text") and self.node_id is not None:
            try:
                instance.send_progress_text(text, self.node_id)
            except Exception:  # a status line must never fail a generation
                pass

    def _print(self, value: int) -> None:
        now = time.monotonic()
        last = self._last_print
        final = value >= self.total
        if last is not None:
            if last[1] == value:
                return
            if not final and now - last[0] < self.min_interval:
                return
        self._last_print = (now, value)
        pct = 100.0 * value / self.total if self.total else 100.0
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            stream.write(f"[comfyui-h3] {self.desc}: {value}/{self.total} ({pct:.0f}%)\n")
            stream.flush()
        except Exception:  # a closed stderr must not fail a generation
            pass


def _executing_node_id() -> Optional[str]:
    cu = _comfy("comfy_execution.utils")
    getter = getattr(cu, "get_executing_context", None) if cu is not None else None
    if getter is None:
        return None
    try:
        ctx = getter()
    except Exception:
        return None
    return getattr(ctx, "node_id", None) if ctx is not None else None

