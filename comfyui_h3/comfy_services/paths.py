"""Input / output / temp directories (ComfyUI's, or ``./input``, ``./output``, ``./temp`` headless, overridable with
``COMFYUI_H3_INPUT`` / ``COMFYUI_H3_OUTPUT`` / ``COMFYUI_H3_TEMP``) and resolvers that never leave them."""

from __future__ import annotations

import os

from ._comfy import _comfy
from ._fs import _check_relative, _inside, _norm
from .errors import UnsafePathError

ENV_OUTPUT = "COMFYUI_H3_OUTPUT"
ENV_INPUT = "COMFYUI_H3_INPUT"

__all__ = ["ENV_OUTPUT", "ENV_INPUT", "output_directory", "input_directory", "temp_directory", "resolve_in_directory",
           "resolve_output_path", "resolve_input_path"]


def _directory(getter: str, env: str, default: str) -> str:
    fp = _comfy("folder_paths")
    fn = getattr(fp, getter, None) if fp is not None else None
    if fn is not None:
        return _norm(fn())
    return _norm(os.environ.get(env) or default)


def output_directory() -> str:
    """ComfyUI's output directory (``--output-directory`` respected), headless ``$COMFYUI_H3_OUTPUT`` or ./output."""
    return _directory("get_output_directory", ENV_OUTPUT, "output")


def input_directory() -> str:
    """ComfyUI's input directory, headless ``$COMFYUI_H3_INPUT`` or ./input."""
    return _directory("get_input_directory", ENV_INPUT, "input")


def temp_directory() -> str:
    """ComfyUI's temp directory (previews), headless ./temp."""
    return _directory("get_temp_directory", "COMFYUI_H3_TEMP", "temp")


def resolve_in_directory(base: str, relpath: str, must_exist: bool = False) -> str:
    """``base/relpath`` as an absolute path, refusing anything that leaves ``base`` ('..', absolute paths, drive
    letters): :class:`UnsafePathError`. With ``must_exist`` a missing file raises FileNotFoundError."""
    if not isinstance(relpath, (str, os.PathLike)):
        raise TypeError(f"path must be a string, got {type(relpath).__name__}")
    rel = os.fspath(relpath)
    if os.path.isabs(rel) or os.path.splitdrive(rel)[0] or rel.replace("\\", "/").startswith("/"):
        raise UnsafePathError(f"path {rel!r} must be relative to {base}")
    parts = _check_relative(rel, "path")
    base = _norm(base)
    path = os.path.normpath(os.path.join(base, *parts))
    if not _inside(base, path):
        raise UnsafePathError(f"path {rel!r} leaves {base}")
    if must_exist and not os.path.exists(path):
        raise FileNotFoundError(f"{rel!r} not found in {base}")
    return path


def resolve_output_path(relpath: str) -> str:
    """A path inside the output directory (for saving); never outside it."""
    return resolve_in_directory(output_directory(), relpath)


_ANNOTATIONS = (("[input]", input_directory), ("[output]", output_directory), ("[temp]", temp_directory))


def resolve_input_path(name: str, must_exist: bool = True) -> str:
    """A file picked by a loader node: ``name`` relative to the input directory, or with ComfyUI's annotation suffix
    (``"clip.mp4 [output]"``, ``" [input]"``, ``" [temp]"``) relative to that directory. Never outside it."""
    if not isinstance(name, str):
        raise TypeError(f"path must be a string, got {type(name).__name__}")
    stripped = name.rstrip()
    for tag, directory in _ANNOTATIONS:
        if stripped.endswith(tag):
            return resolve_in_directory(directory(), stripped[: -len(tag)].rstrip(), must_exist=must_exist)
    return _with_sample_fallback(name, must_exist)


def _with_sample_fallback(name: str, must_exist: bool) -> str:
    """A name in the input folder; where it is missing there and is one of the pack's sample inputs (what the shipped
    workflows name), the pack's own copy: the workflows run as they are from the CLI, with no input folder set up."""
    try:
        return resolve_in_directory(input_directory(), name, must_exist=must_exist)
    except FileNotFoundError:
        from ..install_samples import SAMPLE_DIR, SAMPLE_FILES

        if name not in SAMPLE_FILES:
            raise
        return os.path.join(SAMPLE_DIR, name)

