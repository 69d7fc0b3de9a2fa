"""Model discovery: the folders searched for MiniMax-H3 diffusers folders, listing them, and resolving a name.

Inside ComfyUI the roots are its ``minimax_h3``, ``diffusers`` and ``diffusion_models`` folder paths; headless (and in
addition) ``COMFYUI_H3_MODELS`` (``os.pathsep``-separated).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from ._comfy import _comfy
from ._fs import _check_relative, _inside, _norm, _unique, find_below, listed
from .errors import H3ModelNotFound, UnsafePathError

ENV_MODELS = "COMFYUI_H3_MODELS"

#: ComfyUI folder type we register for H3 checkpoints (``models/minimax_h3``; extra_model_paths.yaml may add more).
H3_FOLDER_TYPE = "minimax_h3"
#: Other ComfyUI folder types searched for H3 diffusers folders, in this order after ``minimax_h3``.
H3_EXTRA_FOLDER_TYPES = ("diffusers", "diffusion_models")
#: How deep below a root a model folder may sit (``root/a``, ``root/org/a``, ``root/org/a/b``).
MODEL_SCAN_DEPTH = 3

__all__ = ["ENV_MODELS", "H3_FOLDER_TYPE", "H3_EXTRA_FOLDER_TYPES", "MODEL_SCAN_DEPTH", "register_h3_model_folder",
           "register_folder_type",
           "h3_model_roots", "h3_model_dirs", "is_h3_model_dir", "resolve_h3_model"]

_MODEL_INDEX_FILES = ("model_index.json", "modular_model_index.json")
_TRANSFORMER_DIRS = ("transformer", "transformer_ref")


def register_h3_model_folder() -> Optional[str]:
    """Register the ``minimax_h3`` folder type with ComfyUI (``<models_dir>/minimax_h3``), keeping entries that
    extra_model_paths.yaml already added. Idempotent; returns the default folder, or None headless. Creates nothing."""
    return register_folder_type(H3_FOLDER_TYPE)


def register_folder_type(folder_type: str) -> Optional[str]:
    """Register ``<models_dir>/<folder_type>`` with ComfyUI's folder_paths, keeping the entries already there.
    Idempotent; returns the default folder, or None headless. Creates nothing."""
    fp = _comfy("folder_paths")
    if fp is None:
        return None
    models_dir = getattr(fp, "models_dir", None)
    if models_dir is None:
        return None
    default = os.path.join(models_dir, folder_type)
    add = getattr(fp, "add_model_folder_path", None)
    table = getattr(fp, "folder_names_and_paths", None)
    if add is not None:
        add(folder_type, default)
    elif isinstance(table, dict):
        paths, exts = table.get(folder_type, ([], set()))
        if default not in paths:
            paths.append(default)
        table[folder_type] = (paths, exts)
    return default


def _env_roots() -> List[str]:
    raw = os.environ.get(ENV_MODELS, "")
    return [_norm(p) for p in raw.split(os.pathsep) if p.strip()]


def h3_model_roots() -> List[str]:
    """Absolute folders searched for H3 models, first match wins: ComfyUI's ``minimax_h3``, ``diffusers`` and
    ``diffusion_models`` folder paths (extra_model_paths.yaml entries included), then ``COMFYUI_H3_MODELS``."""
    roots: List[str] = []
    fp = _comfy("folder_paths")
    if fp is not None:
        register_h3_model_folder()
        get = getattr(fp, "get_folder_paths", None)
        for kind in (H3_FOLDER_TYPE,) + H3_EXTRA_FOLDER_TYPES:
            try:
                roots.extend(get(kind) if get is not None else fp.folder_names_and_paths[kind][0])
            except (KeyError, AttributeError, TypeError):
                continue
    roots.extend(_env_roots())
    return _unique(_norm(r) for r in roots)


def is_h3_model_dir(path: str) -> bool:
    """A diffusers folder of MiniMax-H3: model_index.json (or modular_model_index.json) plus transformer/ or
    transformer_ref/."""
    try:
        has_index = any(os.path.isfile(os.path.join(path, f)) for f in _MODEL_INDEX_FILES)
        return has_index and any(os.path.isdir(os.path.join(path, d)) for d in _TRANSFORMER_DIRS)
    except OSError:
        return False


def _scan(root: str, depth: int) -> List[str]:
    """Relative ('/'-joined) names of H3 folders below ``root``; a qualifying folder is not descended into."""
    return find_below(root, depth, folder_match=is_h3_model_dir)



def h3_model_dirs(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names of MiniMax-H3 diffusers folders under the model roots, relative to their root ('/' separators), sorted,
    each once (the first root holding a name wins, as in ComfyUI). A root that is itself a model folder is listed by
    its base name. Use these names as the loader's combo values; :func:`resolve_h3_model` turns them into paths."""
    names: List[str] = []
    for root in (h3_model_roots() if roots is None else [_norm(r) for r in roots]):
        if not os.path.isdir(root):
            continue
        if is_h3_model_dir(root):
            names.append(os.path.basename(root))
        names.extend(_scan(root, MODEL_SCAN_DEPTH))
    return listed(names)


def resolve_h3_model(name_or_path: str, allow_explicit_path: bool = False,
                     roots: Optional[Sequence[str]] = None) -> str:
    """Absolute path of an H3 diffusers folder.

    ``name_or_path`` is a name from :func:`h3_model_dirs` (relative to a model root), or an absolute path inside one of
    the roots. With ``allow_explicit_path=True`` (CLI and Python users, never a node input) any absolute path, or a path
    relative to the current directory that exists, is accepted as well. A name never escapes its root: '..' is refused
    (:class:`UnsafePathError`). Raises :class:`H3ModelNotFound` when nothing qualifies.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model name must be a string, got {type(name_or_path).__name__}")
    name = os.fspath(name_or_path).strip()
    if not name:
        raise H3ModelNotFound("no MiniMax-H3 model given (empty name)")
    root_list = h3_model_roots() if roots is None else [_norm(r) for r in roots]

    if allow_explicit_path:
        explicit = _norm(name)
        if (os.path.isabs(os.path.expanduser(name)) or os.path.exists(explicit)) and os.path.isdir(explicit):
            if is_h3_model_dir(explicit):
                return explicit
            raise H3ModelNotFound(
                f"{explicit} is not a MiniMax-H3 diffusers folder (needs model_index.json or modular_model_index.json "
                f"and transformer/ or transformer_ref/)")
        if os.path.isabs(os.path.expanduser(name)) and not os.path.exists(explicit):
            raise H3ModelNotFound(f"MiniMax-H3 model folder not found: {explicit}")
        if os.path.isfile(explicit):
            raise H3ModelNotFound(
                f"{explicit} is a file, not a MiniMax-H3 model folder: give the diffusers folder (model_index.json + "
                f"transformer/), or --model release with the single-file options")

    if os.path.isabs(name):
        if "\x00" in name:
            raise UnsafePathError(f"model path {name!r} contains a NUL byte")
        path = os.path.normpath(name)
        if not any(_inside(root, path) for root in root_list):
            raise UnsafePathError(f"model path {name!r} is outside ComfyUI's model folders "
                                  f"({', '.join(root_list) or 'none are set'})")
        if is_h3_model_dir(path):
            return path
        raise H3ModelNotFound(f"{path} is not a MiniMax-H3 diffusers folder")

    parts = _check_relative(name, "model name")
    if not parts:
        raise H3ModelNotFound(f"model name {name!r} names no folder")
    for root in root_list:
        candidate = os.path.normpath(os.path.join(root, *parts))
        if _inside(root, candidate) and candidate != root and is_h3_model_dir(candidate):
            return candidate
        if len(parts) == 1 and parts[0] == os.path.basename(root) and is_h3_model_dir(root):
            return root
    available = h3_model_dirs(root_list)
    raise H3ModelNotFound(
        f"MiniMax-H3 model {name!r} not found under {root_list or '(no model roots)'}; "
        f"available: {available[:10] or 'none'}. Put the diffusers folder (model_index.json + transformer/) in "
        f"ComfyUI/models/{H3_FOLDER_TYPE}/ or set {ENV_MODELS}.")

