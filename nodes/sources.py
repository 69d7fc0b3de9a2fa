"""What H3 Sample / H3 Refine start from: noise (the default), or a source -- our latents, the native AV LATENT, or a
decoded VIDEO -- at a denoise strength (pipelines/h3/strength.py). Picks the one source, takes the size and length
from it and turns it into the request's fields; the clip's resizing and the encode are the backend's
(pipelines/h3/init_clip.py)."""

from __future__ import annotations

from ..backend.pipelines.h3.extension_source import frames_for_latents
from ..backend.pipelines.h3.geometry import RequestError
from ..types import H3Latents

SPATIAL_RATIO = 16  # the video VAE's: latent h, w = H/16, W/16


def latent_size(video, width: int, height: int, what: str) -> tuple[int, int, int]:
    """(frames, width, height) that video latents [1, 24, T, h, w] describe; width / height widgets that are set
    (non-zero) must agree."""
    t, h, w = video.shape[2:]
    if t < 2 or (t - 2) % 5:
        raise RequestError(f"{what} has {t} latent frames; MiniMax-H3 makes 5n+2 (17n+5 frames).")
    size = (w * SPATIAL_RATIO, h * SPATIAL_RATIO)
    if (width or height) and (width, height) != size:
        raise RequestError(f"{what} is {size[0]}x{size[1]} but width/height say {width}x{height}: set them to 0 to "
                           "follow it.")
    return frames_for_latents(t), size[0], size[1]


def start_fields(frames: int, width: int, height: int, denoise: float = 1.0, source_audio: str = "same",
                 source_latents: H3Latents | None = None, source_video=None, native: H3Latents | None = None
                 ) -> tuple[int, int, int, dict]:
    """(frames, width, height, request fields) of a sampling start. A source gives the size and length (its frames
    replace seconds); below denoise 1 sampling starts from it. `native`: the native AV LATENT's latents, which are
    a source only below denoise 1 (at 1 they give the size, as a native sampler at denoise 1 uses them)."""
    sources = [name for name, value in (("source_latents", source_latents), ("source_video", source_video),
                                        ("native_latent", native if denoise < 1 else None)) if value is not None]
    if len(sources) > 1:
        raise RequestError(f"Connect one source to start from, got {' and '.join(sources)}.")
    if not sources and denoise < 1:
        raise RequestError("denoise below 1 needs a source to start from: connect source_latents, source_video or "
                           "native_latent (or set denoise to 1).")
    latents = source_latents if source_latents is not None else (native if denoise < 1 else None)
    if latents is not None:
        frames, width, height = latent_size(latents.video, width, height, sources[0])
        if denoise == 1:
            return frames, width, height, {}
        return frames, width, height, {"init_video": latents.video, "init_audio": latents.audio, "denoise": denoise,
                                       "init_audio_mode": source_audio}
    if source_video is not None:
        from ..backend.pipelines.h3.init_clip import prepare_init_clip
        from ..video_types import video_to_frames_audio

        pixels, rate, wave, sample_rate = video_to_frames_audio(source_video)
        clip = prepare_init_clip(pixels.cpu().numpy(), float(rate), wave, sample_rate, width or None,
                                 height or None)
        width, height = clip.size
        fields = {} if denoise == 1 else {"init_clip": clip, "denoise": denoise, "init_audio_mode": source_audio}
        return clip.num_frames, width, height, fields
    return frames, width, height, {}
