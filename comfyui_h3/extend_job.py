"""Host side of an extension, shared by H3 Extend and `python -m comfyui_h3 extend`: prompts per window, the
engine run with "window k/K, step s/S" progress, and the fate of the streamed file (complete, or kept as a clearly
named partial when stopped). The worker writes the file itself (backend extension_output.FileSink); the host only
reserves its name and renames a stopped run's file."""

from __future__ import annotations

import os
import shutil

PROMPT_SEPARATOR = "---"


def split_prompts(text: str) -> list[str]:
    """One prompt for every window, or one per window separated by lines holding only `---`."""
    parts, current = [], []
    for line in (text or "").splitlines():
        if line.strip() == PROMPT_SEPARATOR:
            parts.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    parts.append("\n".join(current).strip())
    return [p for p in parts if p] or [""]


def keep_partial(path: str, directory: str, prefix: str) -> str:
    """Move a stopped run's published file to a new `<prefix>_NNNNN.mp4` under `directory` (never overwriting)."""
    from .backend.media.encode import next_free_path

    target = next_free_path(directory, prefix, "mp4")  # an empty placeholder we own
    try:
        os.replace(path, target)
    except OSError:  # another file system: copy over our placeholder, then drop the original
        shutil.copyfile(path, target)
        os.unlink(path)
    return target


def keep_in_output(path: str, prefix: str) -> str:
    """A stopped node's finished part moved to `<prefix>_NNNNN.mp4` in ComfyUI's output folder: its path there,
    relative (for the Stop message)."""
    from . import comfy_services as services

    kept = keep_partial(path, services.output_directory(), prefix)
    return os.path.relpath(kept, services.output_directory())


def partial_prefix_for(path: str) -> tuple[str, str]:
    """(directory, prefix) naming the partial file beside `path`: `clip.mp4` -> `clip_partial_00001.mp4`."""
    folder, name = os.path.split(os.path.abspath(path))
    return folder, os.path.splitext(name)[0] + "_partial"


def window_status(steps: int):
    """(done, total) steps of the whole run -> "window k/K, step s/S" (the worker counts steps across windows)."""
    steps = max(1, int(steps))

    def status(done: int, total: int) -> str:
        windows = max(1, -(-int(total) // steps))
        window = min(windows, max(1, -(-int(done) // steps)))
        return f"window {window}/{windows}, step {done - (window - 1) * steps}/{steps}"

    return status
