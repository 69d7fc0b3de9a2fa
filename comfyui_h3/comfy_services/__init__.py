"""Adapters to ComfyUI services, with a headless fallback.

Everything the package needs from a running ComfyUI goes through this package: progress bars, the interrupt flag,
freeing ComfyUI's device memory, the "free memory" / "Unload Models" hook, model folders, and the input/output
directories. Nothing here imports ComfyUI at module import time, so the CLI, the tests and plain Python users can import
it without ComfyUI on the path. Import from here (``from comfyui_h3 import comfy_services as services``); the modules
below are the implementation:

- ``_comfy``: lazy detection / import of ComfyUI modules, the ``COMFYUI_H3_COMFY`` mode (``auto``, ``import``, ``off``)
- ``errors``: :class:`H3Interrupted`, :class:`UnsafePathError`, :class:`H3ModelNotFound`
- ``progress``: :class:`ProgressReporter`
- ``interrupt``: the interrupt flag
- ``memory``: :func:`free_comfy_device_memory` and the free-memory hook
- ``device``: :func:`comfy_compute_device`, the device ComfyUI computes on
- ``models``: model roots, discovery and :func:`resolve_h3_model`
- ``fasth3_models``: FastH3 student adapter discovery and :func:`resolve_fasth3_adapter`
- ``lora_files``: LoRA discovery under ComfyUI's loras folders and :func:`resolve_lora`
- ``native_files``: ComfyUI's native MiniMax-H3 single files (diffusion_models / text_encoders / vae), its Qwen
  tokenizer folder and its NestedTensor
- ``seedvr2_models``: SeedVR2 DiT / VAE / text-embedding discovery and :func:`resolve_seedvr2_file`
- ``track_models``: SAM2 / SAM3 folders for H3 Track Mask (``models/sam2``, ``models/sam3``) and
  :func:`resolve_track_model`
- ``paths``: input/output/temp directories and the safe resolvers
- ``preview``: live sampling previews (:func:`preview_every`, :func:`preview_image`)

Headless behaviour: progress lines on stderr, an interrupt flag that only :func:`request_interrupt` sets, model roots
from ``COMFYUI_H3_MODELS`` (``os.pathsep``-separated), ``./output`` and ``./input`` (or ``COMFYUI_H3_OUTPUT`` /
``COMFYUI_H3_INPUT``) as the output and input directories.
"""

from __future__ import annotations

from ._comfy import ENV_MODE, comfy_available
from .device import comfy_compute_device
from .errors import H3Interrupted, H3ModelNotFound, UnsafePathError
from .interrupt import (clear_interrupt, interrupt_exception_types, interrupt_requested, raise_if_interrupted,
                        request_interrupt)
from .memory import ensure_free_memory_hook, free_comfy_device_memory, log, register_free_memory_hook
from .models import (ENV_MODELS, H3_EXTRA_FOLDER_TYPES, H3_FOLDER_TYPE, MODEL_SCAN_DEPTH, h3_model_dirs,
                     h3_model_roots, is_h3_model_dir, register_h3_model_folder, resolve_h3_model)
from .fasth3_models import fasth3_adapter_files, resolve_fasth3_adapter
from .lora_files import ENV_LORAS, lora_files, resolve_lora
from .native_files import (FROM_FOLDER, comfy_tokenizer_dir, native_files, nested_tensor_class,
                           resolve_native_file)
from .seedvr2_models import (SEEDVR2_FOLDER_TYPE, SeedVR2FileNotFound, find_seedvr2_text_embedding,
                             find_seedvr2_vae, register_seedvr2_model_folder, resolve_seedvr2_file,
                             seedvr2_dit_files, seedvr2_file_kind, seedvr2_roots, seedvr2_vae_files)
from .track_models import (SAM2_FOLDER_TYPE, SAM3_FOLDER_TYPE, TrackModelNotFound, register_track_model_folders,
                           resolve_track_model, track_model_dirs, track_model_roots)
from .paths import (ENV_INPUT, ENV_OUTPUT, input_directory, output_directory, resolve_in_directory,
                    resolve_input_path, resolve_output_path, temp_directory)
from .preview import ENV_PREVIEW_EVERY, preview_every, preview_image
from .progress import ProgressReporter

__all__ = [
    "H3Interrupted",
    "UnsafePathError",
    "H3ModelNotFound",
    "comfy_available",
    "ProgressReporter",
    "ENV_PREVIEW_EVERY",
    "preview_every",
    "preview_image",
    "comfy_compute_device",
    "interrupt_requested",
    "raise_if_interrupted",
    "request_interrupt",
    "clear_interrupt",
    "interrupt_exception_types",
    "free_comfy_device_memory",
    "register_free_memory_hook",
    "ensure_free_memory_hook",
    "register_h3_model_folder",
    "h3_model_roots",
    "h3_model_dirs",
    "is_h3_model_dir",
    "resolve_h3_model",
    "SEEDVR2_FOLDER_TYPE",
    "SeedVR2FileNotFound",
    "register_seedvr2_model_folder",
    "seedvr2_roots",
    "seedvr2_dit_files",
    "seedvr2_vae_files",
    "seedvr2_file_kind",
    "resolve_seedvr2_file",
    "find_seedvr2_vae",
    "find_seedvr2_text_embedding",
    "fasth3_adapter_files",
    "resolve_fasth3_adapter",
    "FROM_FOLDER",
    "native_files",
    "resolve_native_file",
    "comfy_tokenizer_dir",
    "nested_tensor_class",
    "SAM2_FOLDER_TYPE",
    "SAM3_FOLDER_TYPE",
    "TrackModelNotFound",
    "register_track_model_folders",
    "track_model_roots",
    "track_model_dirs",
    "resolve_track_model",
    "output_directory",
    "input_directory",
    "temp_directory",
    "resolve_in_directory",
    "resolve_output_path",
    "resolve_input_path",
]
