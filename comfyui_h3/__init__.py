"""comfyui-h3: MiniMax-H3 video+audio generation inside ComfyUI.

Package map (see docs/ARCHITECTURE.md): `comfyui_h3` glue (registration, ComfyUI adapters, value types, CLI),
`comfyui_h3.nodes` (thin V1 nodes), `comfyui_h3.backend` (engine, workers, pipelines, models, media).
"""

import os

__version__ = "0.1.0"

# When the repo is used from a checkout on sys.path (tests, `python -m comfyui_h3` from the repo root) nodes/ and
# backend/ sit beside this folder: let the package search the repo root too, as an install's package-dir map does.
_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_HERE)
if (
    not os.path.isdir(os.path.join(_HERE, "backend"))
    and os.path.isfile(os.path.join(_REPO_ROOT, "backend", "pipelines", "h3", "__init__.py"))
    and _REPO_ROOT not in __path__  # noqa: F821
):
    __path__.append(_REPO_ROOT)  # noqa: F821
