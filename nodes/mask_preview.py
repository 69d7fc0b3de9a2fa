"""H3 Mask Preview: a mask tinted over the video's frames, as a VIDEO and as an animated preview in the node."""

from __future__ import annotations

import os

import torch

from .. import comfy_services as services
from ..backend.media.mask_raster import fit_mask
from ..backend.media.save import save_new_mp4
from ..video_types import H3Video, as_h3_video

COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 96, 255), "yellow": (255, 230, 0),
          "magenta": (255, 0, 255), "cyan": (0, 230, 255), "white": (255, 255, 255), "black": (0, 0, 0)}
_CHUNK = 16


def overlay_frames(frames: torch.Tensor, masks: torch.Tensor, color: tuple[int, int, int], opacity: float):
    """uint8 [T, H, W, 3] frames with masks [T, H, W] (0..1) tinted `color` at `opacity` -> uint8 (chunked)."""
    out = torch.empty(frames.shape, dtype=torch.uint8)
    tint = torch.tensor(color, dtype=torch.float32)
    for start in range(0, frames.shape[0], _CHUNK):
        chunk = frames[start:start + _CHUNK].detach().to("cpu", torch.float32)
        alpha = (masks[start:start + _CHUNK].to(torch.float32) * float(opacity))[..., None]
        out[start:start + _CHUNK] = (chunk * (1 - alpha) + tint * alpha).round().clamp(0, 255).to(torch.uint8)
    return out


class H3MaskPreview:
    CATEGORY = "H3"
    FUNCTION = "preview"
    OUTPUT_NODE = True
    RETURN_TYPES = ("VIDEO",)
    RETURN_NAMES = ("video",)
    OUTPUT_TOOLTIPS = ("The frames with the mask tinted over them (uint8 VIDEO, the input's audio kept).",)
    DESCRIPTION = "Check a mask: tint it over the video's frames, shown in the node and returned as a VIDEO."

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The video the mask belongs to."}),
                "mask": ("MASK", {"tooltip": "The mask to show (resized to the video; its last frame holds when it "
                                             "is shorter)."}),
                "color": (list(COLORS), {"default": "red", "tooltip": "Tint of the masked area."}),
                "opacity": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.05,
                                      "tooltip": "How strongly the tint covers the masked area (0 = invisible)."}),
            },
        }

    def preview(self, video, mask, color="red", opacity=0.5):
        clip = as_h3_video(video)
        frames = clip.frames
        count, height, width = int(frames.shape[0]), int(frames.shape[1]), int(frames.shape[2])
        masks = fit_mask(mask, count, height, width)
        tinted = overlay_frames(frames, masks, COLORS.get(color, COLORS["red"]), opacity)
        result = H3Video(tinted, clip.frame_rate, clip.audio, clip.sample_rate, clip.metadata)
        temp_dir = services.temp_directory()
        os.makedirs(temp_dir, exist_ok=True)
        even = tinted[:, : height // 2 * 2, : width // 2 * 2]  # yuv420 wants even sizes
        path = save_new_mp4(temp_dir, "h3_mask_preview", even, clip.frame_rate, preset="ultrafast", crf=23)
        subfolder, filename = os.path.split(os.path.relpath(path, temp_dir))
        return {"ui": {"images": [{"filename": filename, "subfolder": subfolder, "type": "temp"}],
                       "animated": (True,)},
                "result": (result,)}
