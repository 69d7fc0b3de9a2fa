"""ComfyUI's native MiniMax-H3 single files (docs/NATIVE_H3.md): the model folders they live in, listing them for the
loader's dropdowns, resolving a picked name to a path inside those folders; and the two pieces of ComfyUI a native
setup borrows: its Qwen tokenizer folder and its NestedTensor (the native AV LATENT's container).

Folders (ComfyUI's folder types, so extra_model_paths.yaml entries are included; first match wins, as in ComfyUI):
the DiT in ``diffusion_models`` (``unet``), the text encoder in ``text_encoders`` (``clip``), both VAEs in ``vae``;
headless (and in addition) ``COMFYUI_H3_MODELS``. A file is listed for a component when its safetensors header says
it is that component's native file (read once per file version, no weights).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Dict, List, Optional, Tuple

from ._comfy import _comfy, _mode
from ._fs import _check_relative, _inside, _norm, find_below, listed, skip_unreadable
from .errors import H3ModelNotFound, UnsafePathError
from .models import ENV_MODELS

FROM_FOLDER = "from model folder"
#: component -> ComfyUI folder types searched, in order.
NATIVE_FOLDER_TYPES = {
    "transformer": ("diffusion_models", "unet"),
    "transformer_ref": ("diffusion_models", "unet"),
    "text_encoder": ("text_encoders", "clip"),
    "vae": ("vae",),
    "audio_vae": ("vae",),
}
SCAN_DEPTH = 3
TOKENIZER_SUBDIR = ("comfy", "text_encoders", "qwen25_tokenizer")

__all__ = ["FROM_FOLDER", "NATIVE_FOLDER_TYPES", "native_file_roots", "native_files", "resolve_native_file",
           "comfy_tokenizer_dir", "nested_tensor_class"]


def native_file_roots(component: str) -> List[str]:
    if component not in NATIVE_FOLDER_TYPES:
        raise ValueError(f"component must be one of {sorted(NATIVE_FOLDER_TYPES)}, got {component!r}")
    roots: List[str] = []
    fp = _comfy("folder_paths")
    if fp is not None:
        get = getattr(fp, "get_folder_paths", None)
        for kind in NATIVE_FOLDER_TYPES[component]:
            try:
                roots.extend(get(kind) if get is not None else fp.folder_names_and_paths[kind][0])
            except (KeyError, AttributeError, TypeError):
                continue
    roots.extend(_norm(p) for p in os.environ.get(ENV_MODELS, "").split(os.pathsep) if p.strip())
    seen, out = set(), []
    for root in roots:
        root = _norm(root)
        if os.path.normcase(root) not in seen:
            seen.add(os.path.normcase(root))
            out.append(root)
    return out


_KIND_CACHE: Dict[Tuple[str, int, int], Optional[str]] = {}


def _file_kind(path: str) -> Optional[str]:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (path, stat.st_size, int(stat.st_mtime_ns))
    if key not in _KIND_CACHE:
        from ..backend.models.native_load import native_file_kind

        try:
            _KIND_CACHE[key] = native_file_kind(path)
        except Exception as exc:  # noqa: BLE001 - an unreadable file is left out of the list, said once in the log
            skip_unreadable(path, exc)
            _KIND_CACHE[key] = None
    return _KIND_CACHE[key]


def _scan(root: str) -> List[str]:
    return find_below(root, SCAN_DEPTH, file_match=lambda path, parts: parts[-1].endswith(".safetensors"))



def native_files(component: str) -> List[str]:
    """Names (relative to their folder, '/' separators) of the native MiniMax-H3 files of `component` (the DiT for
    transformer / transformer_ref), sorted, each once."""
    kind = "transformer" if component.startswith("transformer") else component
    names = set()
    for root in native_file_roots(component):
        for name in _scan(root):
            if name not in names and _file_kind(os.path.join(root, *name.split("/"))) == kind:
                names.add(name)
    return listed(names)


def resolve_native_file(component: str, name: str) -> str:
    """Absolute path of a file picked for `component`: a name from :func:`native_files`, never outside its folders
    (:class:`UnsafePathError`); :class:`H3ModelNotFound` when no folder holds it."""
    if not isinstance(name, str) or not name.strip():
        raise H3ModelNotFound(f"no {component} file given")
    if os.path.isabs(name):
        raise UnsafePathError(f"{component} file {name!r} must be a name from the list, relative to its folder")
    parts = _check_relative(name, f"{component} file")
    roots = native_file_roots(component)
    for root in roots:
        path = os.path.normpath(os.path.join(root, *parts))
        if _inside(root, path) and os.path.isfile(path):
            return path
    folders = "/".join(NATIVE_FOLDER_TYPES[component])
    raise H3ModelNotFound(f"{component} file {name!r} not found under ComfyUI's {folders} folders {roots}; put it "
                          f"in models/{NATIVE_FOLDER_TYPES[component][0]}/ (or set {ENV_MODELS}).")


def comfy_tokenizer_dir() -> Optional[str]:
    """The Qwen tokenizer folder of the ComfyUI this process runs in (comfy/text_encoders/qwen25_tokenizer), or None
    headless / when that ComfyUI has none."""
    fp = _comfy("folder_paths")
    base = getattr(fp, "base_path", None) if fp is not None else None
    if base:
        path = os.path.join(base, *TOKENIZER_SUBDIR)
        if os.path.isfile(os.path.join(path, "vocab.json")):
            return path
    return None


def nested_tensor_class():
    """ComfyUI's NestedTensor (comfy.nested_tensor, ComfyUI 0.8+), or None: headless, or a ComfyUI without it."""
    if _mode() == "off":
        return None
    module = sys.modules.get("comfy.nested_tensor")
    if module is None and ("comfy" in sys.modules or _mode() == "import"):
        try:
            module = importlib.import_module("comfy.nested_tensor")
        except Exception:  # an older ComfyUI
            return None
    return getattr(module, "NestedTensor", None)
