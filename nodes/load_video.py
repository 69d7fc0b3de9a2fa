"""H3 Load Video and H3 Video To Images.

H3 Load Video: a video from ComfyUI's input folder (upload button, or a path inside the input folder), decoded with
PyAV into a lazily decoded uint8 VIDEO (`H3FileVideo`) with its audio, on a constant-rate grid (24 fps, H3's rate, by
default), optionally fitted to the H3 canvas. H3 Video To Images: any VIDEO (ours or core's) -> IMAGE + AUDIO + fps,
for nodes that want float frames; it is the only place float32 frames are made.
"""

from __future__ import annotations

import hashlib
import os

from .. import comfy_services as services
from ..backend.media.frames import uint8_to_image
from ..backend.media.resize import FIT_MODES, RESIZE_MODES
from ..video_file import H3FileVideo
from ..video_types import as_h3_video

VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v", ".gif", ".mpg", ".mpeg", ".ts", ".mts", ".flv",
                    ".wmv", ".3gp")
AUDIO_RATES = ("keep", "32000", "44100", "48000")
_HASH_WHOLE_FILE_BYTES = 64 << 20  # hash files up to this size whole; bigger ones by size + mtime + head and tail
_HASH_EDGE_BYTES = 4 << 20


def _input_videos() -> list[str]:
    root = services.input_directory()
    if not os.path.isdir(root):
        return []
    return sorted(f for f in os.listdir(root) if f.lower().endswith(VIDEO_EXTENSIONS)
                  and os.path.isfile(os.path.join(root, f)))


def resolve_video_path(video: str, path: str = "") -> str:
    """The file to load: `path` (relative to the input folder) when given, else the picked `video`. Never outside the
    input folder (UnsafePathError); FileNotFoundError when missing."""
    name = (path or "").strip() or video
    if not name:
        raise FileNotFoundError("no video selected: pick one in the list or give a path inside the input folder")
    return services.resolve_input_path(name, must_exist=True)


def file_fingerprint(file_path: str) -> str:
    """Content hash (whole file up to 64 MiB; above that size + mtime + the first and last 4 MiB)."""
    stat = os.stat(file_path)
    digest = hashlib.sha256()
    with open(file_path, "rb") as handle:
        if stat.st_size <= _HASH_WHOLE_FILE_BYTES:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        else:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
            digest.update(handle.read(_HASH_EDGE_BYTES))
            handle.seek(stat.st_size - _HASH_EDGE_BYTES)
            digest.update(handle.read(_HASH_EDGE_BYTES))
    return digest.hexdigest()


class _DecodeProgress:
    """Progress + Stop for a lazy decode: the bar is made when decoding starts, in whichever node triggers it."""

    def __init__(self, name: str):
        self.name = name
        self.reporter = None

    def __call__(self, done: int, total: int) -> None:
        if self.reporter is None:
            self.reporter = services.ProgressReporter(total, desc=f"decode {self.name}")
        if done % 8 == 0 or done == total:
            services.raise_if_interrupted()
            self.reporter.update_absolute(done, total)


class H3LoadVideo:
    CATEGORY = "H3"
    FUNCTION = "load"
    RETURN_TYPES = ("VIDEO", "AUDIO", "FLOAT", "INT", "INT", "INT", "FLOAT")
    RETURN_NAMES = ("video", "audio", "fps", "frame_count", "width", "height", "duration")
    OUTPUT_TOOLTIPS = (
        "The video as uint8 frames, decoded when a node first uses it (core Save Video and Get Video Components "
        "accept it).",
        "The soundtrack cut to the same span (stereo when the file has more channels), or None when the file has none.",
        "Frames per second of the output (constant).",
        "Number of output frames.",
        "Output width in pixels (after rotation and resize).",
        "Output height in pixels.",
        "Output duration in seconds (frame_count / fps).",
    )
    DESCRIPTION = ("Load a video (with its audio) from the input folder. Variable frame rate, rotation metadata, "
                   "10-bit and odd sizes are handled; force 24 fps for MiniMax-H3.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "video": (_input_videos(), {
                    "video_upload": True, "tooltip": "A video in ComfyUI's input folder (or upload one)."}),
                "force_rate": ("FLOAT", {
                    "default": 24.0, "min": 0.0, "max": 240.0, "step": 1.0,
                    "tooltip": "Resample to this frame rate by frame timestamps (audio stays in sync). 24 is "
                               "MiniMax-H3's rate; 0 keeps the file's average rate."}),
                "skip_first_frames": ("INT", {
                    "default": 0, "min": 0, "max": 1_000_000,
                    "tooltip": "Drop this many frames (counted after force_rate) from the start."}),
                "frame_load_cap": ("INT", {
                    "default": 0, "min": 0, "max": 1_000_000,
                    "tooltip": "Stop after this many output frames; 0 loads them all."}),
                "select_every_nth": ("INT", {
                    "default": 1, "min": 1, "max": 1000,
                    "tooltip": "Keep every nth frame (the output rate is divided by n)."}),
                "max_seconds": ("FLOAT", {
                    "default": 0.0, "min": 0.0, "max": 100_000.0, "step": 0.5,
                    "tooltip": "Stop after this many seconds of output; 0 means no limit. Decoding stops there too."}),
                "resize": (list(RESIZE_MODES), {
                    "default": "none",
                    "tooltip": "none: keep the size. H3 canvas: MiniMax-H3's canvas for the video's aspect (short "
                               "edge 768, multiple of 32). multiple of 32: nearest multiple of 32 of the size. target "
                               "size: exactly width x height."}),
                "fit": (list(FIT_MODES), {
                    "default": "crop",
                    "tooltip": "How to keep the aspect ratio when resizing: crop the overflow (centred) or pad with "
                               "black."}),
                "width": ("INT", {
                    "default": 1344, "min": 32, "max": 8192, "step": 32,
                    "tooltip": "Target width, used when resize is 'target size'."}),
                "height": ("INT", {
                    "default": 768, "min": 32, "max": 8192, "step": 32,
                    "tooltip": "Target height, used when resize is 'target size'."}),
                "audio_sample_rate": (list(AUDIO_RATES), {
                    "default": "keep",
                    "tooltip": "Resample the audio (32000 is MiniMax-H3's rate); keep leaves the file's rate. "
                               "5.1 / 7.1 tracks are always downmixed to stereo."}),
            },
            "optional": {
                "path": ("STRING", {
                    "default": "",
                    "tooltip": "Instead of the list: a path relative to the input folder (e.g. clips/a.mp4; "
                               "'name [output]' for the output folder). Paths outside it are refused."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, video=None):
        # Names only `video` (ComfyUI reports a refusal once per input named here, and skips its own list check for
        # them): a name from the list, or any file in the input folder. `path` is checked when the node runs.
        if not isinstance(video, str) or not video:
            return True  # linked, or empty (a `path` given instead): checked when the node runs
        try:
            services.resolve_input_path(video, must_exist=True)
        except (ValueError, FileNotFoundError) as exc:
            return (f"Video not found in the input folder: {video} ({exc}). Pick one in the list or upload it (API: "
                    "to read a file by `path` instead, set `video` to an empty string).")
        return True

    @classmethod
    def IS_CHANGED(cls, video, path="", **_):
        try:
            return file_fingerprint(resolve_video_path(video, path))
        except (ValueError, OSError):
            return float("nan")  # never equal: the run reports the error

    def load(self, video, force_rate=24.0, skip_first_frames=0, frame_load_cap=0, select_every_nth=1,
             max_seconds=0.0, resize="none", fit="crop", width=1344, height=768, audio_sample_rate="keep", path=""):
        file_path = resolve_video_path(video, path)
        clip = H3FileVideo(
            file_path,
            frame_load_cap=frame_load_cap,
            skip_first_frames=skip_first_frames,
            select_every_nth=select_every_nth,
            force_rate=force_rate,
            max_seconds=max_seconds,
            resize=resize,
            fit=fit,
            width=width,
            height=height,
            audio_sample_rate=None if audio_sample_rate == "keep" else int(audio_sample_rate),
            progress=_DecodeProgress(os.path.basename(file_path)),
        )
        w, h = clip.get_dimensions()
        return (clip, clip.audio_dict(), float(clip.get_frame_rate()), clip.get_frame_count(), w, h,
                clip.get_duration())


class H3VideoComponents:
    CATEGORY = "H3"
    FUNCTION = "split"
    RETURN_TYPES = ("IMAGE", "AUDIO", "FLOAT")
    RETURN_NAMES = ("images", "audio", "fps")
    OUTPUT_TOOLTIPS = (
        "The frames as IMAGE [T, H, W, 3] float 0..1 (4 bytes per value: a 10-s 1080p clip is 6 GB).",
        "The soundtrack (AUDIO), or None when the video has none.",
        "Frames per second.",
    )
    DESCRIPTION = "Split any VIDEO (H3 Load Video's or core Load Video's) into IMAGE frames, AUDIO and fps."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"video": ("VIDEO", {"tooltip": "Any VIDEO: from H3 Load Video, core Load Video, or an "
                                                            "H3 sampler."})}}

    def split(self, video):
        clip = as_h3_video(video)
        return (uint8_to_image(clip.frames.detach().cpu()), clip.audio_dict(), float(clip.get_frame_rate()))
