"""SeedVR2 model discovery: the folders searched for the DiT and VAE files and the text embedding, listing them, and
resolving a listed name to a path that stays inside those folders.

Folders (first match wins, as in ComfyUI):
- DiT (``seedvr2_ema_3b_fp16.safetensors`` ...): ComfyUI's ``SEEDVR2`` folder type (``models/SEEDVR2``, the folder the
  popular ComfyUI-SeedVR2_VideoUpscaler pack downloads into; an extra_model_paths.yaml key in any case, ``seedvr2:``
  included), then ``diffusion_models``; headless (and in addition) ``COMFYUI_H3_MODELS``.
- VAE (``ema_vae_fp16.safetensors``): ``SEEDVR2``, then ``vae``, then ``COMFYUI_H3_MODELS``.
- Text embedding (``pos_emb.safetensors`` or the release's ``pos_emb.pt``): beside the DiT, in the ``SEEDVR2`` folders,
  then in the popular pack's install (``custom_nodes/ComfyUI-SeedVR2_VideoUpscaler/pos_emb.pt``).

A file is listed when its safetensors header says what it is (read once per file version, a few KB, no weights):
every ``.safetensors`` of a SEEDVR2 folder is looked at; in the shared folders (``diffusion_models``, ``vae``,
``COMFYUI_H3_MODELS``) only files whose name says SeedVR2 (``*seedvr*``, ``ema_vae*``) or that sit in a folder
named SEEDVR2.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

from ._comfy import _comfy
from ._fs import _check_relative, _inside, _norm, _unique, find_below, listed
from .errors import H3ModelNotFound, UnsafePathError
from .models import ENV_MODELS, register_folder_type

SEEDVR2_FOLDER_TYPE = "SEEDVR2"
#: Shared ComfyUI folder types searched after SEEDVR2, per kind of file.
SEEDVR2_SHARED_FOLDER_TYPES = {"dit": ("diffusion_models",), "vae": ("vae",)}
#: How deep below a root a file may sit (``root/f``, ``root/a/f``, ``root/a/b/f``).
SEEDVR2_SCAN_DEPTH = 3
#: Folder names (lower case) of the popular SeedVR2 pack under custom_nodes (git clone / ComfyUI registry install).
SEEDVR2_PACK_DIRS = ("comfyui-seedvr2_videoupscaler", "seedvr2_videoupscaler")
KINDS = {"dit": "DiT", "vae": "VAE"}

__all__ = ["SEEDVR2_FOLDER_TYPE", "SeedVR2FileNotFound", "register_seedvr2_model_folder", "seedvr2_roots",
           "seedvr2_dit_files", "seedvr2_vae_files", "seedvr2_file_kind", "resolve_seedvr2_file",
           "find_seedvr2_vae", "find_seedvr2_text_embedding"]

log = logging.getLogger("comfyui_h3")


class SeedVR2FileNotFound(H3ModelNotFound):
    """No SeedVR2 DiT / VAE / text embedding where it was looked for; the message says where to put it."""


# -- folders ---------------------------------------------------------------------------------------------------------

def register_seedvr2_model_folder() -> Optional[str]:
    """Register the ``SEEDVR2`` folder type with ComfyUI (``<models_dir>/SEEDVR2``), keeping entries that
    extra_model_paths.yaml (or the popular pack) already added. Idempotent; returns the default folder, or None
    headless. Creates nothing."""
    default = register_folder_type(SEEDVR2_FOLDER_TYPE)
    if default is None:
        return None
    table = getattr(_comfy("folder_paths"), "folder_names_and_paths", None)
    if isinstance(table, dict) and SEEDVR2_FOLDER_TYPE in table and not table[SEEDVR2_FOLDER_TYPE][1]:
        table[SEEDVR2_FOLDER_TYPE] = (table[SEEDVR2_FOLDER_TYPE][0], {".safetensors"})  # get_filename_list's filter
    return default


def _folder_type_paths(fp, kind: str) -> List[str]:
    get = getattr(fp, "get_folder_paths", None)
    try:
        return list(get(kind) if get is not None else fp.folder_names_and_paths[kind][0])
    except (KeyError, AttributeError, TypeError):
        return []


def _seedvr2_folders() -> List[str]:
    """Every folder of a SEEDVR2 folder type, whatever its case (the popular pack registers ``seedvr2``)."""
    fp = _comfy("folder_paths")
    if fp is None:
        return []
    register_seedvr2_model_folder()
    table = getattr(fp, "folder_names_and_paths", None) or {}
    kinds = [SEEDVR2_FOLDER_TYPE] + sorted(k for k in table if k.lower() == "seedvr2" and k != SEEDVR2_FOLDER_TYPE)
    return [p for kind in kinds for p in _folder_type_paths(fp, kind)]


def _env_roots() -> List[str]:
    raw = os.environ.get(ENV_MODELS, "")
    return [_norm(p) for p in raw.split(os.pathsep) if p.strip()]


def seedvr2_roots(kind: str) -> List[Tuple[str, bool]]:
    """(absolute folder, dedicated) searched for `kind` ("dit" or "vae"), in order: the SEEDVR2 folders (dedicated:
    every file in them is looked at), the shared folder types, then ``COMFYUI_H3_MODELS``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    roots: List[Tuple[str, bool]] = [(p, True) for p in _seedvr2_folders()]
    fp = _comfy("folder_paths")
    if fp is not None:
        for folder_type in SEEDVR2_SHARED_FOLDER_TYPES[kind]:
            roots.extend((p, False) for p in _folder_type_paths(fp, folder_type))
    roots.extend((p, False) for p in _env_roots())
    seen, out = set(), []
    for path, dedicated in roots:
        path = _norm(path)
        key = os.path.normcase(path)
        if key not in seen:
            seen.add(key)
            out.append((path, dedicated))
    return out


# -- what a file is ----------------------------------------------------------------------------------------------------

_KIND_CACHE: Dict[Tuple[str, int, int], Optional[str]] = {}


def seedvr2_file_kind(path: str) -> Optional[str]:
    """"dit" (a SeedVR2 3B or 7B DiT), "vae" (a SeedVR2 video VAE) or None, from the safetensors header alone.
    Cached per (path, size, mtime): ComfyUI asks for the lists on every /object_info."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (os.path.normcase(path), stat.st_size, stat.st_mtime_ns)
    if key not in _KIND_CACHE:
        _KIND_CACHE[key] = _read_kind(path)
    return _KIND_CACHE[key]


def header_error(path: str) -> Optional[str]:
    """Why `path`'s safetensors header cannot be read (one line naming the file: truncated, corrupt), or None."""
    from ..backend.models.checkpoint import CheckpointError
    from ..backend.models.seedvr2.checkpoints import header_shapes

    try:
        header_shapes(path)
    except (CheckpointError, OSError) as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - the reason is reported, whatever the library raised
        return f"Cannot read {path}: {type(exc).__name__}: {exc}"
    return None


def _read_kind(path: str) -> Optional[str]:
    from ..backend.models.checkpoint import CheckpointError
    from ..backend.models.seedvr2.checkpoints import dit_variant, header_shapes

    try:
        shapes = header_shapes(path)
    except (CheckpointError, OSError) as exc:
        log.warning("comfyui-h3: skipping %s (%s)", path, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a foreign file in a shared folder must never break the listing
        log.warning("comfyui-h3: skipping %s (%s: %s)", path, type(exc).__name__, exc)
        return None
    conv_in, conv_out = shapes.get("encoder.conv_in.weight"), shapes.get("decoder.conv_out.weight")
    if conv_in is not None and conv_out is not None:  # 5-D kernels: the causal 3-D video VAE
        return "vae" if len(conv_in) == 5 and len(conv_out) == 5 else None
    try:
        dit_variant(shapes, path)
    except CheckpointError:
        return None
    return "dit"


def _named_like(kind: str, name: str, rel_parts: Sequence[str]) -> bool:
    lower = name.lower()
    if any(part.lower() == "seedvr2" for part in rel_parts[:-1]):
        return True
    return "seedvr" in lower or (kind == "vae" and lower.startswith("ema_vae"))


def _scan(root: str, kind: str, dedicated: bool) -> List[str]:
    """'/'-joined names, relative to `root`, of the `kind` files below it (hidden entries skipped)."""
    def match(path: str, parts: Tuple[str, ...]) -> bool:
        return (parts[-1].lower().endswith(".safetensors") and (dedicated or _named_like(kind, parts[-1], parts))
                and seedvr2_file_kind(path) == kind)

    return find_below(root, SEEDVR2_SCAN_DEPTH, file_match=match)



def _files(kind: str, roots: Optional[Sequence[str]]) -> List[str]:
    pairs = seedvr2_roots(kind) if roots is None else [(_norm(r), True) for r in roots]
    names: List[str] = []
    for root, dedicated in pairs:
        if os.path.isdir(root):
            names.extend(_scan(root, kind, dedicated))
    return listed(names)


def seedvr2_dit_files(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names of the SeedVR2 DiT files (3B and 7B, any precision), relative to their folder, sorted, each once: the
    loader's combo values; :func:`resolve_seedvr2_file` turns one into a path."""
    return _files("dit", roots)


def seedvr2_vae_files(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names of the SeedVR2 VAE files, as :func:`seedvr2_dit_files`."""
    return _files("vae", roots)


# -- resolving ---------------------------------------------------------------------------------------------------------

def _where(kind: str) -> str:
    return (f"ComfyUI/models/{SEEDVR2_FOLDER_TYPE}/ (or models/{SEEDVR2_SHARED_FOLDER_TYPES[kind][0]}/, or a folder "
            f"in {ENV_MODELS})")


def resolve_seedvr2_file(name_or_path: str, kind: str, allow_explicit_path: bool = False,
                         roots: Optional[Sequence[str]] = None) -> str:
    """Absolute path of a SeedVR2 `kind` file ("dit" or "vae").

    `name_or_path`: a name from :func:`seedvr2_dit_files` / :func:`seedvr2_vae_files`, or an absolute path inside
    one of the folders. With ``allow_explicit_path=True`` (CLI and Python users, never a node input) any existing
    file path is accepted too. A name never leaves its folder ('..' is refused: :class:`UnsafePathError`); a file that
    is not a SeedVR2 `kind` file, or none at all, is :class:`SeedVR2FileNotFound` naming where to put it."""
    what = f"SeedVR2 {KINDS[kind]}" if kind in KINDS else None
    if what is None:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"{what} name must be a string, got {type(name_or_path).__name__}")
    name = os.fspath(name_or_path).strip()
    if not name:
        raise SeedVR2FileNotFound(f"No {what} file given (empty name).")
    if "\x00" in name:
        raise UnsafePathError(f"{what} name {name!r} contains a NUL byte")
    pairs = seedvr2_roots(kind) if roots is None else [(_norm(r), True) for r in roots]
    root_list = [r for r, _ in pairs]

    if allow_explicit_path and (os.path.isabs(os.path.expanduser(name)) or os.path.exists(name)):
        path = _norm(name)
        if not os.path.isfile(path):
            raise SeedVR2FileNotFound(f"{what} file not found: {path}")
        return _checked(path, kind, what)

    if os.path.isabs(name):
        path = os.path.normpath(name)
        if not any(_inside(root, path) for root in root_list):
            raise UnsafePathError(f"{what} path {name!r} is outside ComfyUI's model folders "
                                  f"({', '.join(root_list) or 'none are set'})")
        if not os.path.isfile(path):
            raise SeedVR2FileNotFound(f"{what} file not found: {path}")
        return _checked(path, kind, what)

    parts = _check_relative(name, f"{what} name")
    if not parts:
        raise SeedVR2FileNotFound(f"{what} name {name!r} names no file")
    for root in root_list:
        candidate = os.path.normpath(os.path.join(root, *parts))
        if _inside(root, candidate) and os.path.isfile(candidate):
            return _checked(candidate, kind, what)
    listed = _files(kind, None if roots is None else root_list)
    raise SeedVR2FileNotFound(
        f"{what} {name!r} not found under {root_list or '(no model folders)'}; available: {listed[:10] or 'none'}. "
        f"Put it in {_where(kind)}.")


def _checked(path: str, kind: str, what: str) -> str:
    found = seedvr2_file_kind(path)
    if found == kind:
        return path
    if found is not None:
        raise SeedVR2FileNotFound(f"{path} is a SeedVR2 {KINDS[found]}, not a {KINDS[kind]}: choose it as the "
                                  f"{KINDS[found]}.")
    cause = header_error(path)  # the listing skips unreadable files; a file the user named gets the real reason
    if cause is not None:
        raise SeedVR2FileNotFound(f"{cause.rstrip('.')}; it cannot be used as the {what}.")
    raise SeedVR2FileNotFound(f"{path} is not a {what} file (its safetensors header holds no SeedVR2 "
                              f"{KINDS[kind]} tensors).")


def find_seedvr2_vae(dit_path: str) -> str:
    """The VAE to use with `dit_path` when none is chosen: a VAE file beside the DiT, else the first in the SEEDVR2 /
    vae folders; in each place the release's name (ema_vae*.safetensors) first."""
    def preferred(names: List[str]) -> str:
        return min(names, key=lambda n: (not n.rsplit("/", 1)[-1].lower().startswith("ema_vae"), n.count("/"), n))

    beside = os.path.dirname(os.path.abspath(dit_path))
    dedicated = {os.path.normcase(r) for r, d in seedvr2_roots("vae") if d}
    try:
        entries = sorted(e.name for e in os.scandir(beside) if e.is_file() and e.name.lower().endswith(".safetensors")
                         and not e.name.startswith("."))
    except OSError:
        entries = []
    here = [n for n in entries if (os.path.normcase(beside) in dedicated or _named_like("vae", n, (n,)))
            and seedvr2_file_kind(os.path.join(beside, n)) == "vae"]
    if here:
        return os.path.join(beside, preferred(here))
    for name in entries:  # the release's VAE beside the DiT but unreadable: name it rather than look elsewhere
        cause = header_error(os.path.join(beside, name)) if name.lower().startswith("ema_vae") else None
        if cause is not None:
            raise SeedVR2FileNotFound(f"{cause.rstrip('.')}; it sits beside {dit_path} as its VAE: download "
                                      f"ema_vae_fp16.safetensors again, or choose a VAE in the loader.")
    for root, is_dedicated in seedvr2_roots("vae"):
        names = _scan(root, "vae", is_dedicated) if os.path.isdir(root) else []
        if names:
            return os.path.join(root, *preferred(names).split("/"))
    raise SeedVR2FileNotFound(
        f"No SeedVR2 VAE beside {dit_path} or in the model folders: download ema_vae_fp16.safetensors (the SeedVR2 "
        f"release's VAE) into {_where('vae')}, or choose a VAE in the loader.")


def _pack_folders() -> List[str]:
    """Install folders of the popular SeedVR2 pack under ComfyUI's custom_nodes (it keeps pos_emb.pt at its root)."""
    fp = _comfy("folder_paths")
    if fp is None:
        return []
    out = []
    for custom in _folder_type_paths(fp, "custom_nodes"):
        try:
            entries = list(os.scandir(custom))
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                if entry.is_dir() and entry.name.lower() in SEEDVR2_PACK_DIRS:
                    out.append(entry.path)
            except OSError:
                continue
    return out


def find_seedvr2_text_embedding(dit_path: str) -> str:
    """The fixed prompt embedding SeedVR2 runs with (pos_emb.safetensors preferred to pos_emb.pt in each folder):
    beside the DiT, in the SEEDVR2 folders, then in the popular pack's install. SeedVR2FileNotFound says where to
    put it."""
    folders = ([os.path.dirname(os.path.abspath(dit_path))] + _seedvr2_folders() + _env_roots()
               + _pack_folders())
    searched = _unique(_norm(f) for f in folders)
    from ..backend.models.seedvr2.checkpoints import text_embedding_in

    for folder in searched:
        found = text_embedding_in(folder)  # one rule for which of the two files a folder offers
        if found is not None:
            return str(found)
    raise SeedVR2FileNotFound(
        f"SeedVR2's text embedding pos_emb.pt was not found (looked in {', '.join(searched)}): download pos_emb.pt "
        f"from the SeedVR2 release (huggingface.co/ByteDance-Seed/SeedVR2-3B) into ComfyUI/models/"
        f"{SEEDVR2_FOLDER_TYPE}/, beside the DiT.")
