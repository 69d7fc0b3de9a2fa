"""H3 Storyboard: a shot list (multiline JSON / YAML) made into one film on the engine -- cuts are new generations
(with the connected reference images: the same characters), continues extend the scene so far; the film streamed into
a file in ComfyUI's temp folder and returned as a VIDEO read from it. On Stop the finished shots are kept in the
output folder as H3/storyboard_partial_NNNNN.mp4. Thin: backend/pipelines/h3/storyboard.py plans,
comfyui_h3/storyboard_job.py makes the film."""

from __future__ import annotations

import os

from .. import comfy_services as services
from ..backend.media.encode import next_free_path, release_placeholder
from ..backend.pipelines.h3.geometry import RequestError
from ..backend.pipelines.h3.storyboard import parse_storyboard, read_shot_list
from ..extend_job import keep_in_output
from ..storyboard_job import make_film
from ..video_file import H3FileVideo
from .adapters import build_references
from .sample import run_engine

PARTIAL_PREFIX = "H3/storyboard_partial"
EXAMPLE = ('{"shots": [\n'
           ' {"prompt": "A fox at the edge of a snowy wood at dawn; crunching snow.", "seconds": 5},\n'
           ' {"prompt": "The fox trots into the clearing; wind in the pines.", "seconds": 5, "transition": '
           '"continue"},\n'
           ' {"prompt": "An owl on a branch at night; a soft hoot.", "seconds": 5, "transition": "cut"}\n]}')


class H3Storyboard:
    CATEGORY = "H3"
    FUNCTION = "film"
    RETURN_TYPES = ("VIDEO",)
    RETURN_NAMES = ("film",)
    OUTPUT_TOOLTIPS = ("The film, every shot end to end with one soundtrack (read from the file it was streamed "
                       "into).",)
    DESCRIPTION = ("A multi-shot film from a shot list: each shot a prompt, seconds and a transition -- cut (a new "
                   "generation, with the reference images for the same characters) or continue (the scene so far "
                   "extended, one timeline). Fades the sound at cuts; Stop keeps the finished shots.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": ("H3_ENGINE", {"tooltip": "From H3 Model Loader (continue shots use transformer_ref/ "
                                                    "when present)."}),
                "shots": ("STRING", {"multiline": True, "default": EXAMPLE, "tooltip": (
                    "The shot list, JSON or YAML: {\"shots\": [{\"prompt\", \"seconds\", \"transition\": cut | "
                    "continue, \"seed\"}]}. A cut is 5-15 s; a continue adds its seconds in 17-frame chunks; the "
                    "first shot is a cut. A shot's seed: its own, else the node's seed + its index.")}),
                "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32,
                                  "tooltip": "Every shot's width (0: automatic, with height 0)."}),
                "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32,
                                   "tooltip": "Every shot's height (0: automatic, with width 0)."}),
                "steps": ("INT", {"default": 50, "min": 1, "max": 1000,
                                  "tooltip": "Denoising steps of every shot (each window of a continue)."}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**64 - 1,
                                 "tooltip": "The film's seed: shot k's is seed + k unless the shot names its own."}),
            },
            "optional": {
                "reference_images": ("IMAGE", {"tooltip": "Up to 9 reference images (a batch) every cut shot is "
                                                          "made with: the same characters, places, objects."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, shots=None):
        if isinstance(shots, str):
            try:
                parse_storyboard(shots)
            except RequestError as exc:
                return str(exc)
        return True

    def film(self, engine, shots, width, height, steps, seed, reference_images=None, unique_id=None):
        try:
            board = parse_storyboard({**_shot_list(shots), "seed": seed, "steps": steps, "width": width or None,
                                      "height": height or None})
        except RequestError as exc:
            raise ValueError(f"H3 Storyboard: {exc}") from None
        references = build_references(reference_images, None, None)
        path = next_free_path(services.temp_directory(), "h3_storyboard/film", "mp4")
        count = {"shot": 0}

        def run(request):
            count["shot"] += 1
            label = f"shot {count['shot']}/{len(board.shots)}"
            try:
                return run_engine(engine, request, request.steps, unique_id, desc=f"H3 {label}",
                                  status=lambda done, total: f"{label}, step {done}/{total}")
            except services.interrupt_exception_types():
                return None  # Stop: make_film keeps the finished shots

        try:
            report = make_film(board, run, path, references)
        finally:
            release_placeholder(path)  # reserved but never published (an error, or Stop before any shot)
        if report["stopped"]:
            raise services.interrupt_exception_types()[-1](_kept(report)) from None
        text = (f"{len(report['shots'])} shots, {report['frames']} frames ({report['seconds']:.2f} s): "
                + ", ".join(f"{s['transition']} {s['frames']}" for s in report["shots"]))
        return {"ui": {"text": [text]}, "result": (H3FileVideo(report["path"]),)}


def _shot_list(text: str) -> dict:
    data = read_shot_list(text) if isinstance(text, str) else text
    data = {"shots": data} if isinstance(data, list) else data
    if not isinstance(data, dict):
        raise RequestError("The shot list is {\"shots\": [...]}.")
    return {k: v for k, v in data.items() if k == "shots"}  # the node's widgets give the film's other settings


def _kept(report: dict) -> str:
    path = report.get("path")
    if not report["shots"] or not path or not os.path.isfile(path):
        return "Stopped by the user before the first shot finished; nothing was kept."
    kept = keep_in_output(path, PARTIAL_PREFIX)
    message = (f"Stopped by the user after {len(report['shots'])} of {report['planned_shots']} shots; the finished "
               f"shots ({report['seconds']:.2f} s) are saved as {kept}.")
    services.log.warning(message)
    return message
