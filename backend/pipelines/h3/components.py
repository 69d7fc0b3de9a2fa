"""Load a MiniMax-H3 diffusers-layout folder: text encoder, tokenizer, processor, VAEs, and the two DiT partitions.

Layout: transformer/ (t2va, fl2va), transformer_ref/ (ref2va), vae/, audio_vae/, text_encoder/, tokenizer/,
processor/, scheduler/, audio_scheduler/ and model_index.json. Either transformer partition may be absent (then its
tasks are refused with a clear message). DiTs load lazily, on the first request that needs them, through our strict
loader; the other components through their libraries with a strict key report (nothing is left randomly
initialised). Every file is read under checkpoint.reading, so any fault is an error naming the file; the folder check
reads every config and every safetensors header before a weight loads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from ...device_memory import cuda_free_bytes
from ...models.checkpoint import CheckpointError, check_finite, meta_shapes, read_json, reading, stored_shapes
from ...models.h3_transformer import H3Transformer, load_h3_transformer
from ...models.native_load import (check_native_file, load_native_audio_vae, load_native_text_encoder,
                                   load_native_transformer, load_native_vae)
from .release_config import is_release_folder
from .adaln_cache import AdaLNCache
from .conditioning import ConditionEncoder
from .offload import TEXT_LAYERS, StageResidency
from .schedule import RELEASE_AUDIO_SHIFT, RELEASE_VIDEO_SHIFT, SCHEDULER_DEFAULT_SHIFT
from .text import TEXT_LAYER, TextEncoder

REQUIRED = ("vae", "audio_vae", "text_encoder", "tokenizer", "processor")
WEIGHTED = ("transformer", "transformer_ref", "vae", "audio_vae", "text_encoder")
SCHEDULERS = {"scheduler": RELEASE_VIDEO_SHIFT, "audio_scheduler": RELEASE_AUDIO_SHIFT}  # folder -> release shift
# A Qwen2 tokenizer loads from tokenizer.json or from vocab.json + merges.txt; with neither, transformers still
# returns a tokenizer, one that turns every prompt into zero tokens (a reshape error at generate time).
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
TASK_PARTITION = {"t2va": "transformer", "fl2va": "transformer", "ref2va": "transformer_ref", "edit": "transformer",
                  "extend": "transformer_ref"}


def check_model_folder(folder: str | os.PathLike, files: dict[str, str] | None = None) -> Path:
    """Raise CheckpointError naming what is missing; return the resolved folder. `files`: components given as
    ComfyUI native single files (models/native_load.py): their weights come from the file, not the folder."""
    files = files or {}
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"MiniMax-H3 model folder not found: {path}")
    missing = [name for name in REQUIRED if not (path / name).is_dir()]
    if not any((path / p).is_dir() or p in files for p in ("transformer", "transformer_ref")):
        missing.append("transformer/ or transformer_ref/")
    if missing:
        raise CheckpointError(f"{path} is not a MiniMax-H3 diffusers folder: missing {', '.join(missing)}")
    for name, file in files.items():
        check_native_file(file, "transformer" if name.startswith("transformer") else name)
    # Everything below reads only configs and safetensors headers: a broken file is named before a weight loads.
    for config in sorted(path.glob("*.json")):
        read_json(config)
    for name in REQUIRED + ("transformer", "transformer_ref") + tuple(SCHEDULERS):
        for config in sorted((path / name).glob("*.json")) if (path / name).is_dir() else ():
            read_json(config)
    for name in WEIGHTED:
        if (path / name).is_dir() and name not in files:
            read_json(path / name / "config.json")  # a weights folder without its config is named here
            if is_release_folder(path):  # the shipped configs hold no weights: this component needs its file
                raise CheckpointError(f"No {name} weights: pick its ComfyUI single file (--{name.replace('_', '-')} "
                                      "FILE, or the loader's file input), or a MiniMax-H3 diffusers folder.")
            stored_shapes(path / name)  # absent / pickle-only weights, truncated or corrupt shards, short indexes
        elif name in files and name not in ("transformer", "transformer_ref"):
            read_json(path / name / "config.json")  # a single file takes its config from the folder
    for name in ("tokenizer", "processor"):
        if not any(all((path / name / f).is_file() for f in files) for files in TOKENIZER_FILES):
            raise CheckpointError(f"{path / name / 'tokenizer.json'} is missing (the tokenizer needs tokenizer.json, "
                                  "or vocab.json + merges.txt): copy it from the model's release.")
    scheduler_shifts(path)
    return path.resolve()


def scheduler_shifts(folder: str | os.PathLike) -> tuple[float, float]:
    """(video, audio) schedule shifts of a model folder, read as diffusers 0.42.1 reads them: the `shift` of
    scheduler/scheduler_config.json and audio_scheduler/scheduler_config.json, the scheduler class's own default (12)
    where a config leaves it out. A folder without one of the two subfolders gets the release's value for it (video
    12, audio 3): the reference pipeline cannot run without its audio scheduler, so there is nothing else to follow."""
    shifts = []
    for name, release in SCHEDULERS.items():
        path = Path(folder) / name / "scheduler_config.json"
        if not (Path(folder) / name).is_dir():
            shifts.append(release)
            continue
        shift = read_json(path).get("shift", SCHEDULER_DEFAULT_SHIFT)
        if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not 0 < shift < float("inf"):
            raise CheckpointError(f"{path}: shift must be a positive number, got {shift!r}.")
        shifts.append(float(shift))
    return shifts[0], shifts[1]


def _strict(kind: str, folder: Path, info: dict, ignore=lambda key: False) -> None:
    """The library's own load report, strictly: any missing, unexpected or mismatched key is an error naming the
    weight file that holds it (or, for a missing key, the folder's weight files) and the first bad keys."""
    bad = {k: [key for key in v if not ignore(key if isinstance(key, str) else key[0])] for k, v in info.items()
           if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        stored = stored_shapes(folder)
        named = [key if isinstance(key, str) else key[0] for v in bad.values() for key in v]
        files = sorted({str(stored[key][0]) for key in named if key in stored})
        if not files:  # only missing keys: the folder's weight files
            files = sorted({str(file) for file, _ in stored.values()})
        where = ", ".join(files[:2]) + (f" (+{len(files) - 2} more)" if len(files) > 2 else "")
        detail = "; ".join(f"{k}: {', '.join(sorted(map(str, v))[:5])}" for k, v in bad.items())
        raise CheckpointError(f"{kind} weights {where} do not match {folder / 'config.json'} ({detail})")


def load_text_encoder(folder: Path, dtype: torch.dtype):
    """Qwen3-VL with only the decoder layers H3 reads: hidden_states[50] is the output of layer 50, so layers 51..
    and the LM head are never loaded (for the released 64-layer conditioner: ~14 of its 64 layers and a 0.8B-param
    head, ~15 GB in bf16). With the final norm made the identity, the truncated stack's hidden_states[50] equals the
    full model's bit for bit (the pipeline parity tests run through this path)."""
    import re

    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    with reading(folder / "config.json"):
        config = AutoConfig.from_pretrained(folder)
        layers = config.text_config.num_hidden_layers
    if layers <= TEXT_LAYER:
        raise CheckpointError(f"MiniMax-H3 reads hidden_states[{TEXT_LAYER}] of Qwen3-VL; {folder} has only {layers} "
                              "decoder layers.")
    config.text_config.num_hidden_layers = TEXT_LAYER
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the skipped layers are expected, not a load problem: checked strictly below
    try:
        with reading(folder, expected=lambda: meta_shapes(lambda: Qwen3VLForConditionalGeneration._from_config(config))):
            model, info = Qwen3VLForConditionalGeneration.from_pretrained(
                folder, config=config, dtype=dtype, use_safetensors=True, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    dropped = re.compile(r"(^|\.)layers\.(\d+)\.")

    def beyond(key: str) -> bool:
        match = dropped.search(key)
        return bool(match) and "language_model" in key and int(match.group(2)) >= TEXT_LAYER

    _strict("text_encoder", folder, info, ignore=beyond)
    check_finite(model, folder)
    model.model.language_model.norm = torch.nn.Identity()
    model.lm_head = torch.nn.Identity()
    return model


@dataclass
class EngineOptions:
    device: str = "cpu"
    dtype: torch.dtype = torch.bfloat16  # compute dtype of the DiT and text encoder; fp32 modules stay fp32
    vae_dtype: torch.dtype = torch.float32
    attention: Any = "sdpa"  # the runtime's AttentionBackend (or a registered name, for direct use)
    compile_blocks: bool = False
    load_text_encoder: bool = True
    reference_image_short_edge: int = 2048
    canvas_short_edge: int = 768
    canvas_max_pixels: int = 768 * 1344
    placement: str = "resident"  # WeightPolicy.placement: "offload" streams DiT blocks from host memory
    resident_blocks: int | None = None  # WeightPolicy.resident_blocks (offload): None = auto per request
    adaln: str = "direct"  # WeightPolicy.adaln: "cache" holds AdaLN tables instead of projection weights
    weight_storage: str = "compute"  # WeightPolicy.storage: "fp8" quantises the DiT blocks' GEMM weights at load
    student: str | None = None  # a FastH3 adapter file, fused into transformer/ at load (models/fasth3.py)
    loras: tuple = ()  # LoraChoice (models/lora.py), merged into every DiT partition at load, after the student
    files: tuple = ()  # (component, native single file) pairs replacing the folder's weights (models/native_load.py)


class H3Components:
    def __init__(self, folder: str | os.PathLike, options: EngineOptions):
        from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
        from transformers import AutoProcessor, AutoTokenizer

        self.files = dict(options.files)
        self.folder = check_model_folder(folder, self.files)
        self.options = options
        self.device = torch.device(options.device)
        # The schedules' default shifts (a request's None): the folder's scheduler configs, as the reference reads them.
        self.video_shift, self.audio_shift = scheduler_shifts(self.folder)
        # Offload placement: the big models live in host memory and visit the device (pipelines/h3/offload.py).
        self.residency = StageResidency(self.device) if options.placement == "offload" else None
        f = self.folder
        files = self.files
        self.vae = (load_native_vae(files["vae"], f / "vae", options.vae_dtype) if "vae" in files
                    else _load_diffusers(AutoencoderKLMiniMaxH3, "vae", f / "vae", options.vae_dtype))
        self.audio_vae = (load_native_audio_vae(files["audio_vae"], f / "audio_vae", options.vae_dtype)
                          if "audio_vae" in files else
                          _load_diffusers(AutoencoderKLMiniMaxH3Audio, "audio_vae", f / "audio_vae", options.vae_dtype))
        # Under sequence parallelism only rank 0 holds the text encoder (~50 GB of Qwen3-VL in bf16 for the
        # release) and broadcasts the embeddings; the other ranks keep that memory for the DiT.
        text_model = None
        if options.load_text_encoder:
            text_model = (load_native_text_encoder(files["text_encoder"], f / "text_encoder", options.dtype,
                                                   TEXT_LAYER) if "text_encoder" in files
                          else load_text_encoder(f / "text_encoder", options.dtype))
        self._place("vae", self.vae.eval().requires_grad_(False))
        if options.compile_blocks:
            compile_vae_decoder(self.vae)
        self._place("audio_vae", self.audio_vae.eval().requires_grad_(False))
        self.text = None
        if text_model is not None:
            self._place("text", text_model.eval().requires_grad_(False), layers=TEXT_LAYERS)
            with reading(f / "tokenizer"):
                tokenizer = AutoTokenizer.from_pretrained(f / "tokenizer")
            if not tokenizer("a", add_special_tokens=False)["input_ids"]:
                raise CheckpointError(f"The tokenizer in {f / 'tokenizer'} turns text into no tokens: its tokenizer.json "
                                      "(or vocab.json + merges.txt) is not a Qwen tokenizer's.")
            with reading(f / "processor"):
                processor = AutoProcessor.from_pretrained(f / "processor")
            self.text = TextEncoder(text_model, tokenizer, processor, self.device, options.dtype)
        self.cond = ConditionEncoder(self.vae, self.audio_vae, self.device)
        self._dits: dict[str, H3Transformer] = {}
        self._adaln: dict[str, AdaLNCache] = {}  # partition -> its AdaLN table cache (adaln "cache")

    def _place(self, name: str, module: torch.nn.Module, layers: str | None = None) -> None:
        """Resident: onto the device now. Offload: into host memory, to the device when its stage calls it."""
        if self.residency is None:
            module.to(self.device)
        else:
            self.residency.add(name, module, layers)

    def enter_dit(self, dit: H3Transformer, local_rows: int, total_rows: int) -> dict | None:
        """Offload placement: plan the DiT stage of a request (resident blocks, stage models off when memory
        is short); the plan, or None when every weight is resident."""
        if self.residency is None or dit.block_offload is None:
            return None
        return self.residency.enter_dit(dit.block_offload, local_rows, total_rows, self.options.resident_blocks)

    def dit_room(self, dit: H3Transformer) -> int | None:
        """Device bytes a DiT forward's activations can have (row_fit.py): the free memory (resident placement);
        under offload also what its stage may take from the other models and the DiT's own resident blocks, less its
        minimum (two block slots). None on the CPU (nothing to check)."""
        if self.device.type != "cuda":
            return None
        if self.residency is None or dit.block_offload is None:
            return cuda_free_bytes(self.device)
        streamer = dit.block_offload
        movable = streamer.device_bytes() + sum(part.device_bytes for part in self.residency.parts.values())
        return self.residency.free_bytes() + movable - streamer.device_bytes_for(0)

    # geometry read from the VAEs, so a fine-tune with other factors needs no code change
    @property
    def spatial_ratio(self) -> int:
        return int(self.vae.spatial_compression_ratio)

    @property
    def frames_per_chunk(self) -> int:
        return int(self.vae.config.clip_length)

    @property
    def latents_per_chunk(self) -> int:
        return int(self.vae.tokens_chunk_size)

    @property
    def audio_rate(self) -> int:
        return int(self.audio_vae.config.sampling_rate)

    @property
    def latent_channels(self) -> int:
        return int(self.vae.config.latent_channels)

    @property
    def audio_channels(self) -> int:
        return int(self.audio_vae.config.latent_channels)

    def with_folder_shifts(self, req):
        """The request with its unset schedule shifts (None, or the option's unset 0) taken from this folder's
        scheduler configs -- or, on the turbo schedule, from the engine's Turbo LoRA (turbo.py, which also holds
        its steps to the LoRA's)."""
        if getattr(req, "schedule", "default") == "turbo":
            from .turbo import turbo_request

            return turbo_request(req, self.options.loras)
        if req.video_shift and req.audio_shift:
            return req
        return replace(req, video_shift=req.video_shift or self.video_shift, audio_shift=req.audio_shift or self.audio_shift)

    def has_partition(self, task: str) -> bool:
        name = TASK_PARTITION[task]
        return name in self.files or (self.folder / name).is_dir()

    def carries_student(self, task: str) -> bool:
        """Whether the DiT that runs `task` has the FastH3 student fused in (only transformer/ gets it)."""
        return bool(self.options.student) and TASK_PARTITION[task] == "transformer"

    def transformer_for(self, task: str) -> H3Transformer:
        name = TASK_PARTITION[task]
        if name not in self._dits:
            if not self.has_partition(task):
                raise CheckpointError(f"Task {task} needs {self.folder / name}/, which this model folder lacks.")
            # One 33B partition at a time on a GPU: drop the other before loading (62 GB each in bf16).
            if self.device.type == "cuda":
                self._dits.clear()
                self._adaln.clear()  # its tables and the pinned host copy of its projection weights
                torch.cuda.empty_cache()
            if self.residency is not None:  # offload: loaded on the host, blocks homed there (pinned)
                if self.device.type == "cuda":
                    self.residency.detach_dits()  # the dropped partition's pinned blocks go first
                dit = self._load_dit(name, "cpu", "compute")
                self.residency.attach_dit(dit, self.options.weight_storage,
                                          ("adaln_proj.",) if self._adaln_cached(dit) else ())
            else:
                dit = self._load_dit(name, self.device, self.options.weight_storage)
            if self.options.compile_blocks:
                compile_blocks(dit)
            if self._adaln_cached(dit):
                self._adaln[name] = AdaLNCache(dit)  # moves the projection weights to host memory now
            self._dits[name] = dit
        return self._dits[name]

    def switch_loras(self, choices) -> dict | None:
        """Make `choices` (LoraChoice, in order) the DiT's LoRAs: in place in every loaded partition
        (models/lora_apply.py: bitwise what a load with them gives; the AdaLN cache is rebuilt over the switched
        projections), and the ones loaded later load with them. What the switch did (None: nothing to do). Raises
        ReloadNeeded where it cannot be done in place (streamed blocks; a base weight held only as FP8 codes)."""
        from ...errors import ReloadNeeded
        from ...models.lora_apply import CannotSwitch, apply_loras

        choices = tuple(choices)
        if choices == tuple(self.options.loras):
            return None
        start = time.perf_counter()
        if self.residency is not None and self._dits:
            raise ReloadNeeded("the offload placement's streamed DiT blocks take LoRAs at load only")
        done = {"in_place": True, "partitions": {}}
        for name, dit in self._dits.items():
            cache = self._adaln.pop(name, None)
            if cache is not None:
                cache.release()
            try:
                done["partitions"][name] = apply_loras(dit, choices)
            except CannotSwitch as exc:
                raise ReloadNeeded(str(exc)) from None
            except CheckpointError:  # a file this partition refuses, before any of its weights changed
                if done["partitions"]:  # partitions switched before it would run another set than the options'
                    self._dits.clear()
                    self._adaln.clear()
                elif cache is not None:
                    self._adaln[name] = AdaLNCache(dit)  # as it was
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory half way: these weights are mixed now
                self._dits.clear()
                self._adaln.clear()
                raise ReloadNeeded(f"switching the LoRAs failed part way ({type(exc).__name__}: {exc})") from None
            if cache is not None:
                self._adaln[name] = AdaLNCache(dit)
        self.options = replace(self.options, loras=choices)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        done["s"] = round(time.perf_counter() - start, 4)
        return done

    def _adaln_cached(self, dit: H3Transformer) -> bool:
        """adaln "cache" applies to a DiT with full AdaLN projections; for a pruned native DiT (projections over an
        8-wide curve, a few MB) it is a no-op: the direct projection is what the cache would save memory from."""
        return self.options.adaln == "cache" and not dit.pruned

    def _load_dit(self, name: str, device, storage: str) -> H3Transformer:
        """A DiT partition from its native single file (the folder's config, when it has one, for what the file's
        shapes do not say) or from the folder."""
        if name in self.files:
            config = self.folder / name / "config.json"
            return load_native_transformer(self.files[name], config if config.is_file() else None, device,
                                           self.options.dtype, self.options.attention, storage=storage,
                                           adapter=self._student(name), loras=self.options.loras)
        return load_h3_transformer(self.folder / name, device, self.options.dtype, self.options.attention,
                                   storage=storage, adapter=self._student(name), loras=self.options.loras)

    def _student(self, partition: str) -> str | None:
        return self.options.student if partition == "transformer" else None

    def adaln_cache(self, dit: H3Transformer) -> AdaLNCache | None:
        """The AdaLN table cache of a loaded DiT (None: direct projection)."""
        return next((cache for cache in self._adaln.values() if cache.dit is dit), None)

    def adaln_report(self) -> dict:
        """Per loaded partition, the AdaLN cache's bytes (tables vs projection weights) and counts; {} when direct."""
        return {name: cache.report() for name, cache in self._adaln.items()}

    @property
    def patch_size(self) -> tuple[int, int, int]:
        for name in ("transformer", "transformer_ref"):
            cfg = self.folder / name / "config.json"
            if cfg.is_file():
                return tuple(read_json(cfg).get("patch_size", (1, 2, 2)))
        return (1, 2, 2)


def _load_diffusers(cls, kind: str, folder: Path, dtype: torch.dtype):
    """A diffusers component, strictly; a failure names the file (and the mismatched tensors, when that is why)."""
    with reading(folder, expected=lambda: meta_shapes(lambda: cls.from_config(cls.load_config(folder)))):
        model, info = cls.from_pretrained(folder, torch_dtype=dtype, use_safetensors=True, output_loading_info=True)
    _strict(kind, folder, info)
    check_finite(model, folder)
    return model


def folder_settings(folder: str | os.PathLike) -> dict:
    """Pipeline settings a model folder may carry (diffusers modular config: canvas / reference sizes)."""
    settings: dict = {}
    for name in ("modular_model_index.json", "model_index.json"):
        path = Path(folder) / name
        if path.is_file():
            raw = read_json(path)  # a broken index is named, not skipped: it may hold the canvas settings
            for key in ("reference_image_short_edge", "canvas_short_edge", "canvas_max_pixels"):
                if isinstance(raw.get(key), int):
                    settings.setdefault(key, raw[key])
    return settings


def block_compile_options(backend: str | Callable = "inductor") -> dict | None:
    """torch.compile options for the DiT blocks: Inductor's coordinate-descent tuning of its generated kernels, per
    compile (not global: ComfyUI's and other packs' compiles keep their settings). The norm / modulation / rotary /
    SwiGLU passes 5.7 -> 4.3 ms per block at the 5-s shape on the H200 (bench/dit_block.py --tuned --profile), for a
    few seconds more compile, once. Other backends take no Inductor options."""
    return {"coordinate_descent_tuning": True} if backend == "inductor" else None


def compile_blocks(dit: H3Transformer, backend: str | Callable = "inductor") -> None:
    """Regional compilation: every block compiles to the same graph (parameters are graph inputs), so 50 blocks cost
    one compile; Inductor fuses the norm / modulation / rotary / SwiGLU / gated-residual elementwise work around the
    GEMMs and attention (0.955x of diffusers' block at the 10-s shape, 20% less peak memory: docs/BENCHMARKS.md).
    A compile failure falls back to eager instead of failing the request: dynamo's `suppress_errors`, set only while
    one of these blocks runs (dynamo reads it when a call compiles), so ComfyUI's and other packs' compiles keep
    their own setting."""
    compile_each_block(dit.transformer_blocks, backend)


def compile_vae_decoder(vae, backend: str | Callable = "inductor") -> None:
    """The video VAE's ViT decoder blocks compiled like the DiT's (one graph for all 36): Inductor fuses the float32
    RMSNorms, the q/k norms and rotary, SwiGLU and the scaled residual adds, which cost more than the GEMMs in the
    batched-tile decode (docs/BENCHMARKS.md, "H3 video decode"). Equal to the eager decoder up to float rounding of
    the fused passes. A VAE without those blocks is left as it is."""
    blocks = getattr(getattr(vae, "decoder", None), "transformer_blocks", None)
    if blocks is not None:
        compile_each_block(blocks, backend)


def compile_each_block(blocks, backend: str | Callable = "inductor") -> None:
    """torch.nn.Module.compile on each block, falling back to eager on a compile failure (compile_blocks)."""
    options = block_compile_options(backend)
    for block in blocks:
        # torch.nn.Module.compile: the compiled call lives in _compiled_call_impl
        block.compile(backend=backend, options=options)
        compiled = getattr(block, "_compiled_call_impl", None)
        if compiled is None:
            raise RuntimeError("torch.nn.Module.compile set no _compiled_call_impl: this torch is not supported.")
        block._compiled_call_impl = _eager_on_compile_failure(compiled)


def _eager_on_compile_failure(compiled: Callable) -> Callable:
    import torch._dynamo

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(suppress_errors=True):
            return compiled(*args, **kwargs)

    return call
