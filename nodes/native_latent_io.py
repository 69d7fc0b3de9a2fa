"""The native MiniMax-H3 AV LATENT on our nodes: an appended LATENT output, and the inputs that take one, declared
only when the ComfyUI at hand has NestedTensor (decided when the pack loads; older ComfyUIs show neither). The
conversion itself lives in comfyui_h3/native_latent.py."""

from __future__ import annotations

from ..native_latent import from_native, native_latent_supported, to_native

SUPPORTED = native_latent_supported()
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
    from .sources import latent_size

    return latent_size(from_native(latent).video, width, height, "native_latent")


__all__ = ["SUPPORTED", "outputs", "with_native", "input_spec", "latent_geometry", "from_native"]
