"""Visual and audio conditioning: keyframes onto the canvas, references onto H3's rates, VAE encoding.

Anchors come out normalised by the VAE's latents mean/std, float32 on the CPU:
  visual [1, 24, T, h, w] (an image is one latent frame); audio rows [2 * Ta, 32] channel-major.
The posterior is sampled under a fixed seed (42) independent of the request generator, and rounded through fp16,
as the released pipeline does, so the same keyframe always encodes to the same anchor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .geometry import FPS, RequestError, resolve_canvas
from .normalization import normalize_latents, pixels_to_vae

ENCODE_SEED = 42
MAX_IMAGES, MAX_VIDEOS, MAX_AUDIOS, MAX_REFERENCES = 9, 3, 3, 12


@dataclass
class NormalizedReference:
    """A reference on H3's own rates. kind image: `image` PIL RGB. kind video: `frames` uint8 [T, H, W, 3] at 24 fps,
    optional `audio` [2, N] float32 at 32 kHz. kind audio: `audio` only."""

    kind: str
    image: Image.Image | None = None
    frames: np.ndarray | None = None
    audio: torch.Tensor | None = None
    fps: float = float(FPS)

    @property
    def has_audio(self) -> bool:
        return self.audio is not None


def stretch_to(image: Image.Image, width: int, height: int) -> Image.Image:
    """The first keyframe sets the geometry and is stretched onto the canvas (LANCZOS)."""
    image = image.convert("RGB")
    return image if image.size == (width, height) else image.resize((width, height), Image.Resampling.LANCZOS)


def stretch_frames(frames: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 frames [F, H, W, 3] stretched to width x height, each with PIL's LANCZOS."""
    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.Resampling.LANCZOS))
                     for f in frames])


def cover_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """A following keyframe is scaled to cover the canvas and centre-cropped (rounded size, (src - dst) // 2)."""
    image = image.convert("RGB")
    if image.size == (width, height):
        return image
    scale = max(width / image.size[0], height / image.size[1])
    size = (max(width, round(image.size[0] * scale)), max(height, round(image.size[1] * scale)))
    left, top = max(0, (size[0] - width) // 2), max(0, (size[1] - height) // 2)
    return image.resize(size, Image.Resampling.LANCZOS).crop((left, top, left + width, top + height))


def prepare_keyframes(first: Image.Image | None, last: Image.Image | None, width: int, height: int):
    """-> (keyframes in packed order, anchors) with the first given keyframe stretched, a follower cover-cropped."""
    frames, anchors = [], []
    for anchor, image in (("first", first), ("last", last)):
        if image is None:
            continue
        frames.append(stretch_to(image, width, height) if not frames else cover_crop(image, width, height))
        anchors.append(anchor)
    return frames, tuple(anchors)


def resample_audio(waveform: torch.Tensor, src_rate: int, dst_rate: int) -> torch.Tensor:
    """[C, N] float32 -> [C, M] at dst_rate, through libswresample (PyAV)."""
    if src_rate == dst_rate:
        return waveform
    import av

    layout = "mono" if waveform.shape[0] == 1 else "stereo"
    frame = av.AudioFrame.from_ndarray(waveform.contiguous().float().numpy(), format="fltp", layout=layout)
    frame.sample_rate = src_rate
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=dst_rate)
    chunks = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
    if not chunks:  # a few samples make less than one at dst_rate: an empty soundtrack, not a crash
        return waveform.new_zeros(waveform.shape[0], 0)
    return torch.from_numpy(np.concatenate(chunks, axis=1)).float()


def normalize_audio(waveform: torch.Tensor, sample_rate: int, target_rate: int, max_seconds: float) -> torch.Tensor:
    waveform = torch.as_tensor(waveform)
    if waveform.ndim != 2 or waveform.shape[0] not in (1, 2):
        raise RequestError(f"Reference audio must be [channels, samples] mono or stereo, got {tuple(waveform.shape)}.")
    waveform = waveform.float()[:, : int(max_seconds * sample_rate)]
    if waveform.shape[0] == 1:
        waveform = waveform.expand(2, -1).contiguous()
    return resample_audio(waveform, sample_rate, target_rate)


def video_to_24fps(frames: np.ndarray, fps: float) -> np.ndarray:
    """Hold each frame until the next one's 24-fps slot (slot = floor(i * 24 / fps + 0.5))."""
    if fps <= 0:
        raise RequestError(f"A reference video needs a positive frame rate, got {fps}.")
    if fps == FPS:
        return frames
    scale = FPS / fps
    slots = np.floor(np.arange(frames.shape[0]) * scale + 0.5).astype(np.int64)
    return np.repeat(frames, np.diff(slots, append=math.floor(frames.shape[0] * scale + 0.5)), axis=0)


def check_reference_counts(kinds: list[str]) -> None:
    for kind, limit in (("image", MAX_IMAGES), ("video", MAX_VIDEOS), ("audio", MAX_AUDIOS)):
        if kinds.count(kind) > limit:
            raise RequestError(f"MiniMax-H3 accepts at most {limit} {kind} references, got {kinds.count(kind)}.")
    if len(kinds) > MAX_REFERENCES:
        raise RequestError(f"MiniMax-H3 accepts at most {MAX_REFERENCES} references in total, got {len(kinds)}.")
    if kinds and set(kinds) == {"audio"}:
        raise RequestError("Audio references need at least one image or video reference beside them.")


def normalize_references(references: list, num_frames: int, multiple: int, image_short_edge: int,
                         audio_rate: int, canvas_short_edge: int = 768,
                         canvas_max_pixels: int = 768 * 1344) -> list[NormalizedReference]:
    """Validate counts and put every reference (request.ReferenceInput) onto H3's rates, in request order."""
    if not references:
        raise RequestError("ref2va needs at least one reference.")
    check_reference_counts([r.kind for r in references])
    seconds = num_frames / FPS
    out = []
    for ref in references:
        audio = None
        if ref.audio is not None:
            audio = normalize_audio(ref.audio, ref.sample_rate or audio_rate, audio_rate, seconds)
        if ref.kind == "image":
            image = ref.image.convert("RGB")
            w, h = image.size
            if w > 4 * h or h > 4 * w:
                raise RequestError(f"A reference image must be within 1:4 and 4:1, got {w}x{h}.")
            scale = image_short_edge / min(w, h)
            size = (max(multiple, round(w * scale / multiple) * multiple),
                    max(multiple, round(h * scale / multiple) * multiple))
            if image.size != size:
                image = image.resize(size, Image.Resampling.LANCZOS)
            out.append(NormalizedReference("image", image=image))
        elif ref.kind == "video":
            frames = video_to_24fps(np.asarray(ref.frames), float(ref.fps))[:num_frames]
            h, w = resolve_canvas(frames.shape[2], frames.shape[1], multiple, canvas_short_edge, canvas_max_pixels)
            if frames.shape[1:3] != (h, w):
                frames = stretch_frames(frames, w, h)
            out.append(NormalizedReference("video", frames=frames, audio=audio))
        elif ref.kind == "audio":
            out.append(NormalizedReference("audio", audio=audio))
        else:
            raise RequestError(f"Reference kind must be image, video or audio, got {ref.kind!r}.")
    return out


class ConditionEncoder:
    """Wraps the video and audio VAEs for encoding anchors (decoding lives in decode.py)."""

    def __init__(self, vae, audio_vae, device):
        self.vae, self.audio_vae, self.device = vae, audio_vae, device

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor, sample: bool = True) -> torch.Tensor:
        """uint8 [B, 3, T, H, W] -> normalised latents [B, 24, T', H/16, W/16] float32 on CPU. `sample`: the
        posterior's fixed-seed sample (conditions, as the reference encodes them); False: its mode (the preview
        projection's fit, preview.py)."""
        posterior = self.vae.encode(pixels_to_vae(pixels, self.device, self.vae.dtype), return_dict=False)[0]
        latents = posterior.sample(generator=torch.Generator().manual_seed(ENCODE_SEED)) if sample else \
            posterior.mode()
        return normalize_latents(self.vae, latents.to(torch.float16).float().cpu())

    def encode_image(self, image: Image.Image) -> torch.Tensor:
        return self.encode_pixels(torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)[None, :, None])

    def encode_video(self, frames: np.ndarray) -> torch.Tensor:
        """Frames are cut to the VAE's own chunk grid (17n+5, at least one chunk) before encoding."""
        per_chunk = self.vae.config.clip_length
        keep = self.vae.tokens_chunk_size
        n = max(1, (frames.shape[0] - keep) // per_chunk) * per_chunk + keep
        return self.encode_pixels(torch.from_numpy(np.ascontiguousarray(frames[:n])).permute(3, 0, 1, 2)[None])

    @torch.no_grad()
    def encode_audio(self, waveform: torch.Tensor) -> torch.Tensor:
        """[2, N] float32 at the audio VAE's rate -> normalised rows [2 * Ta, 32] channel-major (posterior mode)."""
        posterior = self.audio_vae.encode(waveform.to(self.device, self.audio_vae.dtype)[:, None], return_dict=False)[0]
        latents = normalize_latents(self.audio_vae, posterior.mode().float().cpu())  # [2, 32, Ta]
        return latents.transpose(1, 2).reshape(-1, self.audio_vae.config.latent_channels)
