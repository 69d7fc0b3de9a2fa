"""Node registration: the one place that lists the pack's nodes. IDs carry the `H3_` pack prefix (no core node uses
it: core ships MiniMaxH3*, SeedVR2* and Minimax* API nodes) and never change once shipped."""

from __future__ import annotations

from .nodes.edit import H3Edit
from .nodes.extend import H3Extend
from .nodes.load_image import H3LoadImage
from .nodes.load_video import H3LoadVideo, H3VideoComponents
from .nodes.loader import H3ModelLoader
from .nodes.lora import H3LoRA
from .nodes.mask_draw import H3MaskDraw
from .nodes.mask_preview import H3MaskPreview
from .nodes.preview_video import H3PreviewVideo
from .nodes.refine import H3Refine
from .nodes.sample import H3Sample
from .nodes.save_video import H3SaveVideo
from .nodes.seedvr2_loader import H3SeedVR2Loader
from .nodes.seedvr2_upscale import H3SeedVR2Upscale
from .nodes.storyboard import H3Storyboard
from .nodes.track_mask import H3TrackMask
from . import comfy_services as services
from .install_samples import install_sample_inputs
from .routes import register_routes, register_template_order

NODE_CLASS_MAPPINGS = {
    "H3_ModelLoader": H3ModelLoader,
    "H3_Sample": H3Sample,
    "H3_SaveVideo": H3SaveVideo,
    "H3_PreviewVideo": H3PreviewVideo,
    "H3_LoadImage": H3LoadImage,
    "H3_LoadVideo": H3LoadVideo,
    "H3_VideoComponents": H3VideoComponents,
    "H3_Edit": H3Edit,
    "H3_MaskDraw": H3MaskDraw,
    "H3_MaskPreview": H3MaskPreview,
    "H3_Extend": H3Extend,
    "H3_Storyboard": H3Storyboard,
    "H3_SeedVR2Loader": H3SeedVR2Loader,
    "H3_SeedVR2Upscale": H3SeedVR2Upscale,
    "H3_TrackMask": H3TrackMask,
    "H3_LoRA": H3LoRA,
    "H3_Refine": H3Refine,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "H3_ModelLoader": "H3 Model Loader",
    "H3_Sample": "H3 Sample (MiniMax-H3)",
    "H3_SaveVideo": "H3 Save Video",
    "H3_PreviewVideo": "H3 Preview Video",
    "H3_LoadImage": "H3 Load Image",
    "H3_LoadVideo": "H3 Load Video",
    "H3_VideoComponents": "H3 Video To Images",
    "H3_Edit": "H3 Edit (remove / replace / inpaint)",
    "H3_MaskDraw": "H3 Mask Draw",
    "H3_MaskPreview": "H3 Mask Preview",
    "H3_Extend": "H3 Extend (continue past 15 s)",
    "H3_Storyboard": "H3 Storyboard (a film from shots)",
    "H3_SeedVR2Loader": "SeedVR2 Model Loader",
    "H3_SeedVR2Upscale": "SeedVR2 Upscale",
    "H3_TrackMask": "H3 Track Mask",
    "H3_LoRA": "H3 LoRA",
    "H3_Refine": "H3 Refine (latent upscale to 1080p)",
}
WEB_DIRECTORY = "./js"


def v3_entrypoint():
    """ComfyUI's V3 entry point for these nodes (`comfy_entrypoint`: a ComfyExtension of io.Schema nodes built from
    the classes above, node_schema_v3.py), or None where this ComfyUI has no V3 API or COMFYUI_H3_NODE_API=v1 asks for
    the V1 classes."""
    from .node_schema_v3 import comfy_extension, v3_io

    found = v3_io()
    if found is None:
        return None
    io, extension_base = found

    def comfy_entrypoint():
        return comfy_extension(io, extension_base, NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS)

    return comfy_entrypoint


# The mask editor's frame routes, on ComfyUI's server when one is running in this process (nothing elsewhere).
register_routes()
# The template browser's cards of this pack in a newcomer's order (comfyui_h3/templates.py).
register_template_order()
# The shipped workflows' sample inputs into ComfyUI's input folder (a file a user has there is never replaced).
if services.comfy_available():
    install_sample_inputs(services.input_directory())


def prewarm_workers() -> None:
    """Start the workers' forkserver while ComfyUI starts, so the first H3 prompt does not wait ~7 s for torch,
    diffusers and transformers to import in a new process (backend/executor/mp_executor.py). It holds no model and
    no device memory. COMFYUI_H3_PREWARM=0 turns it off; any failure only costs that time back."""
    import logging
    import os

    if os.environ.get("COMFYUI_H3_PREWARM", "1") == "0":
        return
    try:
        from .backend.executor.mp_executor import prewarm

        prewarm()
    except Exception as exc:  # noqa: BLE001 - never let a speed-up stop ComfyUI from loading the pack
        logging.getLogger("comfyui_h3").warning("comfyui-h3: worker prewarm skipped (%s: %s)", type(exc).__name__, exc)


if services.comfy_available():
    prewarm_workers()
    # SIGTERM to ComfyUI ends the workers and their forkserver first, and leaks no semaphore (host_shutdown.py).
    from .host_shutdown import install_sigterm_hook

    install_sigterm_hook()
