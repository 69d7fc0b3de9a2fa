"""The sample inputs the shipped workflows name (sample_inputs/: two keyframes and a short clip, made by
tools/make_sample_inputs.py), copied into an input folder without ever replacing a file that is there.

ComfyUI gets them when the pack loads (registration.py), the demo in its own input folder. A file of the same name
that differs from the sample (a user's own) is left exactly as it is, and the log says so."""

from __future__ import annotations

import filecmp
import logging
import os
import tempfile

SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample_inputs")
SAMPLE_FILES = ("h3_demo_source.mp4", "h3_demo_first.png", "h3_demo_last.png")

log = logging.getLogger("comfyui_h3")

COPIED, PRESENT, KEPT, FAILED = "copied", "present", "kept", "failed"


def install_sample_inputs(dest_dir: str, source_dir: str = SAMPLE_DIR, names=SAMPLE_FILES) -> dict[str, str]:
    """Copy each sample into `dest_dir` unless a file of that name exists there. Returns {name: outcome}: "copied";
    "present" (the same file is already there); "kept" (a different file of that name: left alone); "failed" (could
    not copy: logged, never raised, so loading the pack cannot fail on it)."""
    outcome = {}
    try:
        os.makedirs(dest_dir, exist_ok=True)
    except OSError as exc:
        log.warning("comfyui-h3: cannot create the input folder %s (%s); the shipped workflows' sample inputs were "
                    "not copied.", dest_dir, exc)
        return {name: FAILED for name in names}
    for name in names:
        source, target = os.path.join(source_dir, name), os.path.join(dest_dir, name)
        try:
            outcome[name] = _copy_new(source, target)
        except OSError as exc:
            outcome[name] = FAILED
            log.warning("comfyui-h3: could not copy the sample input %s into %s (%s).", name, dest_dir, exc)
            continue
        if outcome[name] == COPIED:
            log.info("comfyui-h3: copied the sample input %s into %s (used by the shipped workflows).", name, dest_dir)
        elif outcome[name] == KEPT:
            log.warning("comfyui-h3: %s already exists and is not the pack's sample input; it was left as it is (the "
                        "shipped workflows will use it). Rename it to get the sample.", target)
    return outcome


def _same(a: str, b: str) -> bool:
    try:
        return os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _copy_new(source: str, target: str) -> str:
    if os.path.lexists(target):
        return PRESENT if _same(source, target) else KEPT
    folder = os.path.dirname(target)
    handle, temp = tempfile.mkstemp(prefix=".h3_sample_", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out, open(source, "rb") as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
        os.chmod(temp, 0o644)  # mkstemp makes it private; an input file is an ordinary one
        try:
            os.link(temp, target)  # publishes the complete file, and refuses if one appeared meanwhile
        except FileExistsError:
            return PRESENT if _same(source, target) else KEPT
        except OSError:  # a filesystem without hard links: an exclusive create (never replaces a file)
            try:
                out = open(target, "xb")
            except FileExistsError:
                return PRESENT if _same(source, target) else KEPT
            with out, open(temp, "rb") as src:
                try:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
                except BaseException:
                    out.close()
                    os.remove(target)  # never leave a half-written input
                    raise
        return COPIED
    finally:
        os.remove(temp)
