"""FastH3 student discovery: the adapter files the H3 Model Loader offers (FastVideo's release,
``FastVideo-FastH3-4-step-Preview-v1-LoRA/vsa-datafree/adapter_model.safetensors`` and its ``dense-datafree``
sibling; docs/FASTH3.md) and resolving a listed name to a path that stays inside its folder.

Folders searched (first match wins): ComfyUI's ``loras`` folder paths (where LoRA-style downloads go;
extra_model_paths.yaml included), then the MiniMax-H3 model roots (models/minimax_h3 ...; ``COMFYUI_H3_MODELS``). A
``.safetensors`` file is listed when its path below the root says FastH3 (``fasth3`` in any folder or file name, any
case), up to four levels deep, so the loader does not list every LoRA of a large collection; the file itself is
checked when the engine config is (models/fasth3.py).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from ._fs import _norm, _unique, find_below, found_under
from .lora_files import comfy_lora_folders, resolve_listed
from .models import h3_model_roots

FASTH3_SCAN_DEPTH = 4
MARKER = "fasth3"

__all__ = ["fasth3_roots", "fasth3_adapter_files", "resolve_fasth3_adapter"]


def fasth3_roots() -> List[str]:
    roots = comfy_lora_folders()
    roots.extend(h3_model_roots())
    return _unique(_norm(r) for r in roots)


def _scan(root: str) -> List[str]:
    return find_below(root, FASTH3_SCAN_DEPTH, file_match=lambda path, parts: parts[-1].endswith(".safetensors")
                      and MARKER in "/".join(parts).lower())



def fasth3_adapter_files(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names (relative to their root, '/' separators) of the FastH3 adapter files under the roots, sorted, each once."""
    return found_under(fasth3_roots() if roots is None else [_norm(r) for r in roots], _scan)


def resolve_fasth3_adapter(name: str, roots: Optional[Sequence[str]] = None) -> str:
    """Absolute path of a listed adapter name; it never leaves its root ('..' refused)."""
    return resolve_listed(name, fasth3_roots() if roots is None else [_norm(r) for r in roots], "FastH3 adapter",
                          "put FastVideo's adapter_model.safetensors in a folder named after FastH3 under "
                          "ComfyUI/models/loras (e.g. loras/FastH3/vsa-datafree/adapter_model.safetensors).")
