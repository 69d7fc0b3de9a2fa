"""The embedded tiny MiniMax-H3 set: built on first use into a cache folder (it makes noise-like video; it exists
so the demo, the tests and the shipped workflows run anywhere without the 62 GB release)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

TINY_NAME = "tiny-h3 (built-in test model, makes noise)"


def cache_dir() -> Path:
    root = os.environ.get("COMFYUI_H3_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "comfyui_h3")
    return Path(root)


class TinyCacheError(OSError):
    """A tiny set could not be built in its cache folder (full, read-only): one sentence naming the folder."""

    def __init__(self, code: int | None, message: str):
        super().__init__(message)
        self.errno = code


@contextlib.contextmanager
def _building(what: str, folder: Path):
    """Building `what` into `folder`: a failed write there (a full disk reported by the OS or only as safetensors'
    text) becomes TinyCacheError naming the folder and COMFYUI_H3_CACHE, instead of a cause that names no file."""
    try:
        yield
    except Exception as exc:
        cause = _write_cause(exc)
        if cause is None:
            raise
        raise TinyCacheError(cause[0], f"Cannot build the tiny {what} in the cache folder {folder}: {cause[1]} "
                                       "(free some space there, or set COMFYUI_H3_CACHE to another folder).") from None


def _write_cause(exc: BaseException) -> tuple[int | None, str] | None:
    """(errno, reason) of a failed file write, else None (a bug keeps its traceback)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and (seen.errno or seen.strerror):
            return seen.errno, seen.strerror or os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if type(exc).__name__ == "SafetensorError" or "No space left" in text:
        if "No space left" in text or "StorageFull" in text:
            return errno.ENOSPC, os.strerror(errno.ENOSPC)
        return None, f"safetensors could not write a file ({text.splitlines()[0] if text else 'no reason given'})"
    return None


def ensure_tiny_model(target: str | os.PathLike | None = None) -> Path:
    """Path of the tiny set, building it if absent. Built in a temp folder beside the target and renamed into place,
    so a crash never leaves a half-built model that later runs would trust."""
    from .backend.models.tiny import make_tiny_h3

    target = Path(target) if target else cache_dir() / "tiny-h3"
    if (target / "model_index.json").is_file():
        return target
    with _building("MiniMax-H3 model", target.parent):
        return _build_tiny_h3(target, make_tiny_h3)


def _build_tiny_h3(target: Path, make_tiny_h3) -> Path:
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
        with _building("FastH3 student", target.parent):
            make_tiny_fasth3(target, gates=variant == "vsa-datafree")
    return target


TINY_LORA_NAME = "tiny-h3-lora (built-in test LoRA for the tiny model)"
TINY_TURBO_LORA_NAME = "tiny-h3-turbo (built-in test LoRA named as LightX2V's 4-step Turbo)"
# named as a released Turbo file so the turbo schedule reads its contract (models/turbo_lora.py): 4 steps, shift 6
TINY_TURBO_FILE = "tiny_h3_fl2v_turbo_4step_v1.1_768p_bf16.safetensors"


def ensure_tiny_lora(target: str | os.PathLike | None = None, turbo: bool = False) -> Path:
    """A random rank-4 kohya-layout LoRA over every block of the tiny H3 set (backend/models/lora_write.py):
    <cache>/tiny-h3-lora/tiny-h3-lora.safetensors, built if absent (written beside and renamed into place).
    `turbo`: another one (its own seed), named as LightX2V's 4-step Turbo file (TINY_TURBO_FILE) -- random weights:
    it distils nothing, it lets the turbo schedule and its workflow run on the tiny model."""
    from .backend.models.lora_write import make_random_lora

    name = TINY_TURBO_FILE if turbo else "tiny-h3-lora.safetensors"
    target = Path(target) if target else cache_dir() / "tiny-h3-lora" / name
    if not target.is_file():
        with _building("LoRA", target.parent):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                make_random_lora(target, seed=2025 if turbo else 2024)
            except FileExistsError:  # another process built it meanwhile
                pass
    return target


TINY_SEEDVR2_NAME = "tiny-seedvr2 (built-in test model, makes noise)"


def ensure_tiny_seedvr2(target: str | os.PathLike | None = None, variant: str = "3b") -> Path:
    """Folder of the tiny SeedVR2 set (DiT, VAE, text embedding; backend/models/seedvr2/tiny.py), built if absent,
    staged and renamed into place like the tiny H3 set."""
    from .backend.models.seedvr2.tiny import DIT_FILE, make_tiny_seedvr2

    target = Path(target) if target else cache_dir() / f"tiny-seedvr2-{variant}"
    if (target / DIT_FILE.format(variant=variant)).is_file():
        return target
    with _building("SeedVR2 model", target.parent):
        return _build_tiny_seedvr2(target, variant, make_tiny_seedvr2, DIT_FILE)


def _build_tiny_seedvr2(target: Path, variant: str, make_tiny_seedvr2, DIT_FILE) -> Path:  # noqa: N803
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
    with _building(name.removeprefix("tiny-").upper() + " model", target.parent):
        return _build_tiny_folder(name, make, target)


def _build_tiny_folder(name: str, make, target: Path) -> Path:
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
