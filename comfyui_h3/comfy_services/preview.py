"""Live sampling previews on ComfyUI's own preview channel: whether this prompt wants them (ComfyUI's preview method:
``--preview-method``, or the frontend's per-prompt setting), how often (``COMFYUI_H3_PREVIEW_EVERY``), and the image
value ComfyUI's progress hook sends (what ``latent_preview`` hands ``ProgressBar.update_absolute``)."""

from __future__ import annotations

import os

from ._comfy import _comfy

__all__ = ["ENV_PREVIEW_EVERY", "DEFAULT_PREVIEW_EVERY", "preview_every", "preview_image"]

ENV_PREVIEW_EVERY = "COMFYUI_H3_PREVIEW_EVERY"
DEFAULT_PREVIEW_EVERY = 1  # like KSampler's previews: a DiT step takes seconds, a preview well under 1% of one
DEFAULT_PREVIEW_SIZE = 512  # ComfyUI's --preview-size default


def preview_every() -> int:
    """Denoise steps between live previews for the node running now: 0 (none, and no preview work in the workers)
    headless or when ComfyUI's preview method is ``none``; else ``COMFYUI_H3_PREVIEW_EVERY`` (default 1; 0 turns
    them off). Any other method (auto, latent2rgb, taesd) shows the pack's latent -> RGB preview."""
    cli = _comfy("comfy.cli_args")
    args = getattr(cli, "args", None) if cli is not None else None
    method = getattr(args, "preview_method", None)
    if getattr(method, "value", method) in (None, "none"):
        return 0
    raw = os.environ.get(ENV_PREVIEW_EVERY, "").strip()
    if not raw:
        return DEFAULT_PREVIEW_EVERY
    try:
        every = int(raw)
    except ValueError:
        every = -1
    if every < 0:
        raise ValueError(f"{ENV_PREVIEW_EVERY}={raw!r} is not a whole number of steps >= 0 (0 = no previews); "
                         "fix or unset it.")
    return every


def preview_image(pixels):
    """uint8 [H, W, 3] (numpy) -> the preview value of ComfyUI's progress hook: ("JPEG", PIL image, the largest
    side ComfyUI scales it to: ``--preview-size``)."""
    import numpy as np
    from PIL import Image

    cli = _comfy("comfy.cli_args")
    size = getattr(getattr(cli, "args", None), "preview_size", None) if cli is not None else None
    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "RGB")
    return ("JPEG", image, int(size) if isinstance(size, int) and size > 0 else DEFAULT_PREVIEW_SIZE)
