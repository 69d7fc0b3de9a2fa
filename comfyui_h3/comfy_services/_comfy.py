"""Lazy access to ComfyUI modules.

Nothing here imports ComfyUI at module import time. How "ComfyUI is here" is decided (env ``COMFYUI_H3_COMFY``):

- ``auto`` (default): use a ComfyUI module only when it is already imported in this process (``sys.modules``). Inside
  ComfyUI that is always the case: main.py imports ``folder_paths``, ``comfy.utils``, ``comfy.model_management`` and
  ``comfy_execution.utils`` before it loads custom nodes. Importing them from a plain process instead would parse
  ComfyUI's CLI arguments, probe devices and log, which a CLI run must not do.
- ``import``: also try to import them (a Python user driving ComfyUI's modules by hand).
- ``off``: always headless.
"""

from __future__ import annotations

import importlib
import os
import sys

ENV_MODE = "COMFYUI_H3_COMFY"

__all__ = ["ENV_MODE", "comfy_available"]


def _mode() -> str:
    mode = os.environ.get(ENV_MODE, "auto").strip().lower()
    return mode if mode in ("auto", "import", "off") else "auto"


def _comfy(name: str):
    """The ComfyUI module ``name`` (e.g. ``"comfy.model_management"``), or None when running headless."""
    mode = _mode()
    if mode == "off":
        return None
    module = sys.modules.get(name)
    if module is not None or mode != "import":
        return module
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or ComfyUI failing to initialise outside its own process
        return None


def comfy_available() -> bool:
    """True when this process runs inside ComfyUI (its model management and folder_paths are loaded)."""
    return _comfy("comfy.model_management") is not None and _comfy("folder_paths") is not None
