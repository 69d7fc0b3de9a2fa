"""H3 Mask Draw: a mask drawn on the video's frames in the node (js/mask_draw.js), rasterised here for every frame.

The drawing lives in the `mask_state` STRING widget (schema and rules: backend/media/mask_raster.py); the node's
grow / feather / invert widgets are the ones used here (the state keeps copies for the live preview)."""

from __future__ import annotations

from .. import comfy_services as services
from ..backend.errors import RequestError
from ..backend.media.mask_raster import (COMBINE_MODES, combine_masks, fit_mask, grow_feather_invert, paint_over,
                                         parse_state, rasterize_state)
from ..backend.finite import check_finite
from ..types import mark_mask_shaping
from ..video_types import as_h3_video


class H3MaskDraw:
    CATEGORY = "H3"
    FUNCTION = "draw"
    RETURN_TYPES = ("MASK",)
    RETURN_NAMES = ("mask",)
    OUTPUT_TOOLTIPS = ("The mask [frames, height, width], 0..1, at the video's size and frame count.",)
    DESCRIPTION = ("Draw a mask over the video in the node: brush, eraser, rectangles and ellipses on keyframes "
                   "(rectangles / ellipses move smoothly between keyframes, strokes hold until the next one), then "
                   "grow, feather, invert, and optionally combine with a mask from another node.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The video to mask (its size and frame count shape the mask; an "
                                               "H3 Load Video upstream shows its frames in the editor)."}),
                "mask_state": ("STRING", {"default": "", "multiline": False,
                                          "tooltip": "The drawing as JSON, written by the editor (keyframes of "
                                                     "shapes). Edit it with the canvas, not by hand."}),
                "grow": ("INT", {"default": 0, "min": -256, "max": 256, "step": 1,
                                 "tooltip": "Grow the mask by this many pixels (a disk dilation); negative "
                                            "shrinks it. For H3 Edit leave 0: its preset grows and feathers the "
                                            "mask (a mask grown or feathered here it takes as it is)."}),
                "feather": ("INT", {"default": 0, "min": 0, "max": 256, "step": 1,
                                    "tooltip": "Soften the edge over about this many pixels (a gaussian-like "
                                               "blur). For H3 Edit leave 0, as grow."}),
                "invert": ("BOOLEAN", {"default": False, "tooltip": "Invert the mask (after grow and feather)."}),
            },
            "optional": {
                "mask": ("MASK", {"tooltip": "A mask from another node to combine with the drawing (resized to the "
                                             "video; its last frame holds when it is shorter)."}),
                "combine": (list(COMBINE_MODES), {
                    "default": "union",
                    "tooltip": "How the drawing meets the connected mask: replace: the mask is the canvas you draw "
                               "on (brush / shapes add, the eraser removes); union: either; intersect: both; "
                               "subtract: the drawing minus the mask. Grow / feather / invert apply after."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, mask_state=None):
        # Names only mask_state: ComfyUI skips its own min/max/list checks for every input named here (for all of
        # them if this took **kwargs), so grow / feather / combine stay checked by ComfyUI against their widgets.
        if isinstance(mask_state, str):
            try:
                parse_state(mask_state)
            except ValueError as exc:
                return f"H3 Mask Draw: {exc}"
        return True

    def draw(self, video, mask_state="", grow=0, feather=0, invert=False, mask=None, combine="union"):
        clip = as_h3_video(video) if not hasattr(video, "get_frame_count") else video
        frame_count = int(clip.get_frame_count())
        width, height = (int(v) for v in clip.get_dimensions())
        state = parse_state(mask_state)
        try:
            check_finite(mask, "mask")  # as H3 Track Mask: refused, not clamped into the drawing
        except RequestError as exc:
            raise ValueError(f"H3 Mask Draw: {exc}") from None
        stop = services.raise_if_interrupted  # Stop reaches every long loop here (between frames / chunks)
        if mask is not None:
            external = fit_mask(mask, frame_count, height, width)
            if combine == "replace":
                masks = paint_over(state, external, check=stop)
            else:
                masks = combine_masks(rasterize_state(state, frame_count, height, width, check=stop), external,
                                      combine)
        else:
            masks = rasterize_state(state, frame_count, height, width, check=stop)
        # grow / feather on ComfyUI's device (a GPU unless it runs with --cpu); headless on a GPU when there is one
        device = services.comfy_compute_device() or "auto"
        shaped = grow_feather_invert(masks, grow, feather, invert, check=stop, device=device)
        return (mark_mask_shaping(shaped, grow, feather),)  # H3 Edit then adds no preset grow / feather
