"""Path helpers shared by model discovery and the input/output resolvers."""

from __future__ import annotations

import os
from typing import Iterable, List

from .errors import UnsafePathError


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
