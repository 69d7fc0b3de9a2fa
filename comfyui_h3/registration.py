"""Node registration: the one place that lists the pack's nodes. IDs carry the `H3_` pack prefix (no core node uses
it: core ships MiniMaxH3*, SeedVR2* and Minimax* API nodes) and never change once shipped."""

from __future__ import annotations

from .nodes.load_image import H3LoadImage
from .nodes.load_video import H3LoadVideo, H3VideoComponents
from .nodes.loader import H3ModelLoader
from .nodes.sample import H3Sample
from .nodes.save_video import H3SaveVideo

NODE_CLASS_MAPPINGS = {
    "H3_ModelLoader": H3ModelLoader,
    "H3_Sample": H3Sample,
    "H3_SaveVideo": H3SaveVideo,
    "H3_LoadImage": H3LoadImage,
    "H3_LoadVideo": H3LoadVideo,
    "H3_VideoComponents": H3VideoComponents,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "H3_ModelLoader": "H3 Model Loader",
    "H3_Sample": "H3 Sample (MiniMax-H3)",
    "H3_SaveVideo": "H3 Save Video",
    "H3_LoadImage": "H3 Load Image",
    "H3_LoadVideo": "H3 Load Video",
    "H3_VideoComponents": "H3 Video To Images",
}
WEB_DIRECTORY = "./js"
