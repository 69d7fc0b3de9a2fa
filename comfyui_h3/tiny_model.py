"""The embedded tiny MiniMax-H3 set: built on first use into a cache folder (it makes noise-like video; it exists
so the demo, the tests and the shipped workflows run anywhere without the 62 GB release)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TINY_NAME = "tiny-h3 (built-in test model, makes noise)"


def cache_dir() -> Path:
    root = os.environ.get("COMFYUI_H3_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "comfyui_h3")
    return Path(root)


def ensure_tiny_model(target: str | os.PathLike | None = None) -> Path:
    """Path of the tiny set, building it if absent. Built in a temp folder beside the target and renamed into place,
    so a crash never leaves a half-built model that later runs would trust."""
    from .backend.models.tiny import make_tiny_h3

    target = Path(target) if target else cache_dir() / "tiny-h3"
    if (target / "model_index.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-h3-", dir=target.parent))
    try:
        built = make_tiny_h3(staging / "model", overwrite=True)
        try:
            os.rename(built, target)
        except OSError:
            if not (target / "model_index.json").is_file():  # lost a race to another builder: theirs is fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


TINY_STUDENT_NAME = "tiny-fasth3 (built-in test student for the tiny model)"


def ensure_tiny_student(variant: str = "vsa-datafree", target: str | os.PathLike | None = None) -> Path:
    """The tiny FastH3 student's adapter file for the tiny H3 set (backend/models/tiny_fasth3.py), in the release's
    layout: <cache>/tiny-fasth3/vsa-datafree/adapter_model.safetensors (learned VSA gates) or dense-datafree/ (none);
    built if absent (written beside and renamed into place)."""
    from .backend.models.tiny_fasth3 import make_tiny_fasth3

    if variant not in ("vsa-datafree", "dense-datafree"):
        raise ValueError(f"tiny student variant must be vsa-datafree or dense-datafree, got {variant!r}.")
    target = Path(target) if target else cache_dir() / "tiny-fasth3" / variant / "adapter_model.safetensors"
    if not target.is_file():
        make_tiny_fasth3(target, gates=variant == "vsa-datafree")
    return target


TINY_SEEDVR2_NAME = "tiny-seedvr2 (built-in test model, makes noise)"


def ensure_tiny_seedvr2(target: str | os.PathLike | None = None, variant: str = "3b") -> Path:
    """Folder of the tiny SeedVR2 set (DiT, VAE, text embedding; backend/models/seedvr2/tiny.py), built if absent,
    staged and renamed into place like the tiny H3 set."""
    from .backend.models.seedvr2.tiny import DIT_FILE, make_tiny_seedvr2

    target = Path(target) if target else cache_dir() / f"tiny-seedvr2-{variant}"
    if (target / DIT_FILE.format(variant=variant)).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-seedvr2-", dir=target.parent))
    try:
        built = make_tiny_seedvr2(staging / "model", variant)
        try:
            os.rename(built, target)
        except OSError:
            if not (target / DIT_FILE.format(variant=variant)).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


TINY_SAM2_NAME = "tiny-sam2 (built-in test model, segments nothing)"
TINY_SAM3_NAME = "tiny-sam3 (built-in test model, segments nothing)"


def _ensure_tiny_folder(name: str, make, target) -> Path:
    target = Path(target) if target else cache_dir() / name
    if (target / "config.json").is_file() and (target / "processor_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        built = make(staging / "model")
        try:
            os.rename(built, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_tiny_sam2(target: str | os.PathLike | None = None) -> Path:
    """Folder of the tiny random SAM2 video model (backend/tracking/tiny.py; it segments nothing meaningful), built
    if absent (about a second), staged and renamed into place like the tiny H3 set."""
    from .backend.tracking.tiny import make_tiny_sam2

    return _ensure_tiny_folder("tiny-sam2", make_tiny_sam2, target)


def ensure_tiny_sam3(target: str | os.PathLike | None = None) -> Path:
    """Folder of the tiny random SAM3 video model (text prompts + its tracker; segments nothing meaningful), built if
    absent, like :func:`ensure_tiny_sam2`."""
    from .backend.tracking.tiny import make_tiny_sam3

    return _ensure_tiny_folder("tiny-sam3", make_tiny_sam3, target)
