"""SAM2 / SAM3 model folders for H3 Track Mask: the folders searched, listing them, resolving a listed name.

Folders (first match wins, as in ComfyUI): ComfyUI's ``sam2`` and ``sam3`` folder types (``models/sam2``,
``models/sam3``; registered here, extra_model_paths.yaml entries kept), then ``COMFYUI_H3_MODELS`` (headless too).
A model is a folder in the transformers layout (config.json with model_type ``sam2_video`` / ``sam2`` or
``sam3_video``, weights, processor files: backend/tracking/sam_models.py), up to :data:`TRACK_SCAN_DEPTH` levels
below a root. Single-file checkpoints other packs keep in models/sam2 are not listed (they are not this layout).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from ._comfy import _comfy
from ._fs import _check_relative, _inside, _norm, _unique, find_below, found_under
from .errors import H3ModelNotFound, UnsafePathError
from .models import ENV_MODELS, register_folder_type

SAM2_FOLDER_TYPE, SAM3_FOLDER_TYPE = "sam2", "sam3"
TRACK_FOLDER_TYPES = (SAM2_FOLDER_TYPE, SAM3_FOLDER_TYPE)
TRACK_SCAN_DEPTH = 2  # root/model, root/org/model

__all__ = ["SAM2_FOLDER_TYPE", "SAM3_FOLDER_TYPE", "TrackModelNotFound", "register_track_model_folders",
           "track_model_roots", "track_model_dirs", "resolve_track_model"]


class TrackModelNotFound(H3ModelNotFound):
    """No SAM2 / SAM3 folder where it was looked for; the message says where to put one."""


def register_track_model_folders() -> None:
    """Register ``models/sam2`` and ``models/sam3`` with ComfyUI (idempotent; nothing headless; creates nothing)."""
    for folder_type in TRACK_FOLDER_TYPES:
        register_folder_type(folder_type)


def track_model_roots() -> List[str]:
    """Absolute folders searched, in order: ComfyUI's sam2 then sam3 folder paths, then ``COMFYUI_H3_MODELS``."""
    roots: List[str] = []
    fp = _comfy("folder_paths")
    if fp is not None:
        register_track_model_folders()
        get = getattr(fp, "get_folder_paths", None)
        for kind in TRACK_FOLDER_TYPES:
            try:
                roots.extend(get(kind) if get is not None else fp.folder_names_and_paths[kind][0])
            except (KeyError, AttributeError, TypeError):
                continue
    roots.extend(_norm(p) for p in os.environ.get(ENV_MODELS, "").split(os.pathsep) if p.strip())
    return _unique(_norm(r) for r in roots)


def _is_model(path: str) -> bool:
    from ..backend.tracking.sam_models import folder_kind

    return folder_kind(path) is not None


def _scan(root: str) -> List[str]:
    return find_below(root, TRACK_SCAN_DEPTH, folder_match=_is_model)


def track_model_dirs(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names ('/'-joined, relative to their root) of the SAM2 / SAM3 folders under the roots, sorted, each once: the
    Track Mask node's model list."""
    return found_under(track_model_roots() if roots is None else [_norm(r) for r in roots], _scan)


def _where() -> str:
    return (f"Put a SAM2 / SAM2.1 folder (e.g. facebook/sam2.1-hiera-large) in ComfyUI/models/{SAM2_FOLDER_TYPE}/ or "
            f"a SAM3 folder (facebook/sam3) in ComfyUI/models/{SAM3_FOLDER_TYPE}/, or a folder in {ENV_MODELS}")


def resolve_track_model(name_or_path: str, allow_explicit_path: bool = False,
                        roots: Optional[Sequence[str]] = None) -> str:
    """Absolute path of a SAM2 / SAM3 folder: a name from :func:`track_model_dirs`, or an absolute path inside one of
    the roots; with ``allow_explicit_path=True`` (CLI and Python users, never a node input) any existing folder. A name
    never leaves its root ('..': :class:`UnsafePathError`). Whether the folder is a usable SAM model is checked when
    it loads (backend/tracking/sam_models.py), with a message naming what it is instead."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"SAM model name must be a string, got {type(name_or_path).__name__}")
    name = os.fspath(name_or_path).strip()
    if not name:
        raise TrackModelNotFound(f"No SAM model given (empty name). {_where()}.")
    if "\x00" in name:
        raise UnsafePathError(f"SAM model name {name!r} contains a NUL byte")
    root_list = track_model_roots() if roots is None else [_norm(r) for r in roots]
    if allow_explicit_path and (os.path.isabs(os.path.expanduser(name)) or os.path.exists(name)):
        path = _norm(name)
        if not os.path.isdir(path):
            raise TrackModelNotFound(f"SAM model folder not found: {path}. {_where()}.")
        return path
    if os.path.isabs(name):
        path = os.path.normpath(name)
        if not any(_inside(root, path) for root in root_list):
            raise UnsafePathError(f"SAM model path {name!r} is outside the model folders {root_list}")
        if not os.path.isdir(path):
            raise TrackModelNotFound(f"SAM model folder not found: {path}. {_where()}.")
        return path
    parts = _check_relative(name, "SAM model name")
    if not parts:
        raise TrackModelNotFound(f"SAM model name {name!r} names no folder. {_where()}.")
    for root in root_list:
        candidate = os.path.normpath(os.path.join(root, *parts))
        if _inside(root, candidate) and candidate != root and os.path.isdir(candidate):
            return candidate
    listed = track_model_dirs(root_list)
    raise TrackModelNotFound(f"SAM model {name!r} not found under {root_list or '(no model folders)'}; available: "
                             f"{listed[:10] or 'none'}. {_where()}.")
