"""Exception types raised by the ComfyUI service adapters."""

from __future__ import annotations

__all__ = ["H3Interrupted", "UnsafePathError", "H3ModelNotFound"]


class H3Interrupted(Exception):
    """Raised by :func:`raise_if_interrupted` when running without ComfyUI (ComfyUI's own exception is used inside it)."""


class UnsafePathError(ValueError):
    """A user-supplied name would resolve outside the directories it is allowed to reach."""


class H3ModelNotFound(FileNotFoundError):
    """No MiniMax-H3 diffusers folder under the known model roots matches the given name."""
