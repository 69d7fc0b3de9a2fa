"""The device ComfyUI computes on (its --cpu / --gpu-only / --directml choices), for the small tensor work nodes do in
ComfyUI's own process (mask grow / feather)."""

from __future__ import annotations

from ._comfy import _comfy

__all__ = ["comfy_compute_device"]


def comfy_compute_device():
    """ComfyUI's torch device inside ComfyUI (``comfy.model_management.get_torch_device()``), else None (headless:
    the caller picks)."""
    mm = _comfy("comfy.model_management")
    getter = getattr(mm, "get_torch_device", None) if mm is not None else None
    if getter is None:
        return None
    try:
        return getter()
    except Exception:  # a ComfyUI that cannot name a device: let the caller pick
        return None
