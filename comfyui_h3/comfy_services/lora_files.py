"""LoRA discovery for H3 LoRA: the .safetensors files under ComfyUI's ``loras`` folder paths (extra_model_paths.yaml
included; ``COMFYUI_H3_LORAS`` adds a folder outside ComfyUI), and resolving a listed name to a path that stays inside
its folder. Whether a file is an H3 LoRA is decided when the engine config is checked (models/lora.py)."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from ._comfy import _comfy
from ._fs import _check_relative, _inside, _norm, _unique, find_below, found_under
from .errors import H3ModelNotFound

ENV_LORAS = "COMFYUI_H3_LORAS"
LORA_SCAN_DEPTH = 4

__all__ = ["ENV_LORAS", "comfy_lora_folders", "lora_roots", "lora_files", "resolve_lora", "resolve_listed"]


def comfy_lora_folders() -> List[str]:
    """ComfyUI's ``loras`` folder paths (extra_model_paths.yaml included); none without ComfyUI."""
    fp = _comfy("folder_paths")
    if fp is None:
        return []
    get = getattr(fp, "get_folder_paths", None)
    try:
        return list(get("loras") if get is not None else fp.folder_names_and_paths["loras"][0])
    except (KeyError, AttributeError, TypeError):
        return []


def lora_roots() -> List[str]:
    roots = comfy_lora_folders()
    if os.environ.get(ENV_LORAS):
        roots.extend(os.environ[ENV_LORAS].split(os.pathsep))
    return _unique(_norm(r) for r in roots if r)


def _scan(root: str) -> List[str]:
    return find_below(root, LORA_SCAN_DEPTH, file_match=lambda path, parts: parts[-1].endswith(".safetensors"))


def lora_files(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names (relative to their root, '/' separators) of the .safetensors files under the roots, sorted, each once."""
    return found_under(lora_roots() if roots is None else [_norm(r) for r in roots], _scan)


def resolve_listed(name: str, roots: Sequence[str], what: str, where: str) -> str:
    """Absolute path of a file listed by its name below one of `roots` (first match); it never leaves its root ('..'
    refused). `what` names it in errors; `where` says where such a file goes."""
    parts = _check_relative(str(name).strip(), f"{what} name")
    for root in roots:
        candidate = os.path.normpath(os.path.join(root, *parts)) if parts else root
        if parts and _inside(root, candidate) and os.path.isfile(candidate):
            return candidate
    raise H3ModelNotFound(f"{what} {name!r} not found under {list(roots) or '(no roots)'}: {where}")


def resolve_lora(name: str, roots: Optional[Sequence[str]] = None) -> str:
    """Absolute path of a listed LoRA name; it never leaves its root."""
    return resolve_listed(name, lora_roots() if roots is None else [_norm(r) for r in roots], "LoRA",
                          "put the .safetensors file in ComfyUI/models/loras (or a folder extra_model_paths.yaml "
                          "adds to loras).")
