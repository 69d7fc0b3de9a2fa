"""H3 Track Mask: clicks / boxes placed on the video's frames (the `prompts` widget, written by the mask editor)
and / or a text prompt -> a mask on every frame, tracked by SAM2 or SAM3 (backend/tracking/), then combined with an
optional MASK and grown / feathered / inverted exactly as H3 Mask Draw does (backend/media/mask_raster.py)."""

from __future__ import annotations

from .. import comfy_services as services
from ..backend.errors import RequestError
from ..backend.media.mask_raster import COMBINE_MODES, combine_masks, fit_mask, grow_feather_invert
from ..backend.media.track_prompts import parse_prompts
from ..backend.finite import check_finite
from ..backend.tracking.sam_models import clear_track_models, load_track_model, pick_device
from ..backend.tracking.sam_tracker import track_masks
from ..tiny_model import TINY_SAM2_NAME, TINY_SAM3_NAME, ensure_tiny_sam2, ensure_tiny_sam3
from ..types import mark_mask_shaping
from ..video_types import as_h3_video
from .mask_draw import H3MaskDraw

# "replace" paints a drawing (which can erase) over the connected mask; a tracked mask only adds, so there it would be
# "union" under another name.
TRACK_COMBINE_MODES = tuple(mode for mode in COMBINE_MODES if mode != "replace")
TINY_MODELS = {TINY_SAM2_NAME: ensure_tiny_sam2, TINY_SAM3_NAME: ensure_tiny_sam3}


def resolve_model_choice(model: str) -> str:
    """The folder of the node's `model` choice: a built-in tiny model (built on first use) or a listed folder."""
    if model in TINY_MODELS:
        return str(TINY_MODELS[model]())
    return services.resolve_track_model(model)


class H3TrackMask:
    CATEGORY = "H3"
    FUNCTION = "track"
    RETURN_TYPES = ("MASK",)
    RETURN_NAMES = ("mask",)
    OUTPUT_TOOLTIPS = ("The mask [frames, height, width], 0..1, at the video's size and frame count: every tracked "
                       "object, combined, grown, feathered and inverted as set.",)
    DESCRIPTION = ("Mask objects on every frame: click them (or draw a box) on any frame in the mask editor, and / or "
                   "name them in text (SAM3), and SAM2 / SAM3 tracks them forward and backward through the clip. "
                   "Then combine with a drawn mask, grow, feather, invert.")

    @classmethod
    def INPUT_TYPES(cls):
        services.register_track_model_folders()
        shaping = H3MaskDraw.INPUT_TYPES()["required"]  # grow / feather / invert: Mask Draw's very widgets
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The video to track objects in (an H3 Load Video upstream shows its "
                                               "frames in the mask editor, where the clicks are placed)."}),
                "model": ([TINY_SAM2_NAME, TINY_SAM3_NAME] + services.track_model_dirs(), {
                    "tooltip": "A SAM2 / SAM2.1 folder in models/sam2 (clicks and boxes) or a SAM3 folder in "
                               "models/sam3 (clicks, boxes and text), transformers layout (e.g. "
                               "facebook/sam2.1-hiera-large, facebook/sam3). The built-in tiny models are random "
                               "weights: they run anywhere and segment nothing meaningful. Runs on a GPU ComfyUI "
                               "does not use when there is one; loaded once and kept."}),
                "prompts": ("STRING", {
                    "default": "", "multiline": False,
                    "tooltip": "Clicks (positive / negative) and boxes per object and frame, as JSON written by the "
                               "mask editor. Edit them in the editor, not by hand."}),
                "text": ("STRING", {
                    "default": "", "multiline": False,
                    "tooltip": "SAM3 only: what to mask, in words (e.g. 'the red car'); several phrases separated "
                               "by ';'. Every instance found is masked. Leave empty for SAM2."}),
                "grow": shaping["grow"],
                "feather": shaping["feather"],
                "invert": shaping["invert"],
            },
            "optional": {
                "mask": ("MASK", {"tooltip": "A mask from another node (e.g. H3 Mask Draw strokes) to combine with "
                                             "the tracked one (resized to the video; its last frame holds when it "
                                             "is shorter)."}),
                "combine": (list(TRACK_COMBINE_MODES), {
                    "default": "union",
                    "tooltip": "How the tracked mask meets the connected mask: union: either; intersect: both; "
                               "subtract: the tracked mask minus the connected one. Grow / feather / invert apply "
                               "after."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, prompts=None):
        # Names only `prompts` (ComfyUI then skips its own checks for it alone): model / grow / combine stay checked
        # by ComfyUI against their widgets. Prompts that need the video (frames, sizes) are checked when it runs.
        if isinstance(prompts, str):
            try:
                parse_prompts(prompts)
            except RequestError as exc:
                return f"H3 Track Mask: {exc}"
        return True

    def track(self, video, model, prompts="", text="", grow=0, feather=0, invert=False, mask=None, combine="union"):
        if combine not in TRACK_COMBINE_MODES:
            raise ValueError(f"H3 Track Mask: combine must be one of {', '.join(TRACK_COMBINE_MODES)}, got {combine!r}.")
        try:
            check_finite(mask, "mask")  # a NaN would spread to every output pixel, an infinity be clamped silently
        except RequestError as exc:
            raise ValueError(f"H3 Track Mask: {exc}") from None
        clip = as_h3_video(video)
        frames = clip.frames
        frame_count, height, width = (int(v) for v in frames.shape[:3])
        stop = services.raise_if_interrupted
        services.register_free_memory_hook(clear_track_models)  # ComfyUI's Unload Models drops the kept models
        reporter = services.ProgressReporter(frame_count, desc="H3 Track Mask")
        try:
            loaded = load_track_model(resolve_model_choice(model), pick_device(services.comfy_compute_device()))
            masks = track_masks(loaded, frames, prompts, text, check=stop,
                                progress=lambda done, total: reporter.update_absolute(done, total))
        except RequestError as exc:
            raise ValueError(f"H3 Track Mask: {exc}") from None
        if mask is not None:
            masks = combine_masks(masks, fit_mask(mask, frame_count, height, width), combine)
        device = services.comfy_compute_device() or "auto"
        shaped = grow_feather_invert(masks, grow, feather, invert, check=stop, device=device)
        return (mark_mask_shaping(shaped, grow, feather),)  # H3 Edit then adds no preset grow / feather
