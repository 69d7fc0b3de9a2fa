"""Media layer: decode files to uint8 frames + audio, float <-> uint8 conversion on the device, streamed MP4 encode.

- frames.py: `video_to_uint8`, `iter_uint8_chunks` (float video -> uint8 [T, H, W, 3], chunked, same device),
  `uint8_to_image` (uint8 -> ComfyUI IMAGE float32). Needs torch only.
- encode.py: `Mp4Writer` (H.264 + AAC, temp file + no-clobber publish), `next_free_path`, `as_fraction`. Needs PyAV.
- decode.py: `decode_video` (frame_load_cap / skip_first_frames / select_every_nth / force_rate / max_seconds, VFR by
  timestamps, rotation, resize), `plan_frames` + `decode_planned_frames` (lazy decode), `probe_video`.
- audio_decode.py: `decode_planned_audio` (the span a frame plan covers), `decode_reference_audio` (a ref2va
  reference's whole soundtrack), `decode_audio` (a plain audio file). container.py opens files for both.
- canvas.py: H3's canvas rule (short edge, pixel cap, aspect limits), below resize.py and the H3 pipeline.
- resize.py: `plan_resize` / `apply_resize` / `resize_frames` (H3 canvas, multiple of 32, target; crop or pad).
- mask_raster.py: H3 Mask Draw's drawing -> MASK frames, and `grow_feather_invert`: the pack's one definition of a
  mask's grow (Euclidean disk dilation / erosion) and feather (three box blurs), used by H3 Mask Draw and H3 Edit.

Names are resolved lazily, so a GPU worker that only converts frames never imports PyAV.
"""

import importlib

_EXPORTS = {
    "DecodedVideo": "decode",
    "VideoInfo": "decode",
    "decode_video": "decode",
    "FramePlan": "decode",
    "plan_frames": "decode",
    "decode_planned_frames": "decode",
    "decode_planned_audio": "audio_decode",
    "decode_reference_audio": "audio_decode",
    "decode_audio": "audio_decode",
    "ResizePlan": "resize",
    "plan_resize": "resize",
    "apply_resize": "resize",
    "resize_frames": "resize",
    "h3_canvas_size": "resize",
    "RESIZE_MODES": "resize",
    "FIT_MODES": "resize",
    "hold_counts": "decode",
    "probe_video": "decode",
    "AAC_SAMPLE_RATES": "encode",
    "X264_PRESETS": "encode",
    "Mp4Writer": "encode",
    "as_fraction": "encode",
    "next_free_path": "encode",
    "iter_uint8_chunks": "frames",
    "uint8_to_image": "frames",
    "video_to_uint8": "frames",
    "grow_feather_invert": "mask_raster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
