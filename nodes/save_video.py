"""H3 Save Video: VIDEO (+ optional AUDIO) -> H.264 + AAC MP4 in ComfyUI's output folder, never overwriting, shown
in the node. Frames stream into the encoder in uint8 chunks; the file appears under its name only when complete."""

from __future__ import annotations

import json
import os

from .. import comfy_services as services
from ..backend.media.save import save_new_mp4
from ..video_types import as_h3_video
from .adapters import audio_to_waveform

PRESETS = ["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow"]


class H3SaveVideo:
    CATEGORY = "H3"
    FUNCTION = "save"
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    DESCRIPTION = "Save as MP4 (H.264 video, AAC 32 kHz stereo audio) into the output folder."

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "The video to save (its own soundtrack is kept unless audio is "
                                               "connected)."}),
                "filename_prefix": ("STRING", {"default": "H3/h3",
                                               "tooltip": "Name under the output folder; a counter is appended "
                                                          "and existing files are never overwritten."}),
                "crf": ("INT", {"default": 18, "min": 0, "max": 51,
                                "tooltip": "H.264 quality: lower is better and bigger; 18 is visually lossless."}),
                "preset": (PRESETS, {"default": "veryfast",
                                     "tooltip": "x264 speed/size trade-off; faster presets encode faster, files "
                                                "are bigger."}),
            },
            "optional": {
                "audio": ("AUDIO", {"tooltip": "Soundtrack to use instead of the video's own."}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def save(self, video, filename_prefix, crf, preset, audio=None, prompt=None, extra_pnginfo=None):
        clip = as_h3_video(video)
        wave, rate = clip.audio, clip.sample_rate
        override = audio_to_waveform(audio)
        if override is not None:
            wave, rate = override
        out_dir = services.output_directory()
        path = save_new_mp4(out_dir, filename_prefix, clip.frames, clip.frame_rate, wave, rate, crf, preset,
                            metadata=_metadata(prompt, extra_pnginfo))
        rel = os.path.relpath(path, out_dir)
        subfolder, filename = os.path.split(rel)
        return {"ui": {"images": [{"filename": filename, "subfolder": subfolder, "type": "output"}],
                       "animated": (True,)}}


def _metadata(prompt, extra_pnginfo) -> dict:
    meta = {}
    if prompt is not None:
        meta["prompt"] = json.dumps(prompt)
    if isinstance(extra_pnginfo, dict):
        for key, value in extra_pnginfo.items():
            meta[key] = json.dumps(value)
    return meta
