"""H3 Save Video: VIDEO (ours or core's) or IMAGE + fps (+ optional AUDIO) -> a video file in ComfyUI's output folder,
never overwriting, shown in the node. H.264 + AAC MP4 by default; H.265 (MP4), ProRes 422 HQ (MOV, for editors) and
FFV1 (MKV, lossless RGB, for pipelines) where this PyAV build has them.

Frames stream into a background encoder in uint8 chunks through two host buffers (backend.media.stream_writer):
frames still on a GPU are quantised there and only uint8 crosses to the host; an IMAGE batch is quantised chunk by
chunk, never as a whole uint8 copy. The file appears under its name only when complete. A VIDEO from our nodes
carries its request's stage manifest (`video.manifest`): it is written as `<file>.manifest.json` beside the saved
file (with this save's seconds added), never over an existing file."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time

from .. import comfy_services as services
from ..backend.media.encode import (AAC_SAMPLE_RATES, CODECS, as_fraction, available_codecs, check_encoder_options,
                                    next_free_path, release_placeholder)
from ..backend.media.save import ENCODING_TAG, copy_mp4, encoding_tag
from ..backend.media.stream_writer import StreamingVideoSaver
from ..video_types import as_h3_video
from .adapters import audio_to_waveform

PRESETS = ["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow"]


class H3SaveVideo:
    CATEGORY = "H3"
    FUNCTION = "save"
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    DESCRIPTION = ("Save a VIDEO, or an IMAGE batch at a frame rate, as MP4 (H.264 video, AAC stereo audio) into the "
                   "output folder; other codecs are offered when this PyAV build has them.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "filename_prefix": ("STRING", {"default": "H3/h3",
                                               "tooltip": "Name under the output folder; a counter is appended "
                                                          "and existing files are never overwritten."}),
                "crf": ("INT", {"default": 18, "min": 0, "max": 51,
                                "tooltip": "H.264 / H.265 quality: lower is better and bigger; 18 is visually "
                                           "lossless. Ignored by ProRes and FFV1."}),
                "preset": (PRESETS, {"default": "veryfast",
                                     "tooltip": "x264 / x265 speed/size trade-off; faster presets encode faster, "
                                                "files are bigger. Ignored by ProRes and FFV1."}),
            },
            "optional": {
                "video": ("VIDEO", {"tooltip": "The video to save (its own soundtrack is kept unless audio is "
                                               "connected). Connect this or images."}),
                "audio": ("AUDIO", {"tooltip": "Soundtrack to use instead of the video's own."}),
                "images": ("IMAGE", {"tooltip": "Frames to save instead of a VIDEO (IMAGE batch = frames, in "
                                                "order), at the fps below."}),
                "fps": ("FLOAT", {"default": 24.0, "min": 0.01, "max": 240.0, "step": 0.001,
                                  "tooltip": "Frame rate for images; a connected video keeps its own rate."}),
                "codec": (available_codecs(), {"default": "h264",
                                               "tooltip": "h264: MP4, plays everywhere (and in the node). h265: "
                                                          "MP4, smaller. prores: MOV 422 HQ 10-bit, for editors. "
                                                          "ffv1: MKV, lossless RGB, for pipelines. Only MP4 "
                                                          "previews in the browser."}),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    def save(self, video=None, filename_prefix="H3/h3", crf=18, preset="veryfast", audio=None, images=None, fps=24.0,
             codec="h264", prompt=None, extra_pnginfo=None):
        # (Python argument order kept from the first release for positional callers; ComfyUI passes keywords.)
        if video is None and images is None:
            raise ValueError("H3 Save Video needs a video or images: connect the video input, or an IMAGE batch to "
                             "images (with fps).")
        if video is not None and images is not None:
            raise ValueError("H3 Save Video got both video and images: connect one of them.")
        if codec not in CODECS:
            raise ValueError(f"Unknown codec {codec!r}; this build offers {available_codecs()}.")
        check_encoder_options(codec, crf, preset)  # before any output name is reserved
        override = audio_to_waveform(audio)
        manifest = getattr(video, "manifest", None) if video is not None else None
        t0 = time.perf_counter()
        out_dir = services.output_directory()
        metadata = _metadata(prompt, extra_pnginfo)
        if images is not None:
            wave, sample_rate = override if override is not None else (None, None)
            path = save_streamed(out_dir, filename_prefix, _image_frames(images), as_fraction(float(fps)), wave,
                                 sample_rate, crf, preset, codec, metadata=metadata)
        else:
            path = write_clip(out_dir, filename_prefix, video, override, crf, preset, codec, metadata)
        write_manifest_beside(path, manifest, time.perf_counter() - t0)
        return {"ui": video_ui(path, out_dir, "output")}


def video_ui(path: str, folder: str, kind: str) -> dict:
    """The node's ui entry that makes ComfyUI's frontend play `path` (a file under `folder`, ComfyUI's `kind` folder:
    output / temp) in the node, as core's video preview does."""
    subfolder, filename = os.path.split(os.path.relpath(path, folder))
    return {"images": [{"filename": filename, "subfolder": subfolder, "type": kind}], "animated": (True,)}


def write_clip(out_dir: str, prefix: str, video, override=None, crf=18, preset="veryfast", codec="h264",
               metadata=None) -> str:
    """Any VIDEO (ours or core's) -> a new `<out_dir>/<prefix>_NNNNN.<ext>` (never an existing name); returns its
    path. `override`: (waveform [C, S], rate) replacing the clip's own soundtrack. A clip whose own MP4 this pack
    wrote with exactly these settings is copied packet for packet; anything else streams through the encoder in
    chunks (save_streamed)."""
    clip = as_h3_video(video)
    source = _copyable_file(clip, codec, crf, preset) if override is None else None
    if source is not None:  # already exactly what this save would write: copy the packets
        return copy_mp4(source, next_free_path(out_dir, prefix, CODECS[codec].ext), metadata, reserved=True)
    wave, sample_rate = (clip.audio, clip.sample_rate) if override is None else override
    width, height = clip.get_dimensions()
    frames = FrameChunks(clip.iter_frames(), clip.get_frame_count(), height, width)
    return save_streamed(out_dir, prefix, frames, clip.frame_rate, wave, sample_rate, crf, preset, codec,
                         metadata=metadata)


class FrameChunks:
    """uint8 chunks [t, H, W, 3] of a `count`-frame clip, in order (a file-backed VIDEO decoded as it is saved)."""

    def __init__(self, chunks, count: int, height: int, width: int):
        self.chunks, self.shape = chunks, (int(count), int(height), int(width), 3)


def _copyable_file(clip, codec: str, crf, preset) -> str | None:
    """The clip's own MP4 when it was written by this pack with exactly these settings (then saving is a copy)."""
    path = getattr(clip, "source_path", None)
    if codec != "h264" or not path or not os.path.isfile(path) or not path.lower().endswith(".mp4"):
        return None
    return path if clip.metadata.get(ENCODING_TAG) == encoding_tag("h264", crf, preset) else None


def _image_frames(images):
    """IMAGE [B, H, W, C] (C = 1, 3 or 4) -> a [B, H, W, 3] float view (alpha dropped, grey repeated); no copy of
    the batch is made here: the saver quantises it chunk by chunk."""
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3, 4) or images.shape[0] < 1:
        raise ValueError(f"images must be an IMAGE [frames, height, width, 1/3/4 channels], got {tuple(images.shape)}.")
    if images.shape[-1] == 1:
        return images.expand(-1, -1, -1, 3)
    return images[..., :3]


def save_streamed(out_dir, prefix, frames, fps, wave=None, rate=None, crf=18, preset="veryfast", codec="h264",
                  metadata=None) -> str:
    """frames: uint8 [T, H, W, 3] or float [T, H, W, 3] in 0..1, on any device -> a new file; returns its path.
    Audio (float [C, S] at `rate`) is cut to the video's length and stored as AAC stereo."""
    height, width = int(frames.shape[1]), int(frames.shape[2])  # a tensor, or FrameChunks
    stream_rate = None
    if wave is not None:
        keep = math.ceil(int(frames.shape[0]) * int(rate) / as_fraction(fps))
        wave = wave[:2, :keep]
        stream_rate = int(rate) if int(rate) in AAC_SAMPLE_RATES else 48000
    check_encoder_options(codec, crf, preset)  # a bad option must not cost a reserved name
    path = next_free_path(out_dir, prefix, CODECS[codec].ext)  # reserved with O_EXCL: concurrent saves never collide
    try:
        saver = StreamingVideoSaver(path, width, height, fps, reserved=True, codec=codec, crf=crf, preset=preset,
                                    audio_sample_rate=stream_rate, metadata=metadata)
    except BaseException:
        release_placeholder(path)  # the writer gives it back too; this covers a failure before it took it over
        raise
    with saver:
        for chunk in (frames.chunks if isinstance(frames, FrameChunks) else [frames]):
            saver.write(chunk)
        if wave is not None:
            saver.write_audio(wave, sample_rate=int(rate))
    return saver.path


def write_manifest_beside(path: str, manifest, save_s: float) -> str | None:
    """`<path>.manifest.json` from a VIDEO's manifest (a copy: the same VIDEO may be saved twice), this save's
    seconds added to its encode/save stage. A file already there is left alone (a warning in the log; the video
    itself is saved). -> the manifest's path, or None."""
    if not isinstance(manifest, dict):
        return None
    from ..backend.manifest import manifest_path, write_new

    manifest = copy.deepcopy(manifest)
    stages = manifest.setdefault("stages", {})
    stages["encode_save_s"] = (stages.get("encode_save_s") or 0.0) + save_s
    try:
        return write_new(manifest_path(path), manifest)
    except FileExistsError as exc:
        logging.getLogger("comfyui_h3").warning("H3 Save Video: %s", exc)
        return None


def _metadata(prompt, extra_pnginfo) -> dict:
    meta = {}
    if prompt is not None:
        meta["prompt"] = json.dumps(prompt)
    if isinstance(extra_pnginfo, dict):
        for key, value in extra_pnginfo.items():
            meta[key] = json.dumps(value)
    return meta
