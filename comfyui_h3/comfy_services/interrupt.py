"""The interrupt flag: ComfyUI's (POST /interrupt) inside ComfyUI, plus our own that :func:`request_interrupt` sets."""

from __future__ import annotations

import threading
from typing import List, Tuple

from ._comfy import _comfy
from .errors import H3Interrupted

__all__ = ["interrupt_requested", "raise_if_interrupted", "request_interrupt", "clear_interrupt",
           "interrupt_exception_types"]


_headless_interrupt = threading.Event()


def request_interrupt() -> None:
    """Ask the running job to stop (CLI Ctrl-C, tests). Inside ComfyUI, POST /interrupt does the same."""
    _headless_interrupt.set()


def clear_interrupt() -> None:
    _headless_interrupt.clear()


def interrupt_requested() -> bool:
    """True when a stop was requested. Never raises and never clears the flag (safe to poll from any thread)."""
    if _headless_interrupt.is_set():
        return True
    mm = _comfy("comfy.model_management")
    fn = getattr(mm, "processing_interrupted", None) if mm is not None else None
    if fn is not None:
        try:
            return bool(fn())
        except Exception:
            return False
    return False


def interrupt_exception_types() -> Tuple[type, ...]:
    """The exception types that mean "stopped by the user" here: catch these to cancel the engine, then re-raise."""
    types: List[type] = [H3Interrupted]
    mm = _comfy("comfy.model_management")
    exc = getattr(mm, "InterruptProcessingException", None) if mm is not None else None
    if isinstance(exc, type):
        types.append(exc)
    return tuple(types)


def _is_comfy_interrupt(exc: BaseException) -> bool:
    mm = _comfy("comfy.model_management")
    cls = getattr(mm, "InterruptProcessingException", None) if mm is not None else None
    return isinstance(cls, type) and isinstance(exc, cls)


def raise_if_interrupted() -> None:
    """Raise when a stop was requested, consuming the request (as ComfyUI does, so the next prompt runs).

    Inside ComfyUI this raises ``comfy.model_management.InterruptProcessingException`` (ComfyUI then reports
    ``execution_interrupted`` instead of an error); headless it raises :class:`H3Interrupted`.
    """
    mm = _comfy("comfy.model_management")
    exc_cls = getattr(mm, "InterruptProcessingException", None) if mm is not None else None
    if _headless_interrupt.is_set():
        _headless_interrupt.clear()
        if isinstance(exc_cls, type):
            raise exc_cls()
        raise H3Interrupted("interrupted")
    if mm is None:
        return
    thrower = getattr(mm, "throw_exception_if_processing_interrupted", None)
    if thrower is not None:
        thrower()
    elif interrupt_requested():
        if hasattr(mm, "interrupt_current_processing"):
            mm.interrupt_current_processing(False)
        raise (exc_cls() if isinstance(exc_cls, type) else H3Interrupted("interrupted"))

