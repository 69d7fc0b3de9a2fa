"""H3 Load Image: a keyframe or reference image from ComfyUI's input folder (upload button in the editor)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import torch

from .. import comfy_services as services
from ..backend.media.images import IMAGE_EXTENSIONS, open_rgb_image


def _input_images() -> list[str]:
    root = services.input_directory()
    if not os.path.isdir(root):
        return []
    return sorted(f for f in os.listdir(root) if f.lower().endswith(IMAGE_EXTENSIONS)
                  and os.path.isfile(os.path.join(root, f)))


def read_image(path: str) -> torch.Tensor:
    """File -> IMAGE [1, H, W, 3] float 0..1 (EXIF orientation applied)."""
    rgb = open_rgb_image(path)
    return torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0)[None]


class H3LoadImage:
    CATEGORY = "H3"
    FUNCTION = "load"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("The image as IMAGE [1, height, width, 3] float 0..1 (EXIF orientation applied).",)
    DESCRIPTION = "Load an image from the input folder, e.g. a first/last frame or a reference."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": (_input_images(), {
            "image_upload": True, "tooltip": "An image in ComfyUI's input folder (or upload one)."})}}

    @classmethod
    def VALIDATE_INPUTS(cls, image):
        try:
            services.resolve_input_path(image, must_exist=True)
        except (ValueError, FileNotFoundError) as exc:
            return f"Image not found in the input folder: {image} ({exc})"
        return True

    @classmethod
    def IS_CHANGED(cls, image):
        path = services.resolve_input_path(image, must_exist=True)
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()

    def load(self, image):
        return (read_image(services.resolve_input_path(image, must_exist=True)),)
