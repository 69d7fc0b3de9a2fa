"""The headless runner's folder for the nodes' temporaries (the CLI's `run` and `demo`, the agent server)."""

from __future__ import annotations

import contextlib
import os

TEMP_ENV = "COMFYUI_H3_TEMP"  # the headless temp folder (comfy_services/paths.py)


@contextlib.contextmanager
def temp_folder(output_dir: str):
    """The nodes' temporaries (Mask Preview's MP4s, H3 Extend's streamed result) for one run: a hidden folder in
    the output folder, removed when the workflow ends however it ends, unless COMFYUI_H3_TEMP names one to keep (the
    demo keeps its previews). Nothing is left in the working directory."""
    if os.environ.get(TEMP_ENV):
        yield os.environ[TEMP_ENV]
        return
    import shutil
    import tempfile

    os.makedirs(output_dir, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=".h3-temp-", dir=output_dir)
    os.environ[TEMP_ENV] = folder
    try:
        yield folder
    finally:
        os.environ.pop(TEMP_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)
