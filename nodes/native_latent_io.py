"""The native MiniMax-H3 AV LATENT on our nodes: an appended LATENT output, and the inputs that take one, declared
only when the ComfyUI at hand has NestedTensor (decided when the pack loads; older ComfyUIs show neither). The
conversion itself lives in comfyui_h3/native_latent.py."""

from __future__ import annotations

from ..backend.pipelines.h3.extension_source import frames_for_latents
from ..backend.pipelines.h3.geometry import RequestError
from ..native_latent import from_native, native_latent_supported, to_native

SUPPORTED = native_latent_supported()
SPATIAL_RATIO = 16  # the video VAE's: latent h, w = H/16, W/16
OUTPUT_TOOLTIP = ("The same latents as ComfyUI's native MiniMax-H3 AV LATENT (video + audio NestedTensor): for the "
                  "native VAE Decode / VAE Decode Audio nodes, or a native sampler (ComfyUI 0.30+).")


def outputs(types: tuple, names: tuple, tooltips: tuple) -> tuple[tuple, tuple, tuple]:
    """(RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS) with the native LATENT appended when supported."""
    if not SUPPORTED:
        return types, names, tooltips
    return types + ("LATENT",), names + ("native_latent",), tooltips + (OUTPUT_TOOLTIP,)


def with_native(values: tuple, latents) -> tuple:
    """A node's result values, plus the native LATENT of `latents` when the output exists."""
    return values + (to_native(latents),) if SUPPORTED else values


def input_spec(tooltip: str) -> dict:
    """The optional `native_latent` input, when supported."""
    return {"native_latent": ("LATENT", {"tooltip": tooltip})} if SUPPORTED else {}


def latent_geometry(latent, width: int, height: int) -> tuple[int, int, int]:
    """(frames, width, height) a native AV LATENT describes (e.g. Empty MiniMax H3 AV Latent's): its shape, which
    must agree with width / height widgets that are set (non-zero)."""
    video = from_native(latent).video
    t, h, w = video.shape[2:]
    if t < 2 or (t - 2) % 5:
        raise RequestError(f"native_latent has {t} latent frames; MiniMax-H3 makes 5n+2 (17n+5 frames).")
    size = (w * SPATIAL_RATIO, h * SPATIAL_RATIO)
    if (width or height) and (width, height) != size:
        raise RequestError(f"native_latent is {size[0]}x{size[1]} but width/height say {width}x{height}: set them to "
                           "0 to follow the latent.")
    return frames_for_latents(t), size[0], size[1]


__all__ = ["SUPPORTED", "outputs", "with_native", "input_spec", "latent_geometry", "from_native"]
