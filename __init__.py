"""ComfyUI entry point for comfyui-h3.

ComfyUI imports this folder by path as a package named after the folder. The code itself lives in the `comfyui_h3`
package (with `nodes/` and `backend/` mapped under it, exactly as `pip install -e .` maps them), so this file makes
that name importable from here when the pack was cloned into `custom_nodes/` without an install, then re-exports the
node mappings. It never puts this folder on `sys.path`: that would shadow ComfyUI's own top-level `nodes` module.

A ComfyUI with the V3 node API (comfy_api.latest) loads the nodes through `comfy_entrypoint` as io.Schema nodes;
ComfyUI reads NODE_CLASS_MAPPINGS first, so it is None then. An older ComfyUI, or COMFYUI_H3_NODE_API=v1, gets the
V1 classes in NODE_CLASS_MAPPINGS. Both serve the same node IDs, inputs and widget order.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _register_package() -> None:
    if "comfyui_h3" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "comfyui_h3",
        os.path.join(_HERE, "comfyui_h3", "__init__.py"),
        # nodes/ and backend/ sit beside comfyui_h3/ in the repo; searching the repo root too makes them
        # `comfyui_h3.nodes` / `comfyui_h3.backend`, the names an install gives them.
        submodule_search_locations=[os.path.join(_HERE, "comfyui_h3"), _HERE],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_h3"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["comfyui_h3"]
        raise


_register_package()

from comfyui_h3 import registration as _registration  # noqa: E402

NODE_DISPLAY_NAME_MAPPINGS = _registration.NODE_DISPLAY_NAME_MAPPINGS
WEB_DIRECTORY = _registration.WEB_DIRECTORY
_V3_ENTRYPOINT = _registration.v3_entrypoint()
if _V3_ENTRYPOINT is None:
    NODE_CLASS_MAPPINGS = _registration.NODE_CLASS_MAPPINGS
    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
else:
    NODE_CLASS_MAPPINGS = None
    comfy_entrypoint = _V3_ENTRYPOINT
    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY", "comfy_entrypoint"]
