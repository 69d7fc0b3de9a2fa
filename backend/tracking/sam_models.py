"""SAM2 / SAM3 model folders (transformers layout): what a folder is, where and in which dtype it runs, and the cache
that keeps each loaded model for the next run.

A folder is read by its config.json `model_type`: ``sam2_video`` (the SAM2 / SAM2.1 releases; ``sam2`` is read the
same way) is a SAM2 video tracker (clicks and boxes); ``sam3_video`` (the SAM3 release) is SAM3: text prompts through
``Sam3VideoModel`` (detector + tracker) and clicks / boxes through ``Sam3TrackerVideoModel``, which transformers loads
from the same folder (each loaded when a run first needs it). Processor, image / video processor and tokenizer files come from the same
folder (``*.from_pretrained(folder)``).

Loaded models stay in a process-wide cache keyed by (folder, its files' sizes and times, device, dtype): a prompt that
uses the same model again skips the load; a rebuilt folder loads again. The cache holds :data:`MAX_CACHED` models, the
least recently used leaves first; :func:`clear_track_models` empties it (ComfyUI's Unload Models calls it).
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..errors import RequestError

SAM2, SAM3 = "sam2", "sam3"
KIND_NAMES = {SAM2: "SAM2", SAM3: "SAM3"}
#: config.json model_type -> kind
MODEL_TYPES = {"sam2_video": SAM2, "sam2": SAM2, "sam3_video": SAM3}
#: model types of SAM folders this node cannot track with, and what to use instead
OTHER_SAM_TYPES = {
    "sam3": "a SAM3 image model (no video tracker); use the full SAM3 release folder (model_type sam3_video)",
    "sam3_tracker": "a SAM3 image tracker; use the full SAM3 release folder (model_type sam3_video)",
    "sam3_tracker_video": "a SAM3 tracker without its detector; use the full SAM3 release folder (model_type "
                          "sam3_video)",
    "sam": "a SAM1 image model; use a SAM2 / SAM2.1 or SAM3 folder",
}
#: the transformers classes each kind needs
CLASSES = {SAM2: ("Sam2VideoModel", "Sam2VideoProcessor"),
           SAM3: ("Sam3VideoModel", "Sam3VideoProcessor", "Sam3TrackerVideoModel", "Sam3TrackerVideoProcessor")}
MAX_CACHED = 2


class TrackModelError(RequestError):
    """A model folder that cannot be used for tracking (missing, not SAM2 / SAM3, an old transformers, ...)."""


# -- what a folder is -------------------------------------------------------------------------------------------------

def _read_config(path: str) -> dict:
    config_path = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise TrackModelError(f"SAM model folder not found: {path}. Put a SAM2 / SAM2.1 folder in ComfyUI/models/sam2/ "
                              f"or a SAM3 folder in ComfyUI/models/sam3/ (transformers layout: config.json, "
                              f"model.safetensors, processor files).")
    if not os.path.isfile(config_path):
        raise TrackModelError(f"{path} is not a SAM model folder: it has no config.json (expected the transformers "
                              f"layout of facebook/sam2.1-hiera-* or facebook/sam3).")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError, RecursionError) as exc:
        raise TrackModelError(f"{config_path} cannot be read as JSON ({type(exc).__name__}: {str(exc)[:80]}).") \
            from None
    if not isinstance(config, dict):
        raise TrackModelError(f"{config_path} is not a model config (a JSON object).")
    return config


def model_kind(path: str) -> str:
    """SAM2 or SAM3 for a model folder, from its config.json; TrackModelError saying why when it is neither."""
    config = _read_config(path)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):  # a list or object there would not even be a dictionary key
        raise TrackModelError(f"{path} is not a SAM2 / SAM3 video model folder (config.json model_type is "
                              f"{str(model_type)[:60]!r}; expected one of {sorted(MODEL_TYPES)}).")
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    if model_type in OTHER_SAM_TYPES:
        raise TrackModelError(f"{path} is {OTHER_SAM_TYPES[model_type]}.")
    raise TrackModelError(f"{path} is not a SAM2 / SAM3 video model folder (config.json model_type is "
                          f"{model_type!r}; expected one of {sorted(MODEL_TYPES)}).")


def folder_kind(path: str) -> Optional[str]:
    """SAM2 / SAM3 for a usable model folder, None for anything else (never raises: model listings use it)."""
    try:
        return model_kind(path)
    except (TrackModelError, OSError):
        return None


def check_transformers(kind: str) -> None:
    """TrackModelError naming the missing class when this transformers cannot run `kind`."""
    import transformers

    for name in CLASSES[kind]:
        try:
            getattr(transformers, name)
        except (AttributeError, ImportError):
            raise TrackModelError(
                f"{KIND_NAMES[kind]} video tracking needs a transformers with {name} (SAM2 video: 4.56 or newer); "
                f"this environment has transformers {transformers.__version__}: pip install -U transformers."
            ) from None


# -- where it runs ----------------------------------------------------------------------------------------------------

def pick_device(comfy_device: Any = None, cuda_count: Optional[int] = None,
                free_memory: Optional[Callable[[int], int]] = None) -> torch.device:
    """The device tracking runs on: a CUDA GPU ComfyUI does not compute on when there is one (the one with the most
    free memory), else ComfyUI's own device. ComfyUI on the CPU (--cpu) keeps tracking on the CPU. Headless
    (`comfy_device` None): the CUDA GPU with the most free memory, else the CPU. `cuda_count` / `free_memory(index)`
    default to torch's."""
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if free_memory is None:
        def free_memory(index: int) -> int:
            return torch.cuda.mem_get_info(index)[0]
    comfy = torch.device(comfy_device) if comfy_device is not None else None
    if comfy is not None and comfy.type != "cuda":
        return comfy  # ComfyUI computes on the CPU (or another backend): so do we
    if cuda_count < 1:
        return comfy if comfy is not None else torch.device("cpu")
    busy = None if comfy is None else (comfy.index if comfy.index is not None else torch.cuda.current_device())
    others = [i for i in range(cuda_count) if i != busy]
    if not others:
        return torch.device("cuda", busy)

    def free(index: int) -> int:
        try:
            return int(free_memory(index))
        except Exception:  # noqa: BLE001 - a GPU that cannot report counts as full, never as an error
            return -1

    return torch.device("cuda", max(others, key=lambda i: (free(i), -i)))


def pick_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU that has it (float16 on older ones), float32 on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    try:
        with torch.cuda.device(device):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    except Exception:  # noqa: BLE001
        return torch.float16


# -- loaded models ----------------------------------------------------------------------------------------------------

@dataclass
class TrackModel:
    """A SAM2 or SAM3 folder and where it runs; its transformers models load on first use and stay.
    :meth:`click_model`: what clicks and boxes go to (SAM2's video model; SAM3's tracker, Sam3TrackerVideoModel).
    :meth:`text_model`: SAM3's text-prompted video model (Sam3VideoModel: detector + tracker). A SAM3 run with
    clicks only never loads the detector, nor one with text only the separate tracker."""

    path: str
    kind: str
    device: torch.device
    dtype: torch.dtype
    _parts: dict = field(default_factory=dict, repr=False)
    _lock: Any = field(default_factory=threading.RLock, repr=False)

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def reads_text(self) -> bool:
        return self.kind == SAM3

    def _part(self, role: str, model_class: str, processor_class: str) -> tuple:
        with self._lock:
            if role not in self._parts:
                import transformers

                model = _load(getattr(transformers, model_class), self.path, self.dtype, self.device, self.kind)
                processor = _load_processor(getattr(transformers, processor_class), self.path, self.kind)
                self._parts[role] = (model, processor)
            return self._parts[role]

    def click_model(self) -> tuple:
        """(model, processor) that take clicks and boxes."""
        if self.kind == SAM2:
            return self._part("video", "Sam2VideoModel", "Sam2VideoProcessor")
        return self._part("tracker", "Sam3TrackerVideoModel", "Sam3TrackerVideoProcessor")

    def text_model(self) -> tuple:
        """(model, processor) that take text prompts (SAM3)."""
        if self.kind != SAM3:
            raise TrackModelError(f"{self.name} is a {KIND_NAMES[self.kind]} model: it takes no text prompt.")
        return self._part("video", "Sam3VideoModel", "Sam3VideoProcessor")

    def loaded(self) -> list:
        """The transformers models loaded so far."""
        with self._lock:
            return [model for model, _ in self._parts.values()]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _load(cls, path: str, dtype: torch.dtype, device: torch.device, kind: str):
    from transformers.utils import logging as hf_logging

    from ..models.checkpoint import CheckpointError, check_finite

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its MISSING / UNEXPECTED report: refused below, in one line
    try:
        model, info = cls.from_pretrained(path, dtype=dtype, output_loading_info=True)
    except ImportError as exc:
        raise TrackModelError(f"{KIND_NAMES[kind]} needs a package that is missing ({_first_line(exc)}); "
                              f"SAM3 needs torchvision: pip install torchvision.") from None
    except Exception as exc:  # noqa: BLE001 - any load failure is a folder the user must fix: say which
        raise TrackModelError(f"could not load the {KIND_NAMES[kind]} model in {path} ({_first_line(exc)}).") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_whole(cls.__name__, path, kind, info)
    model = model.to(device).eval()
    try:
        check_finite(model, path)  # on the device, one sync
    except CheckpointError as exc:
        raise TrackModelError(str(exc)) from None
    return model


def _check_whole(class_name: str, path: str, kind: str, info: dict) -> None:
    """transformers loads a folder whose weights miss keys (or hold others) with random values in their place and
    only a log report: a wrong or partial folder is refused here, naming its first bad keys."""
    parts = []
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(k if isinstance(k, str) else str(k[0]) for k in info.get(what) or ())
        if keys:
            more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
            parts.append(f"{len(keys)} {what.replace('_keys', '')}: {', '.join(keys[:3])}{more}")
    if parts:
        raise TrackModelError(f"{path}: the weights do not match its config.json's {KIND_NAMES[kind]} model "
                              f"({class_name}): {'; '.join(parts)}. The folder's config.json and weights must be "
                              f"one release's (download the folder again).")


def _load_processor(cls, path: str, kind: str):
    try:
        return cls.from_pretrained(path)
    except ImportError as exc:
        raise TrackModelError(f"{KIND_NAMES[kind]}'s processor needs a package that is missing ({_first_line(exc)}); "
                              f"SAM3 needs torchvision: pip install torchvision.") from None
    except Exception as exc:  # noqa: BLE001
        raise TrackModelError(f"could not load the {KIND_NAMES[kind]} processor files in {path} "
                              f"({_first_line(exc)}); the folder needs processor_config.json (and SAM3 its "
                              f"tokenizer files) as released.") from None


def _fingerprint(path: str) -> tuple:
    """Sizes and times of the folder's top-level files: a folder rebuilt in place loads again."""
    entries = []
    try:
        for entry in os.scandir(path):
            if entry.is_file():
                stat = entry.stat()
                entries.append((entry.name, stat.st_size, stat.st_mtime_ns))
    except OSError:
        pass
    return tuple(sorted(entries))


_CACHE: "OrderedDict[tuple, TrackModel]" = OrderedDict()
_CACHE_LOCK = threading.Lock()


def load_track_model(path: str, device: Any = None, dtype: Optional[torch.dtype] = None) -> TrackModel:
    """The SAM2 / SAM3 model in `path` on `device` (default :func:`pick_device`) in `dtype` (default
    :func:`pick_dtype`), loaded once and kept (see the module docstring)."""
    path = os.path.abspath(os.fspath(path))
    kind = model_kind(path)
    check_transformers(kind)
    device = torch.device(device) if device is not None else pick_device()
    dtype = dtype or pick_dtype(device)
    key = (path, _fingerprint(path), str(device), str(dtype))
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        entry = TrackModel(path, kind, device, dtype)
        if kind == SAM2:
            entry.click_model()  # SAM2 has one model: load it now (SAM3 loads the part a run asks for)
        for old in [k for k in _CACHE if k[0] == path and k[2:] == key[2:]]:
            del _CACHE[old]  # the same folder before it was rebuilt
        _CACHE[key] = entry
        while len(_CACHE) > MAX_CACHED:
            _CACHE.popitem(last=False)
        return _CACHE[key]


def clear_track_models() -> None:
    """Drop every cached model (ComfyUI's Unload Models / POST /free calls this)."""
    with _CACHE_LOCK:
        _CACHE.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cached_track_models() -> list[TrackModel]:
    with _CACHE_LOCK:
        return list(_CACHE.values())
