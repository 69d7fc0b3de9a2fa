"""Path helpers shared by model discovery and the input/output resolvers."""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, List, Optional, Set, Tuple

from .errors import UnsafePathError

log = logging.getLogger("comfyui_h3")
_SKIPPED: Set[Tuple[str, int, int]] = set()


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _unique(paths: Iterable[str]) -> List[str]:
    out: List[str] = []
    seen = set()
    for p in paths:
        key = os.path.normcase(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _inside(base: str, path: str) -> bool:
    try:
        return os.path.commonpath([os.path.normcase(base), os.path.normcase(path)]) == os.path.normcase(base)
    except ValueError:  # different drives on Windows
        return False


def _check_relative(name: str, what: str) -> List[str]:
    if "\x00" in name:
        raise UnsafePathError(f"{what} {name!r} contains a NUL byte")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafePathError(f"{what} {name!r} must not contain '..' (it would leave its folder)")
    return parts


def find_below(root: str, depth: int, folder_match: Optional[Callable[[str], bool]] = None,
               file_match: Optional[Callable[[str, Tuple[str, ...]], bool]] = None) -> List[str]:
    """The one walk of the model lists: '/'-joined names, relative to `root`, of the folders `folder_match(path)`
    accepts (not descended into) and the files `file_match(path, parts)` accepts, at most `depth` levels down, in
    name order. Hidden entries and entries that cannot be read are skipped; so is an entry whose match raises (a
    crafted or damaged file must never take a loader's list down): logged once, :func:`skip_unreadable`."""
    found: List[str] = []

    def walk(folder: str, rel: Tuple[str, ...], left: int) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            sub = rel + (entry.name,)
            try:
                if entry.is_dir():
                    if folder_match is not None and folder_match(entry.path):
                        found.append("/".join(sub))
                    elif left > 1:
                        walk(entry.path, sub, left - 1)
                elif file_match is not None and entry.is_file() and file_match(entry.path, sub):
                    found.append("/".join(sub))
            except OSError:
                continue
            except Exception as exc:  # noqa: BLE001 - whatever a file's contents make a reader raise
                skip_unreadable(entry.path, exc)

    walk(root, (), depth)
    return found


def skip_unreadable(path: str, exc: BaseException) -> None:
    """Say in the log, once per version of the file (path, size, mtime), that the model lists skip `path` and why
    (the first line of the error: the load of that file would raise the same)."""
    try:
        stat = os.stat(path)
        key = (os.path.normcase(path), stat.st_size, stat.st_mtime_ns)
    except OSError:
        key = (os.path.normcase(path), -1, -1)
    if key in _SKIPPED:
        return
    _SKIPPED.add(key)
    lines = str(exc).strip().splitlines()
    log.warning("comfyui-h3: the model lists skip %s, which cannot be read (%s: %s)", path, type(exc).__name__,
                lines[0] if lines else "")


def listed(names: Iterable[str]) -> List[str]:
    """A model list as the loaders show it: each name once, case-insensitive order (ties: exact order)."""
    return sorted(set(names), key=lambda n: (n.lower(), n))


def found_under(roots: Iterable[str], scan: Callable[[str], List[str]]) -> List[str]:
    """`listed` names `scan(root)` finds under each root that is a folder."""
    return listed(name for root in roots if os.path.isdir(root) for name in scan(root))
