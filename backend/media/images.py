"""Still images from files: RGB, EXIF orientation applied, unreadable files as a clear ValueError."""

from __future__ import annotations

import os

from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def open_rgb_image(path: str | os.PathLike) -> Image.Image:
    try:
        with Image.open(path) as img:
            return ImageOps.exif_transpose(img).convert("RGB")
    except FileNotFoundError:
        raise FileNotFoundError(f"Image not found: {path}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"Cannot read image {os.path.basename(os.fspath(path))}: {exc}") from None
