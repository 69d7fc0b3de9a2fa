"""A storyboard: a shot list made into one film. Each shot is a prompt, a duration and a transition from the shot
before: `cut` (a new generation -- with the film's reference images, if it has any, so characters stay the same)
or `continue` (an extension of the scene so far: its windows see the last frames and the sound, one timeline).

Shot list (JSON, or YAML where PyYAML is installed)::

    {"seed": 7, "width": 0, "height": 0, "steps": 50, "reference_images": ["hero.png"],
     "shots": [{"prompt": "...", "seconds": 5},
               {"prompt": "...", "seconds": 3, "transition": "continue"},
               {"prompt": "...", "seconds": 6, "transition": "cut", "seed": 11}]}

Frames: a cut shot has frames_for_seconds(seconds) frames (17n + 5, at least 5 s), a continue shot adds
added_frames_for(seconds) (whole 17-frame chunks) -- the film is their sum, at 24 fps. A shot's seed: its own, or the
film's seed + its index. The soundtrack is the shots' soundtracks end to end; at a cut the outgoing sound fades out
over its last FADE_S and the incoming one fades in over its first (raised cosine; no overlap, so sound and picture
stay frame-exact and there is no click where the waveforms meet).

This module holds the plan and the sound; comfyui_h3/storyboard_job.py runs it on an engine and writes the film."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch

from .extension_plan import added_frames_for
from .geometry import FPS, RequestError, frames_for_seconds

TRANSITIONS = ("cut", "continue")
FADE_S = 0.02
MAX_SHOTS = 64


@dataclass(frozen=True)
class Shot:
    index: int
    prompt: str
    seconds: float
    transition: str  # "cut" | "continue" (the first shot is a cut)
    seed: int
    frames: int  # this shot's frames in the film


@dataclass(frozen=True)
class Storyboard:
    shots: tuple[Shot, ...]
    width: int | None = None
    height: int | None = None
    steps: int = 50
    reference_images: tuple[str, ...] = ()  # files, resolved by the caller
    step_cache: str = "off"
    extras: dict = field(default_factory=dict)

    @property
    def total_frames(self) -> int:
        return sum(s.frames for s in self.shots)

    @property
    def seconds(self) -> float:
        return self.total_frames / FPS


def read_shot_list(text: str):
    """JSON, or YAML where PyYAML is installed, as data (RequestError when it is neither)."""
    try:
        return json.loads(text)
    except ValueError as json_error:
        try:
            import yaml
        except ImportError:
            raise RequestError(f"The shot list is not JSON ({json_error}); YAML needs PyYAML installed.") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RequestError(f"The shot list is neither JSON nor YAML: {exc}") from None


def parse_storyboard(source) -> Storyboard:
    """A Storyboard from a shot list (dict, or JSON / YAML text); RequestError naming the first bad field."""
    data = read_shot_list(source) if isinstance(source, str) else source
    if isinstance(data, list):
        data = {"shots": data}
    if not isinstance(data, dict) or not isinstance(data.get("shots"), list) or not data["shots"]:
        raise RequestError("A shot list is {\"shots\": [{\"prompt\": ..., \"seconds\": ...}, ...]} with one shot "
                           "at least.")
    unknown = sorted(set(data) - {"shots", "seed", "width", "height", "steps", "reference_images", "step_cache"})
    if unknown:
        raise RequestError(f"Unknown shot-list fields: {', '.join(unknown)}.")
    if len(data["shots"]) > MAX_SHOTS:
        raise RequestError(f"At most {MAX_SHOTS} shots, got {len(data['shots'])}.")
    base_seed = _int(data.get("seed", 0), "seed", 0, 2**64 - 1)
    shots = []
    for i, raw in enumerate(data["shots"]):
        where = f"shot {i + 1}"
        if not isinstance(raw, dict):
            raise RequestError(f"{where} must be an object with prompt and seconds.")
        extra = sorted(set(raw) - {"prompt", "seconds", "transition", "seed"})
        if extra:
            raise RequestError(f"{where}: unknown fields {', '.join(extra)}.")
        prompt = raw.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RequestError(f"{where}: a prompt (what the shot shows and sounds like) is needed.")
        transition = raw.get("transition", "cut")
        if transition not in TRANSITIONS:
            raise RequestError(f"{where}: transition must be cut or continue, got {transition!r}.")
        if i == 0 and transition == "continue":
            raise RequestError("shot 1 cannot continue: nothing comes before it (make it a cut).")
        seconds = raw.get("seconds", 5.0)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise RequestError(f"{where}: seconds must be a number, got {seconds!r}.")
        try:
            frames = frames_for_seconds(float(seconds)) if transition == "cut" else added_frames_for(float(seconds))
            if transition == "cut" and not 5.0 <= float(seconds) <= 15.0:
                raise RequestError("a cut is a new clip of 5 to 15 s")
        except RequestError as exc:
            raise RequestError(f"{where}: {exc} (got {seconds} s).") from None
        seed = _int(raw.get("seed", base_seed + i), f"{where} seed", 0, 2**64 - 1)
        shots.append(Shot(i, prompt.strip(), float(seconds), transition, seed, frames))
    refs = data.get("reference_images") or []
    if not isinstance(refs, list) or not all(isinstance(r, str) and r for r in refs) or len(refs) > 9:
        raise RequestError("reference_images is a list of up to 9 image files.")
    size = [data.get(k) or None for k in ("width", "height")]
    for name, value in zip(("width", "height"), size):
        if value is not None:
            _int(value, name, 32, 4096)
    return Storyboard(tuple(shots), size[0], size[1], _int(data.get("steps", 50), "steps", 1, 1000), tuple(refs),
                      str(data.get("step_cache", "off")))


def _int(value, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name} must be a whole number in [{low}, {high}], got {value!r}.")
    return value


def fade(length: int, sample_rate: int) -> torch.Tensor:
    """The fade-in ramp (raised cosine) of FADE_S at `sample_rate`, capped at `length` samples: [n] float32."""
    n = max(1, min(length, int(round(FADE_S * sample_rate))))
    return 0.5 - 0.5 * torch.cos(torch.linspace(0.0, math.pi, n, dtype=torch.float64)).float()


def shot_sound(audio: torch.Tensor, sample_rate: int, fade_in: bool, fade_out: bool) -> torch.Tensor:
    """A shot's soundtrack [C, N] with the fades its cuts give it (a copy)."""
    out = audio.float().clone()
    ramp = fade(out.shape[-1], sample_rate)
    if fade_in:
        out[:, :ramp.numel()] *= ramp
    if fade_out:
        out[:, -ramp.numel():] *= ramp.flip(0)
    return out


def samples_for(frames: int, sample_rate: int) -> int:
    """The soundtrack samples that go with `frames` video frames (24 fps)."""
    return int(round(frames * sample_rate / FPS))
