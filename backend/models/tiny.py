"""A tiny, deterministic MiniMax-H3 model set in the released diffusers folder layout.

`make_tiny_h3(out_dir)` writes a few megabytes of randomly initialised weights that load with the same loaders as the
released 33B checkpoint (`diffusers.ModularPipeline.from_pretrained(out_dir)` and our own backend), so every code path
-- text encoding with Qwen3-VL, keyframe / reference VAE encoding, the packed DiT, video and audio decoding -- runs on
a CPU in seconds. The weights are random: what the set generates is noise-like video and audio, never content.

Layout (same folder and file names as the release)::

    modular_model_index.json  what `ModularPipeline.from_pretrained` reads (component specs + pipeline configs)
    model_index.json          the classic index (`_class_name` + `[library, class]` per component), informative
    transformer/              MiniMaxH3Transformer3DModel, t2va / fl2va partition, SHARDED + mixed precision
    transformer_ref/          MiniMaxH3Transformer3DModel, ref2va partition, different weights, same layout
    vae/                      AutoencoderKLMiniMaxH3 (fp32)
    audio_vae/                AutoencoderKLMiniMaxH3Audio (fp32)
    text_encoder/             Qwen3VLForConditionalGeneration (bf16, 52 decoder layers: H3 reads hidden_states[50])
    tokenizer/                Qwen2Tokenizer(Fast) -- byte-level BPE built here, Qwen special tokens
    processor/                Qwen3VLProcessor (image + video processor + tokenizer), via save_pretrained
    scheduler/                MiniMaxH3Scheduler, shift 12 (video)
    audio_scheduler/          MiniMaxH3Scheduler, shift 3 (audio) -- the modular blocks expect this component

Geometry that is kept real (the pipeline's arithmetic keys off it): video latents 24 channels, 16x spatial and 4x
temporal compression, `clip_length` 17 -> 5 latent frames per chunk (frames snap to 17n+5, latent frames 5n+2), DiT
`in_channels` 24 / `audio_in_channels` 32 / patch (1, 2, 2) (canvas multiple 32), audio 32 kHz, 32 latent channels, hop
800 (40 latents/s), Qwen3-VL vision patch 16 / merge 2 / temporal patch 2, special-token names. Everything else (widths,
depths, heads) is tiny; see the `TINY_*` dicts below for every value.

Precision as released: the two transformer partitions store `proj_in`, `audio_proj_in`, `time_embedder`, `proj_out`,
`audio_proj_out` in float32 and every other tensor in bfloat16 (each partition is sharded into several safetensors
files plus `diffusion_pytorch_model.safetensors.index.json`); the text encoder is bfloat16; both VAEs are float32.
`load_components(dtype=torch.float32)` upcasts everything (`torch_dtype=` still works but is deprecated); with
bfloat16 the transformers' `_keep_in_fp32_modules` keep exactly those five modules in float32 (the audio VAE stays
float32, the video VAE keeps its encoder and norms float32). With no dtype, diffusers loads its models in float32 and
transformers loads the text encoder in bfloat16 (its stored dtype).

Pipeline configs: the released resolutions would make a CPU run slow, so the tiny set stores smaller values of the
modular pipeline's three config specs in `modular_model_index.json` (which `ModularPipeline.__init__` applies as the
config defaults): `canvas_short_edge` 64 and `canvas_max_pixels` 64*128 (a text-only request without height/width
generates 64x128 instead of 768x1344), and `reference_image_short_edge` 64 (a ref2va image reference is resized to a
64-pixel short edge instead of 2048). They are NOT accepted as `from_pretrained` keyword arguments (diffusers warns and
ignores them); to change them on a loaded pipeline use `pipe.register_to_config(reference_image_short_edge=...)`.
The Qwen3-VL image processor is limited to 32x32 .. 128x128 pixels (`size` shortest_edge 1024 / longest_edge 16384)
so vision encoding stays cheap.

Running diffusers' reference pipeline on it (CPU, about a second per request once loaded)::

    pipe = diffusers.ModularPipeline.from_pretrained(str(path))       # -> MiniMaxH3ModularPipeline
    pipe.load_components(dtype=torch.float32)                         # or from_pretrained(..., workflow="t2va")
    out = pipe(prompt="a cat", num_frames=124, height=64, width=64, num_inference_steps=3,
               generator=torch.Generator("cpu").manual_seed(0),
               output=["latents", "audio_latents", "videos", "audio"])  # + image= (fl2va) / references= (ref2va)
    out["latents"]        # (1, 24, 37, 4, 4): final video latents, normalised (before latents_std/mean)
    out["audio_latents"]  # (2, 32, 207): final audio latents, one batch item per stereo channel, normalised

To skip decoding: `blocks = diffusers.MiniMaxH3Blocks(); blocks.sub_blocks.pop("decode");
pipe = blocks.init_pipeline(str(path))`, then the same call with `output=["latents", "audio_latents"]`.

The tiny audio decoder's residual and output convolutions are damped after the random draw so that a decode does not
saturate the decoder's final [-1, 1] clamp (see `_save_audio_vae`).

Determinism: every component is built under its own fixed seed (`torch.manual_seed` before construction) and then
every parameter is re-drawn from a `torch.Generator` with that seed, in `named_parameters()` order, so the set does
not depend on the modules' own init schemes. Two builds with the same library versions write byte-identical files.
Re-drawing also replaces init-time constants (zero gates, unit norms, zero register tokens) with random values so
that parity tests exercise every weight.

Keep this module pure: no argparse, no printing. A CLI wraps `make_tiny_h3`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import shutil
import tempfile
from typing import Any

import torch

from .tiny_tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer


__all__ = [
    "make_tiny_h3",
    "TINY_TRANSFORMER_CONFIG",
    "TINY_VAE_CONFIG",
    "TINY_AUDIO_VAE_CONFIG",
    "TINY_TEXT_CONFIG",
    "TINY_VISION_CONFIG",
    "TINY_IMAGE_PROCESSOR",
    "TINY_VIDEO_PROCESSOR",
    "TINY_PIPELINE_CONFIG",
    "TINY_SEEDS",
    "TRANSFORMER_FP32_PREFIXES",
    "TRANSFORMER_MAX_SHARD_BYTES",
    "COMPONENTS",
]


# --------------------------------------------------------------------------------------------------------------------
# Tiny configs. Every value that is not "real" (the released one) is marked tiny.
# --------------------------------------------------------------------------------------------------------------------

#: MiniMaxH3Transformer3DModel. Released: 56 heads x 128, hidden 5376, 50 layers, 2 refiner layers, ffn 14336,
#: text_dim 5120, freq_dim 256, time MLP 5376 -> 2688, rope_freq_dim 16 (2*3*16 = 96 of 128 head channels rotated).
#: Tiny keeps the shape relations: inner (4*32 = 128) > hidden (48), temb = hidden / 2, 2*3*4 = 24 of 32 rotated.
#: 4 heads so sequence parallelism can be tested at degrees 1, 2 and 4.
TINY_TRANSFORMER_CONFIG: dict[str, Any] = {
    "num_attention_heads": 4,
    "attention_head_dim": 32,
    "hidden_size": 48,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "ffn_dim": 96,
    "in_channels": 24,  # real
    "audio_in_channels": 32,  # real
    "patch_size": [1, 2, 2],  # real
    "text_dim": 32,  # = TINY_TEXT_CONFIG["hidden_size"]
    "freq_dim": 32,
    "time_embed_hidden_dim": 48,
    "time_embed_dim": 24,
    "rope_freq_dim": 4,
    "rope_theta": 10000.0,  # real
    "norm_eps": 1e-5,
    "qk_norm_eps": 1e-5,
    "final_norm_eps": 1e-5,
}

#: Modules the released transformer checkpoint stores in float32 (top-level name prefixes); all else is bfloat16.
TRANSFORMER_FP32_PREFIXES: tuple[str, ...] = (
    "proj_in.",
    "audio_proj_in.",
    "time_embedder.",
    "proj_out.",
    "audio_proj_out.",
)

#: Shard size for the transformer partitions: small enough that each partition is written as several shards.
TRANSFORMER_MAX_SHARD_BYTES = 100_000


def _ramp(n: int, start: float, step: float) -> list[float]:
    return [round(start + step * i, 4) for i in range(n)]


#: AutoencoderKLMiniMaxH3. Real geometry: six levels with spatial factors (2,2,2,2,1,1) = 16x and temporal factors
#: (1,2,2,1,1,1) = 4x, clip_length 17, token_drop 3, 24 latent channels. Tiny widths / depths; the ViT decoder is one
#: 2-head x 16 layer (released: 36 layers, 32 heads x 64). latents_mean/std are non-trivial so that a missing
#: (de)normalisation shows up in parity tests.
TINY_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 24,  # real
    "block_out_channels": [8, 8, 16, 16, 16, 16],
    "layers_per_block": 1,
    "spatial_downsample_factors": [2, 2, 2, 2, 1, 1],  # real
    "temporal_downsample_factors": [1, 2, 2, 1, 1, 1],  # real
    "norm_num_groups": 4,
    "norm_eps": 1e-6,
    "spatial_padding_mode": "reflect",  # real
    "decoder_num_layers": 1,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 16,
    "decoder_num_register_tokens": 4,  # real
    "decoder_ffn_mult": 2,
    "decoder_rope_theta": 100.0,  # real
    "decoder_rope_dim_ratio": 0.75,  # real
    "decoder_norm_eps": 1e-5,
    "clip_length": 17,  # real
    "token_drop": 3,  # real
    "latents_mean": _ramp(24, -0.115, 0.01),
    "latents_std": _ramp(24, 0.77, 0.02),
}

#: AutoencoderKLMiniMaxH3Audio. Real: encoder rates (2,4,4,5,5) = hop 800, decoder rates (5,5,2,2,2,2,2), 32 kHz,
#: 32 latent channels. Tiny: encoder_dim 4 (real 64), latent_dim 64 (real 2048), 2 heads (real 8), decoder_dim 128
#: (real 1024), one AMP kernel (3, dilations 1 and 3; real kernels 3/7/11 with dilations 1/3/5).
TINY_AUDIO_VAE_CONFIG: dict[str, Any] = {
    "encoder_dim": 4,
    "encoder_rates": [2, 4, 4, 5, 5],  # real
    "latent_dim": 64,
    "latent_channels": 32,  # real
    "num_attention_heads": 2,
    "decoder_dim": 128,
    "decoder_rates": [5, 5, 2, 2, 2, 2, 2],  # real
    "decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 4],  # real
    "resblock_kernel_sizes": [3],
    "resblock_dilation_sizes": [[1, 3]],
    "sampling_rate": 32000,  # real
    "latents_mean": _ramp(32, -0.155, 0.01),
    "latents_std": _ramp(32, 0.69, 0.02),
}

# Gains applied to the tiny audio decoder after the random draw (see `_save_audio_vae`).
_AUDIO_RESIDUAL_GAIN = 0.2
_AUDIO_OUTPUT_GAIN = 0.1

#: Qwen3-VL text model. H3 reads hidden_states[50], so the stack needs more than 50 decoder layers: 52 keeps
#: layer 50 strictly inside the stack (neither the last layer nor the final norm). Real (Qwen3-VL 32B): hidden 5120,
#: 64 layers, 64 heads / 8 kv heads x 128, mrope_section [24, 20, 20] (sums to head_dim / 2), interleaved.
#: vocab_size is filled in from the tokenizer (rounded up to a multiple of 64).
TINY_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 52,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    },
    "attention_bias": False,
    "tie_word_embeddings": False,
}

#: Qwen3-VL vision tower. Real patch 16, spatial merge 2, temporal patch 2 are kept; depth 2 (real 27), width 16
#: (real 1152), deepstack after both layers (real [8, 16, 24]).
TINY_VISION_CONFIG: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 32,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,  # real
    "spatial_merge_size": 2,  # real
    "temporal_patch_size": 2,  # real
    "out_hidden_size": 32,  # = text hidden size
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [0, 1],
}

#: Qwen2VLImageProcessor kwargs: real patch / merge / normalisation, small pixel budget (32x32 .. 128x128).
TINY_IMAGE_PROCESSOR: dict[str, Any] = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 32 * 32, "longest_edge": 128 * 128},
}

#: Qwen3VLVideoProcessor kwargs: real patch / merge / normalisation, small pixel budget.
TINY_VIDEO_PROCESSOR: dict[str, Any] = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 32 * 32, "longest_edge": 128 * 128 * 8},
}

#: Config specs of the modular pipeline, stored in modular_model_index.json. Released: 768, 768*1344, 2048.
TINY_PIPELINE_CONFIG: dict[str, Any] = {
    "canvas_short_edge": 64,
    "canvas_max_pixels": 64 * 128,
    "reference_image_short_edge": 64,
}

#: One seed per weight-bearing component; transformer_ref differs from transformer.
TINY_SEEDS: dict[str, int] = {
    "transformer": 1001,
    "transformer_ref": 2002,
    "vae": 3003,
    "audio_vae": 4004,
    "text_encoder": 5005,
}

#: Scheduler shifts (real).
_SCHEDULER_SHIFTS = {"scheduler": 12.0, "audio_scheduler": 3.0}

#: Component name -> (library, class name), in the order the index lists them.
COMPONENTS: dict[str, tuple[str, str]] = {
    "audio_scheduler": ("diffusers", "MiniMaxH3Scheduler"),
    "audio_vae": ("diffusers", "AutoencoderKLMiniMaxH3Audio"),
    "processor": ("transformers", "Qwen3VLProcessor"),
    "scheduler": ("diffusers", "MiniMaxH3Scheduler"),
    "text_encoder": ("transformers", "Qwen3VLForConditionalGeneration"),
    "tokenizer": ("transformers", "Qwen2TokenizerFast"),
    "transformer": ("diffusers", "MiniMaxH3Transformer3DModel"),
    "transformer_ref": ("diffusers", "MiniMaxH3Transformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLMiniMaxH3"),
}

# --------------------------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------------------------


def _weight_norm_dims(module: torch.nn.Module) -> dict[str, int]:
    """`{parameter-name prefix: dim}` of every (old-style) weight-normed submodule, to rebuild its `weight_g`."""
    from torch.nn.utils.weight_norm import WeightNorm

    dims = {}
    for name, sub in module.named_modules():
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm):
                dims[f"{name}.{hook.name}" if name else hook.name] = hook.dim
    return dims


@torch.no_grad()
def _randomize_(module: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter of `module` from a generator seeded with `seed`, independent of its init scheme.

    - a parameter that is all ones at init (norm gains, Snake alpha) -> 1 + 0.1 * N(0, 1)
    - a matrix / kernel (ndim >= 2)                                  -> N(0, 1) / sqrt(fan_in)
    - anything else (biases, zero-init gates and register tokens)    -> 0.05 * N(0, 1)
    - `weight_g` of a weight-normed layer                            -> the norm of its new `weight_v`
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weight_norm_dims = _weight_norm_dims(module)
    for name, param in module.named_parameters():
        if name.endswith("_g") and name[:-2] in weight_norm_dims:
            continue
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
        if param.numel() > 0 and bool((param == 1).all()):
            value = 1.0 + 0.1 * noise
        elif param.ndim >= 2:
            fan_in = max(1, param.numel() // param.shape[0])
            value = noise / math.sqrt(fan_in)
        else:
            value = 0.05 * noise
        param.copy_(value.to(param.dtype))
    params = dict(module.named_parameters())
    for prefix, dim in weight_norm_dims.items():
        weight_v, weight_g = params[prefix + "_v"], params[prefix + "_g"]
        weight_g.copy_(_norm_except_dim(weight_v, dim).view_as(weight_g))


def _norm_except_dim(weight: torch.Tensor, dim: int) -> torch.Tensor:
    if dim == -1:
        return weight.norm()
    other = [d for d in range(weight.ndim) if d != dim]
    return weight.norm(dim=other, keepdim=True)


# --------------------------------------------------------------------------------------------------------------------
# Components
# --------------------------------------------------------------------------------------------------------------------


def _build_processor(tokenizer):
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(**TINY_IMAGE_PROCESSOR)
    video_processor = Qwen3VLVideoProcessor(**TINY_VIDEO_PROCESSOR)
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def _text_encoder_config(tokenizer):
    from transformers import Qwen3VLConfig

    vocab_size = 64 * math.ceil(len(tokenizer) / 64)
    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))))
    text_config = dict(TINY_TEXT_CONFIG, vocab_size=vocab_size)
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=dict(TINY_VISION_CONFIG),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def _save_text_encoder(path: pathlib.Path, tokenizer) -> None:
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    config = _text_encoder_config(tokenizer)
    seed = TINY_SEEDS["text_encoder"]
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    _randomize_(model, seed)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model.save_pretrained(path)


def _save_transformer(path: pathlib.Path, seed: int) -> None:
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(**TINY_TRANSFORMER_CONFIG).eval()
    _randomize_(model, seed)
    # The released mixed precision: the patch projections, the timestep MLP and the output heads stay float32.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith(TRANSFORMER_FP32_PREFIXES):
                param.data = param.data.to(torch.bfloat16)
    model.save_pretrained(path, max_shard_size=TRANSFORMER_MAX_SHARD_BYTES)


def _save_vae(path: pathlib.Path) -> None:
    from diffusers import AutoencoderKLMiniMaxH3

    seed = TINY_SEEDS["vae"]
    torch.manual_seed(seed)
    model = AutoencoderKLMiniMaxH3(**TINY_VAE_CONFIG).eval()
    _randomize_(model, seed)
    model.save_pretrained(path)


def _save_audio_vae(path: pathlib.Path) -> None:
    import warnings

    from diffusers import AutoencoderKLMiniMaxH3Audio

    seed = TINY_SEEDS["audio_vae"]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
        model = AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE_CONFIG).eval()
    _randomize_(model, seed)
    # With plain random weights every BigVGAN stage grows the signal (~x1.6 per stage through the residual AMP blocks)
    # and the decoder's final clamp to [-1, 1] saturates almost every sample, which would hide any difference in a
    # parity test. Damping the second convolution of each residual pair and the output convolution keeps a decode of
    # unit-variance latents around 0.1 RMS with no clipping.
    with torch.no_grad():
        for resblock in model.decoder.resblocks:
            for conv in resblock.convs2:
                conv.weight_g.mul_(_AUDIO_RESIDUAL_GAIN)
        model.decoder.conv_post.weight_g.mul_(_AUDIO_OUTPUT_GAIN)
    model.save_pretrained(path)


def _save_schedulers(root: pathlib.Path) -> None:
    from diffusers import MiniMaxH3Scheduler

    for name, shift in _SCHEDULER_SHIFTS.items():
        MiniMaxH3Scheduler(shift=shift).save_pretrained(root / name)


def _write_json(path: pathlib.Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _write_indexes(root: pathlib.Path) -> None:
    import diffusers

    version = diffusers.__version__
    # modular_model_index.json: what ModularPipeline.from_pretrained reads. `pretrained_model_name_or_path` is null:
    # diffusers points every component whose files are present in the loaded folder at that folder, so the set is
    # relocatable and a missing component can never fall back to a Hub download.
    modular = {
        "_blocks_class_name": "MiniMaxH3Blocks",
        "_class_name": "MiniMaxH3ModularPipeline",
        "_diffusers_version": version,
    }
    modular.update(TINY_PIPELINE_CONFIG)
    for name, (library, class_name) in COMPONENTS.items():
        modular[name] = [
            library,
            class_name,
            {
                "pretrained_model_name_or_path": None,
                "revision": None,
                "subfolder": name,
                "type_hint": [library, class_name],
                "variant": None,
            },
        ]
    _write_json(root / "modular_model_index.json", modular)

    # model_index.json: the classic index. diffusers 0.42.1 cannot load a modular pipeline from it alone (it finds no
    # blocks for `MiniMaxH3ModularPipeline` there); it lists the components for tools that read the classic index.
    classic = {"_class_name": "MiniMaxH3ModularPipeline", "_diffusers_version": version}
    classic.update(TINY_PIPELINE_CONFIG)
    classic.update({name: [library, class_name] for name, (library, class_name) in COMPONENTS.items()})
    _write_json(root / "model_index.json", classic)


def _build_into(root: pathlib.Path) -> None:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(root / "tokenizer")
    _build_processor(tokenizer).save_pretrained(root / "processor")
    _save_text_encoder(root / "text_encoder", tokenizer)
    _save_transformer(root / "transformer", TINY_SEEDS["transformer"])
    _save_transformer(root / "transformer_ref", TINY_SEEDS["transformer_ref"])
    _save_vae(root / "vae")
    _save_audio_vae(root / "audio_vae")
    _save_schedulers(root)
    _write_indexes(root)


@contextlib.contextmanager
def _quiet_saving():
    """Silence transformers' "Writing model shards" progress bar during the build, restoring its previous state."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _normalize_modes(root: pathlib.Path) -> None:
    """Give the set ordinary read permissions (the staging folder and some writers create owner-only files)."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def make_tiny_h3(out_dir: str | os.PathLike, *, overwrite: bool = False) -> pathlib.Path:
    """Write the tiny MiniMax-H3 model set into `out_dir` and return its path.

    The set is built in a temporary sibling folder and moved into place at the end, so `out_dir` never holds a
    half-written set. An existing non-empty `out_dir` raises `FileExistsError` unless `overwrite=True`, which
    replaces it. The global torch RNG state and default dtype are saved and restored around the build. Needs
    diffusers (>= 0.42.1, for the MiniMax-H3 classes), transformers (Qwen3-VL) and torchvision (the Qwen3-VL image and
    video processors are torchvision-backed); no network access.
    """
    out = pathlib.Path(out_dir).expanduser().resolve()
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out} exists and is not a directory.")
        if any(out.iterdir()) and not overwrite:
            raise FileExistsError(f"{out} is not empty; pass overwrite=True to replace it.")
    out.parent.mkdir(parents=True, exist_ok=True)

    rng_state, default_dtype = torch.get_rng_state(), torch.get_default_dtype()
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        torch.set_default_dtype(torch.float32)  # the stored precisions must not follow a caller's default dtype
        with _quiet_saving():
            _build_into(staging)
        _normalize_modes(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        torch.set_rng_state(rng_state)
        torch.set_default_dtype(default_dtype)
    return out
