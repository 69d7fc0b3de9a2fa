"""The MiniMax-H3 model family: its engine options, the checks made before any weight moves, and how a rank builds
its pipeline from a Runtime (backend/families.py states the contract)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...engine_config import DTYPES, EngineConfig
from ...options import parse_resident_blocks
from .options import ENGINE, WEIGHT_FORMATS, engine_attention
from .weights import H3WeightPolicy


@dataclass(frozen=True)
class H3Options:
    model_dir: str
    vae_dtype: str = "float32"
    compile: str = "auto"  # torch.compile each DiT block and the video VAE decoder's: "auto" (on CUDA), "on", "off"
    reference_image_short_edge: int | None = None  # None: the model folder's setting, else 2048
    student: str | None = None  # a FastH3 adapter file fused into transformer/ at load (models/fasth3.py)
    files: tuple = ()  # sorted (component, path) pairs: ComfyUI native single files replacing the folder's weights
    loras: tuple = ()  # LoraChoice (models/lora.py) in the order they merge, into every DiT partition at load


NATIVE_COMPONENTS = ("transformer", "transformer_ref", "text_encoder", "vae", "audio_vae")


def h3_config(model_dir: str, *, dtype: str = "bfloat16", vae_dtype: str = "float32", compile: str = "auto",
              reference_image_short_edge: int | None = None, student: str | None = None,
              files: dict[str, str] | None = None, loras=(), **engine) -> EngineConfig:
    """An engine config for an H3 model folder. `dtype`: the DiT's and text encoder's compute dtype; `student`: a
    FastH3 adapter file (or its folder); `files`: {component: ComfyUI native single file} for components whose
    weights come from such a file (NATIVE_COMPONENTS; the folder gives their configs); `loras`: LoraChoice, or
    (file, strength) / (file, strength, adaln_strength) tuples (models/lora.py); `engine`: EngineConfig's own
    fields (device, world_size, executor, ray_address, attention, cpu_threads, weights: a WeightPolicy or an
    H3WeightPolicy, ...)."""
    if student:
        from ...models.fasth3 import resolve_adapter_file

        student = str(resolve_adapter_file(student).resolve())
    unknown = sorted(set(files or {}) - set(NATIVE_COMPONENTS))
    if unknown:
        raise ValueError(f"Unknown component(s) {unknown} for single files; use {', '.join(NATIVE_COMPONENTS)}.")
    pairs = tuple(sorted((k, os.path.abspath(os.path.expanduser(v))) for k, v in (files or {}).items() if v))
    from ...models.lora import LoraChoice, lora_choice

    chosen = tuple(c if isinstance(c, LoraChoice) else lora_choice(*c) for c in loras)
    options = H3Options(str(model_dir), vae_dtype, compile, reference_image_short_edge, student or None, pairs,
                        chosen)
    weights = H3WeightPolicy.of(engine.pop("weights", None))  # H3's own fields beside the shared ones
    return EngineConfig("h3", options, compute_dtype=dtype, weights=weights, **engine)


def engine_config(model_dir: str, *, attention: str = "sdpa", vsa_topk: float | None = None,
                  vsa_dense_steps: float | None = None, attention_precision: str | None = None,
                  adaln_cache: bool = False, weights: str = "bf16", resident_blocks="all", **config) -> EngineConfig:
    """The H3 engine config for the loader's choices, each checked by its option's rule: the one builder H3 Model
    Loader and generate / edit / extend share. `config`: h3_config's other arguments (dtype, device, world_size,
    executor, ray_address, student, files, ...)."""
    ENGINE.check({"adaln_cache": adaln_cache, "weights": weights})
    placement, resident = parse_resident_blocks(resident_blocks)  # its rule: a ValueError naming it
    policy = H3WeightPolicy(storage=WEIGHT_FORMATS[weights], placement=placement,
                            adaln="cache" if adaln_cache else "direct", resident_blocks=resident)
    return h3_config(model_dir, attention=engine_attention(attention, vsa_topk, vsa_dense_steps, attention_precision),
                     weights=policy, **config)


class H3Family:
    name = "h3"
    live_options = ("loras",)  # switched on a loaded engine (H3Components.switch_loras), not reloaded

    def check(self, config: EngineConfig) -> None:
        o = config.options
        if not isinstance(o, H3Options):
            raise TypeError(f"the h3 family takes H3Options, got {type(o).__name__}")
        if not isinstance(config.weights, H3WeightPolicy):
            raise TypeError(f"the h3 family takes an H3WeightPolicy (h3_config makes one), got "
                            f"{type(config.weights).__name__}")
        if o.vae_dtype not in DTYPES:
            raise ValueError(f"VAE dtype must be one of {DTYPES}, got {o.vae_dtype!r}.")
        if o.compile not in ("auto", "on", "off"):
            raise ValueError(f"compile must be 'auto', 'on' or 'off', got {o.compile!r}.")
        if not os.path.isdir(o.model_dir):
            raise FileNotFoundError(f"MiniMax-H3 model folder not found: {o.model_dir}")
        self._check_files(o)
        self._check_heads_split(o.model_dir, config.world_size, dict(o.files))
        from ...models.fp8_linear import check_fp8_config

        check_fp8_config(config)
        if o.student:
            self._check_student(config)
        if o.loras:
            self._check_loras(o)

    @staticmethod
    def _check_loras(o: H3Options) -> None:
        """Each LoRA's header against every DiT partition the folder configures (no weights read): a file for
        another model, or whose shapes do not fit, is refused before any worker starts. A partition from a native
        file is checked at load, against the shapes the file gives."""
        from ...models.checkpoint import meta_shapes
        from ...models.h3_transformer import H3Transformer, H3TransformerConfig
        from ...models.lora import read_lora

        for part in ("transformer", "transformer_ref"):
            path = os.path.join(o.model_dir, part, "config.json")
            if part in dict(o.files) or not os.path.isfile(path):
                continue
            cfg = H3TransformerConfig.from_json(path)
            shapes = meta_shapes(lambda: H3Transformer(cfg))
            for choice in o.loras:
                read_lora(choice.path, shapes)

    @staticmethod
    def _check_files(o: H3Options) -> None:
        """Each single file exists and is the native file of its component (its header only)."""
        from ...models.native_load import check_native_file
        from .release_config import is_release_folder

        files = dict(o.files)
        if is_release_folder(o.model_dir):  # no diffusers folder: every part needs its file
            missing = [c for c in ("text_encoder", "vae", "audio_vae") if c not in files]
            if not any(p in files for p in ("transformer", "transformer_ref")):
                missing.insert(0, "transformer (or transformer_ref)")
            if missing:
                raise ValueError(f"Without a diffusers folder every part comes from a single file; missing: "
                                 f"{', '.join(missing)}.")
        for name, path in o.files:
            check_native_file(path, "transformer" if name.startswith("transformer") else name)
        if o.student and "transformer" in dict(o.files):
            raise ValueError("The FastH3 student is fused into transformer/ of a diffusers folder; a native DiT file "
                             "is not supported with it.")

    @staticmethod
    def _check_student(config: EngineConfig) -> None:
        """The FastH3 adapter against transformer/'s config (headers only, no weights), and the attention its
        learned gates need."""
        from ...attention.registry import get_backend
        from ...models.checkpoint import CheckpointError
        from .student import check_adapter_for_folder

        transformer = os.path.join(config.options.model_dir, "transformer")
        if not os.path.isdir(transformer):
            raise CheckpointError(f"The FastH3 student edits transformer/, which {config.options.model_dir} lacks.")
        adapter = check_adapter_for_folder(config.options.student, transformer)
        if adapter.has_gates and not get_backend(config.attention).gated:
            raise ValueError(f"{adapter.path} carries learned VSA gates (FastH3's VSA variant): choose attention vsa "
                             f"(got {config.attention}); vsa with a topk of every tile (e.g. 100000) is dense "
                             "attention plus the gates.")

    @staticmethod
    def _check_heads_split(model_dir: str, degree: int, files: dict | None = None) -> None:
        """Ulysses splits attention heads over the ranks: refuse a degree that does not divide them, before any
        weight moves (the release's 56 heads allow 1, 2, 4, 7, 8). The one home of this rule."""
        from ...models.checkpoint import CheckpointError, read_json

        for part in ("transformer", "transformer_ref"):
            path = os.path.join(model_dir, part, "config.json")
            if part in (files or {}):
                from ...models.native_load import native_heads

                path, heads = files[part], native_heads(files[part])
            elif not os.path.isfile(path):
                continue
            else:
                heads = read_json(path).get("num_attention_heads", 56)  # a broken config is an error naming it
            if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
                raise CheckpointError(f"{path}: num_attention_heads must be a positive integer, got {heads!r}.")
            if heads % degree:
                ok = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 16]
                raise ValueError(f"Sequence-parallel degree {degree} does not divide the model's {heads} "
                                 f"attention heads; use one of {ok}.")

    def memory_bytes(self, config: EngineConfig) -> int:
        """Upper bound of what a rank holds: the folder's weight files (every rank holds the DiT partitions and
        VAEs; rank 0 also the text encoder, counted for all)."""
        total = 0
        files = dict(config.options.files)
        paths = [p for p in Path(config.options.model_dir).glob("*/*.safetensors") if p.parent.name not in files]
        for path in paths + [Path(p) for p in files.values()]:
            try:
                total += path.stat().st_size
            except OSError:
                continue
        return total

    def build(self, runtime, options: H3Options):
        import torch

        from .components import EngineOptions, H3Components, folder_settings
        from .pipeline import H3Pipeline

        settings = folder_settings(options.model_dir)
        device = str(runtime.device)
        from ...models.lora_apply import set_host_share

        set_host_share(runtime.parallel.world)  # each rank keeps base copies of what its LoRAs touch: one host
        engine_options = EngineOptions(
            device=device, dtype=runtime.compute_dtype, vae_dtype=getattr(torch, options.vae_dtype),
            attention=runtime.attention,
            compile_blocks=options.compile == "on" or (options.compile == "auto" and runtime.is_cuda),
            load_text_encoder=runtime.parallel.is_driver,
            reference_image_short_edge=options.reference_image_short_edge
            or settings.get("reference_image_short_edge", 2048),
            canvas_short_edge=settings.get("canvas_short_edge", 768),
            canvas_max_pixels=settings.get("canvas_max_pixels", 768 * 1344),
            adaln=runtime.weights.adaln,
            placement=runtime.weights.placement,
            resident_blocks=runtime.weights.resident_blocks,
            weight_storage=runtime.weights.storage,
            student=options.student,
            loras=options.loras,
            files=options.files,
        )
        return H3Pipeline(H3Components(options.model_dir, engine_options), runtime.parallel, runtime.attention)


FAMILY = H3Family()
