"""The pack's jobs as agent tools: each a JSON Schema of typed, documented arguments (schema.py: made from the node
inputs they set) and the API-format graph of the pack's nodes it runs -- the graph a creator would wire, so a tool
call is checked and run exactly as that workflow is (runners.py). `model`, `loader` and `loras` are every H3 tool's
engine; file arguments name files in ComfyUI's input folder (the upload_file tool puts them there)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping

from ..backend.media.mask_raster import empty_state
from .schema import ArgumentError, input_spec, widget_property

H3_LOADER_OPTIONS = ("device", "dtype", "attention", "sp_degree", "gpus", "adaln_cache", "weights", "resident_blocks",
                     "vsa_topk", "vsa_dense_steps", "student", "attention_precision")
SEEDVR2_LOADER_OPTIONS = ("vae", "variant", "device", "dtype", "attention", "sp_degree", "gpus", "weights",
                          "resident_blocks")
SAMPLE_OPTIONS = ("seconds", "width", "height", "steps", "seed", "video_shift", "audio_shift", "schedule", "step_cache")
LOAD_OPTIONS = ("skip_first_frames", "frame_load_cap", "max_seconds")  # H3 Load Video's: a part of the clip
EDIT_OPTIONS = ("preset", "steps", "seed", "audio_mode", "mask_grow", "mask_feather", "denoise", "step_cache")
EXTEND_OPTIONS = ("seconds", "window_frames", "overlap_frames", "audio_mode", "steps", "seed", "step_cache")
UPSCALE_OPTIONS = ("target", "scale", "short_side", "width", "height", "color_fix", "seed", "batch_frames")
BOX_SPACE = 1000  # a box's fractions in the mask state's coordinate space (scaled to the video by H3 Mask Draw)


class Graph:
    """An API-format prompt under construction: every node gets its required widgets' defaults (as ComfyUI's
    frontend fills a new node), then the values given."""

    def __init__(self, info: Mapping):
        self.info, self.nodes = info, {}

    def add(self, class_type: str, **inputs) -> str:
        values = {}
        for name, spec in ((self.info.get(class_type) or {}).get("input", {}).get("required") or {}).items():
            kind, opts = input_spec(self.info, class_type, name)
            if isinstance(kind, list):
                if "default" in opts or kind:
                    values[name] = opts.get("default", kind[0])
            elif "default" in opts:
                values[name] = opts["default"]
        values.update({k: v for k, v in inputs.items() if v is not None})
        node_id = str(len(self.nodes) + 1)
        self.nodes[node_id] = {"class_type": class_type, "inputs": values}
        return node_id


@dataclass(frozen=True)
class Job:
    name: str
    title: str
    description: str
    properties: Callable[[Mapping], dict]  # node inputs -> {argument: JSON Schema}
    required: tuple[str, ...]
    build: Callable[[Mapping, Mapping], dict]  # (checked arguments, node inputs) -> API prompt

    def schema(self, info: Mapping) -> dict:
        return {"type": "object", "properties": self.properties(info), "required": list(self.required),
                "additionalProperties": False}


def _widgets(info, class_type, names, rename=None) -> dict:
    return {(rename or {}).get(n, n): widget_property(info, class_type, n) for n in names
            if _has(info, class_type, n)}


def _has(info, class_type, name) -> bool:
    try:
        input_spec(info, class_type, name)
        return True
    except KeyError:
        return False


def _file(what: str) -> dict:
    return {"type": "string", "minLength": 1, "description": f"{what}: a file name in ComfyUI's input folder "
                                                            "(upload_file puts one there), or a file a tool saved, "
                                                            "as its `ref` ('subfolder/name.mp4 [output]')."}


def _options_object(info, class_type, names, what) -> dict:
    return {"type": "object", "properties": _widgets(info, class_type, names), "additionalProperties": False,
            "description": f"{what} options (the loader node's widgets); left out: its defaults."}


def _engine_properties(info) -> dict:
    lora = {"type": "object", "properties": {
        "name": {**widget_property(info, "H3_LoRA", "lora_name"),
                 "description": "A LoRA file from models/loras (H3 LoRA's list)."},
        "strength": widget_property(info, "H3_LoRA", "strength")}, "required": ["name"], "additionalProperties": False}
    return {"model": {**widget_property(info, "H3_ModelLoader", "model"),
                      "description": "The MiniMax-H3 model (H3 Model Loader's list)."},
            "loader": _options_object(info, "H3_ModelLoader", H3_LOADER_OPTIONS, "H3 Model Loader"),
            "loras": {"type": "array", "items": lora, "maxItems": 8,
                      "description": "LoRAs merged into the DiT, in order (H3 LoRA nodes in a chain)."}}


def _output_property(job: str) -> dict:
    return {"filename_prefix": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[^\\:]+$",
                                "default": f"H3/agent/{job}",
                                "description": "Where the video is saved, inside ComfyUI's output folder."}}


def _engine(g: Graph, args) -> str:
    engine = g.add("H3_ModelLoader", model=args.get("model"), **(args.get("loader") or {}))
    for lora in args.get("loras") or ():
        engine = g.add("H3_LoRA", engine=[engine, 0], lora_name=lora["name"], strength=lora.get("strength", 1.0))
    return engine


def _pick(args, names) -> dict:
    return {n: args[n] for n in names if n in args}


def _save(g: Graph, args, video_node: str) -> None:
    g.add("H3_SaveVideo", video=[video_node, 0], filename_prefix=args["filename_prefix"])


# -- generate ----------------------------------------------------------------------------------------------------------

def _generate_properties(info) -> dict:
    return {**_engine_properties(info), "prompt": widget_property(info, "H3_Sample", "prompt", (
        "What the video shows and sounds like (one paragraph; sounds after the picture).")),
            **_widgets(info, "H3_Sample", SAMPLE_OPTIONS),
            "first_frame": _file("The image the video starts on (first/last frame to video)"),
            "last_frame": _file("The image the video ends on"),
            "reference_image": _file("A reference image (reference to video; not with first/last frame)"),
            "refine_short_side": {"type": "integer", "minimum": 0, "maximum": 4096, "multipleOf": 32, "default": 0,
                                  "description": "Above 0: the clip refined by H3 itself (H3 Refine, latent upscale "
                                                 "and a second pass) to this short side, e.g. 1088 for 1080p."},
            **_output_property("generate")}


def _build_generate(args, info) -> dict:
    if args.get("reference_image") and (args.get("first_frame") or args.get("last_frame")):
        raise ArgumentError("reference_image cannot be combined with first_frame / last_frame.")
    g = Graph(info)
    engine = _engine(g, args)
    images = {key: [g.add("H3_LoadImage", image=args[name]), 0] for key, name in
              (("first_frame", "first_frame"), ("last_frame", "last_frame"), ("reference_images", "reference_image"))
              if args.get(name)}
    sample = g.add("H3_Sample", engine=[engine, 0], prompt=args["prompt"], **_pick(args, SAMPLE_OPTIONS), **images)
    video = sample
    if args.get("refine_short_side"):
        video = g.add("H3_Refine", engine=[engine, 0], prompt=args["prompt"], latents=[sample, 2],
                      target="short_side", short_side=args["refine_short_side"], seed=args.get("seed"))
    _save(g, args, video)
    return g.nodes


# -- edit --------------------------------------------------------------------------------------------------------------

def _box(description) -> dict:
    side = {"type": "number", "minimum": 0.0, "maximum": 1.0}
    return {"type": "object", "properties": {k: side for k in ("x", "y", "w", "h")}, "required": ["x", "y", "w", "h"],
            "additionalProperties": False, "description": description}


def _edit_properties(info) -> dict:
    return {**_engine_properties(info), "video": _file("The video to edit"),
            "prompt": widget_property(info, "H3_Edit", "prompt", (
                "What the masked region shows after the edit (removal: the background there; replacement: the "
                "new object; inpaint: what fills it), and the sound.")),
            **_widgets(info, "H3_Edit", EDIT_OPTIONS),
            "mask_text": {"type": "string", "minLength": 1, "description": (
                "The object to mask, named (H3 Track Mask with SAM3 follows it on every frame).")},
            "track_model": {k: v for k, v in widget_property(info, "H3_TrackMask", "model").items() if k != "default"}
            | {"description": "The tracker H3 Track Mask uses with mask_text (a SAM3 model; default: the first one "
                              "listed)."},
            "box": _box("Instead of mask_text: the region to mask on the first frame, as fractions of the frame "
                        "(x, y: top-left; w, h: size; 0..1)."),
            "box_end": _box("With box: the region on the last frame; the box moves between them linearly."),
            **_widgets(info, "H3_LoadVideo", LOAD_OPTIONS), **_output_property("edit")}


def _box_state(box, box_end, frames_hint: int = 100000) -> str:
    state = empty_state(BOX_SPACE, BOX_SPACE)
    keyframes = [(0, box)] + ([(frames_hint, box_end)] if box_end else [])
    state["keyframes"] = [{"frame": frame, "shapes": [{"id": "box", "type": "rect", **{
        k: round(b[k] * BOX_SPACE, 3) for k in ("x", "y", "w", "h")}}]} for frame, b in keyframes]
    return json.dumps(state)


def _build_edit(args, info) -> dict:
    if bool(args.get("mask_text")) == bool(args.get("box")):
        raise ArgumentError("Give the mask one way: mask_text (a named object) or box (a region).")
    if args.get("box_end") and not args.get("box"):
        raise ArgumentError("box_end needs box.")
    g = Graph(info)
    engine = _engine(g, args)
    video = g.add("H3_LoadVideo", video=args["video"], **_pick(args, LOAD_OPTIONS))
    if args.get("mask_text"):
        trackers, _ = input_spec(info, "H3_TrackMask", "model")
        tracker = args.get("track_model") or next((m for m in trackers if "sam3" in m.lower()), None)
        if tracker is None:
            raise ArgumentError("mask_text needs a SAM3 model for H3 Track Mask and none is installed (models/sam3); "
                                "give a box instead.")
        mask = g.add("H3_TrackMask", video=[video, 0], text=args["mask_text"], model=tracker)
    else:
        mask = g.add("H3_MaskDraw", video=[video, 0], mask_state=_box_state(args["box"], args.get("box_end")))
    edit = g.add("H3_Edit", engine=[engine, 0], video=[video, 0], mask=[mask, 0], prompt=args["prompt"],
                 **_pick(args, EDIT_OPTIONS))
    _save(g, args, edit)
    return g.nodes


# -- extend ------------------------------------------------------------------------------------------------------------

def _extend_properties(info) -> dict:
    return {**_engine_properties(info), "video": _file("The video to continue"),
            "prompt": widget_property(info, "H3_Extend", "prompt"), **_widgets(info, "H3_Extend", EXTEND_OPTIONS),
            **_widgets(info, "H3_LoadVideo", LOAD_OPTIONS), **_output_property("extend")}


def _build_extend(args, info) -> dict:
    g = Graph(info)
    engine = _engine(g, args)
    video = g.add("H3_LoadVideo", video=args["video"], **_pick(args, LOAD_OPTIONS))
    extend = g.add("H3_Extend", engine=[engine, 0], video=[video, 0], prompt=args["prompt"],
                   **_pick(args, EXTEND_OPTIONS))
    _save(g, args, extend)
    return g.nodes


# -- upscale -----------------------------------------------------------------------------------------------------------

def _upscale_properties(info) -> dict:
    return {"model": {**widget_property(info, "H3_SeedVR2Loader", "model"),
                      "description": "The SeedVR2 model (SeedVR2 Model Loader's list)."},
            "loader": _options_object(info, "H3_SeedVR2Loader", SEEDVR2_LOADER_OPTIONS, "SeedVR2 Model Loader"),
            "video": _file("The video to upscale"), **_widgets(info, "H3_SeedVR2Upscale", UPSCALE_OPTIONS),
            **_widgets(info, "H3_LoadVideo", LOAD_OPTIONS), **_output_property("upscale")}


def _build_upscale(args, info) -> dict:
    g = Graph(info)
    engine = g.add("H3_SeedVR2Loader", model=args.get("model"), **(args.get("loader") or {}))
    video = g.add("H3_LoadVideo", video=args["video"], force_rate=0.0, **_pick(args, LOAD_OPTIONS))  # own rate
    up = g.add("H3_SeedVR2Upscale", engine=[engine, 0], video=[video, 0], **_pick(args, UPSCALE_OPTIONS))
    _save(g, args, up)
    return g.nodes


# -- storyboard -------------------------------------------------------------------------------------------------------

def _storyboard_properties(info) -> dict:
    shot = {"type": "object", "additionalProperties": False, "required": ["prompt"], "properties": {
        "prompt": {"type": "string", "minLength": 1, "description": "What the shot shows and sounds like."},
        "seconds": {"type": "number", "minimum": 0.5, "maximum": 600, "default": 5.0, "description": (
            "A cut: 5 to 15 s (17n + 5 frames); a continue: the seconds it adds (whole 17-frame chunks).")},
        "transition": {"type": "string", "enum": ["cut", "continue"], "default": "cut", "description": (
            "cut: a new generation (with the reference image); continue: the scene so far extended, one timeline "
            "(not the first shot).")},
        "seed": {"type": "integer", "minimum": 0, "description": "Default: the film's seed + the shot's index."}}}
    return {**_engine_properties(info), "shots": {"type": "array", "items": shot, "minItems": 1, "maxItems": 64},
            **_widgets(info, "H3_Storyboard", ("width", "height", "steps", "seed")),
            "reference_image": _file("A reference image every cut shot is made with (the same characters)"),
            **_output_property("storyboard")}


def _build_storyboard(args, info) -> dict:
    g = Graph(info)
    engine = _engine(g, args)
    refs = {"reference_images": [g.add("H3_LoadImage", image=args["reference_image"]), 0]} \
        if args.get("reference_image") else {}
    film = g.add("H3_Storyboard", engine=[engine, 0], shots=json.dumps({"shots": args["shots"]}),
                 **_pick(args, ("width", "height", "steps", "seed")), **refs)
    _save(g, args, film)
    return g.nodes


def storyboard_plan(args) -> dict:
    """The film's shots as the storyboard plans them (index, transition, frames, start_frame, seed): what an agent
    needs to address one shot of the saved film (its frames from start_frame)."""
    from ..backend.pipelines.h3.storyboard import parse_storyboard

    board = parse_storyboard({"shots": args["shots"], "seed": args.get("seed", 0)})
    shots, start = [], 0
    for shot in board.shots:
        shots.append({"index": shot.index, "transition": shot.transition, "frames": shot.frames,
                      "start_frame": start, "seed": shot.seed})
        start += shot.frames
    return {"shots": shots, "frames": start, "seconds": start / 24.0}


JOBS = (
    Job("generate", "Generate a video", "A video with its sound from a prompt (MiniMax-H3): text to video, first / last "
        "frame to video (first_frame / last_frame), reference to video (reference_image); optionally refined to "
        "1080p by H3 itself. Returns the saved MP4 and its stage manifest.",
        _generate_properties, ("prompt",), _build_generate),
    Job("edit", "Edit a video", "Remove, replace or inpaint an object in a video (H3 Edit), the mask from a named "
        "object (mask_text) or a box; the rest of the video and its sound are kept.",
        _edit_properties, ("video", "prompt"), _build_edit),
    Job("extend", "Extend a video", "Continue a video past its end (H3 Extend: windows that each see the last frames "
        "and the sound so far), one prompt per window separated by lines of ---.",
        _extend_properties, ("video", "prompt"), _build_extend),
    Job("upscale", "Upscale a video", "Restore and upscale a video with SeedVR2 (its sound kept).",
        _upscale_properties, ("video",), _build_upscale),
    Job("storyboard", "Make a film from shots", "A multi-shot film with one soundtrack from a shot list (H3 "
        "Storyboard): each shot a prompt, seconds and a transition -- cut (a new generation, with the reference "
        "image for the same characters) or continue (the scene extended). Returns the film and `film`: each shot's "
        "start_frame and frames (to edit one shot: skip_first_frames / frame_load_cap).",
        _storyboard_properties, ("shots",), _build_storyboard),
)
BY_NAME = {job.name: job for job in JOBS}

