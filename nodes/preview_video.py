"""H3 Preview Video: play any VIDEO (ours or core's), with its sound or another AUDIO, in the node. The file is written
into ComfyUI's temp folder (which ComfyUI empties when it starts) through the same streamed writer H3 Save Video uses;
nothing goes to the output folder: H3 Save Video is the node that keeps files."""

from __future__ import annotations

from .. import comfy_services as services
from .adapters import audio_to_waveform
from .save_video import video_ui, write_clip

PREFIX = "h3_preview/preview"  # under the temp folder
# H3 Save Video's defaults: a clip H3 Extend streamed with them is copied packet for packet, not re-encoded.
CRF, PRESET = 18, "veryfast"


class H3PreviewVideo:
    CATEGORY = "H3"
    FUNCTION = "preview"
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    DESCRIPTION = ("Play a video and its sound in the node. It is written to ComfyUI's temp folder only; use H3 Save "
                   "Video to keep it in the output folder.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "video": ("VIDEO", {"tooltip": "Any video (from H3 nodes or core's); its own soundtrack plays unless "
                                               "audio is connected."}),
            },
            "optional": {
                "audio": ("AUDIO", {"tooltip": "A soundtrack to play instead of the video's own."}),
            },
        }

    def preview(self, video, audio=None):
        folder = services.temp_directory()
        path = write_clip(folder, PREFIX, video, audio_to_waveform(audio), CRF, PRESET, "h264")
        return {"ui": video_ui(path, folder, "temp")}
