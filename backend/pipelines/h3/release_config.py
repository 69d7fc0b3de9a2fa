"""The released MiniMax-H3's non-weight parts, shipped with the package for setups without a diffusers folder.

ComfyUI's native single files (diffusion_models/, text_encoders/, vae/) hold weights only. What our engine also needs
-- component configs, the processor's settings, the schedulers' shifts -- is written here from the values the
release uses (docs/NATIVE_H3.md says where each comes from), and `release_folder()` lays them out as a weightless
diffusers folder: the single files then fill its components. The tokenizer's vocabulary cannot ship with the package
(nothing is downloaded here): it is copied in from a Qwen2 BPE tokenizer folder the user already has, normally the one
ComfyUI itself ships for its Qwen conditioners (comfy/text_encoders/qwen25_tokenizer: the same 151,643-token
vocabulary and merges as Qwen3-VL's, and the same special tokens up to <|video_pad|>, which is all H3's prompts use).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ...models.checkpoint import CheckpointError

MARKER = "comfyui_h3_release_configs.json"  # a release config folder says so (and whence its tokenizer)
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")

#: AutoencoderKLMiniMaxH3 as released (= diffusers 0.42.1's defaults; ComfyUI's MiniMaxH3VideoVAE hard-codes the same
#: geometry), with the latent normalisation the native VAE module carries (comfy/ldm/minimax/vae.py LATENTS_MEAN/STD).
VIDEO_VAE = {
    "_class_name": "AutoencoderKLMiniMaxH3",
    "in_channels": 3, "out_channels": 3, "latent_channels": 24,
    "block_out_channels": [128, 256, 256, 512, 512, 1024], "layers_per_block": 2,
    "spatial_downsample_factors": [2, 2, 2, 2, 1, 1], "temporal_downsample_factors": [1, 2, 2, 1, 1, 1],
    "norm_num_groups": 32, "norm_eps": 1e-6, "spatial_padding_mode": "reflect",
    "decoder_num_layers": 36, "decoder_num_attention_heads": 32, "decoder_attention_head_dim": 64,
    "decoder_num_register_tokens": 4, "decoder_ffn_mult": 4, "decoder_rope_theta": 100.0,
    "decoder_rope_dim_ratio": 0.75, "decoder_norm_eps": 1e-5, "clip_length": 17, "token_drop": 3,
    "latents_mean": [
        0.858090341091156, -0.9606591463088989, 1.0661640167236328, -0.5090325474739075, -0.2727581858634949,
        -1.3675414323806763, -0.2553254961967468, -0.26907554268836975, -0.5376840829849243, -0.0464097298681736,
        0.6657370328903198, 0.19690127670764923, -0.5460608005523682, -0.4035342037677765, -0.23683024942874908,
        0.25928452610969543, -0.30133944749832153, 0.211341992020607, -1.1206848621368408, 0.3581933379173279,
        -0.04225143790245056, 0.2604829967021942, 0.22864092886447906, 0.7056031823158264],
    "latents_std": [
        1.2223774194717407, 1.2767263650894165, 1.68317747116088865, 1.7549455165863037, 1.5636216402053833,
        2.194143533706665, 0.96531379222869875, 1.05698859691619875, 0.841948926448822, 0.7729952931404114,
        1.8955937623977661, 0.946841835975647, 0.7996809482574463, 0.44988900423049925, 0.7197399735450745,
        0.69362932443618775, 2.961095094680786, 2.7694199085235595, 3.0496184825897215, 2.1088054180145265,
        3.276226282119751, 3.1627357006073, 2.28168129920959475, 2.6127843856811525],
}

#: AutoencoderKLMiniMaxH3Audio as released (= diffusers' defaults = ComfyUI's MiniMaxH3AudioVAE). Its latent
#: normalisation is not here: the native audio VAE file carries it (`latents_mean` / `latents_std`).
AUDIO_VAE = {
    "_class_name": "AutoencoderKLMiniMaxH3Audio",
    "encoder_dim": 64, "encoder_rates": [2, 4, 4, 5, 5], "latent_dim": 2048, "latent_channels": 32,
    "num_attention_heads": 8, "decoder_dim": 1024, "decoder_rates": [5, 5, 2, 2, 2, 2, 2],
    "decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 4], "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "sampling_rate": 32000,
}

# Qwen's special-token ids (the Qwen2 vocabulary's; Qwen3-VL's config uses them for its vision blocks).
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 151652, 151653, 151655, 151656


def text_encoder_config() -> dict:
    """Qwen3VLConfig keyword arguments of the release's conditioner, Qwen3-VL-32B (64 decoder layers, of which H3
    reads the first 50; ComfyUI's Qwen3VL_32BConfig and QWEN3VL_VISION["qwen3vl_32b"] have the same widths)."""
    return {
        "text_config": {
            "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "attention_bias": False,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                "mrope_interleaved": True},
        },
        "vision_config": {
            "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 5120,
            "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
            "hidden_act": "gelu_pytorch_tanh",
        },
        "image_token_id": IMAGE_PAD, "video_token_id": VIDEO_PAD,
        "vision_start_token_id": VISION_START, "vision_end_token_id": VISION_END,
        "tie_word_embeddings": False,
    }


def _processor_part(kind: str) -> dict:
    size = {"shortest_edge": 65536, "longest_edge": 16777216} if kind == "image" else \
        {"shortest_edge": 4096, "longest_edge": 25165824}
    part = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "merge_size": 2, "patch_size": 16,
            "temporal_patch_size": 2, "resample": 3, "rescale_factor": 1 / 255, "size": size}
    if kind == "image":
        part["image_processor_type"] = "Qwen2VLImageProcessor"
    else:
        part.update({"video_processor_type": "Qwen3VLVideoProcessor", "do_sample_frames": True, "fps": 2,
                     "min_frames": 4, "max_frames": 768, "return_metadata": False})
    return part


#: Qwen3VLProcessor settings: Qwen3-VL's public image / video processors (patch 16, merge 2, temporal patch 2,
#: mean / std 0.5). H3 sizes every image itself before the processor, so only the patch geometry matters here.
PROCESSOR = {"processor_class": "Qwen3VLProcessor", "image_processor": _processor_part("image"),
             "video_processor": _processor_part("video")}

SCHEDULER_SHIFTS = {"scheduler": 12.0, "audio_scheduler": 3.0}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def tokenizer_digest(tokenizer_dir: str | os.PathLike) -> str:
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        h.update(name.encode())
        h.update((Path(tokenizer_dir) / name).read_bytes())
    return h.hexdigest()[:16]


def check_tokenizer_dir(tokenizer_dir: str | os.PathLike) -> Path:
    path = Path(tokenizer_dir).expanduser()
    missing = [n for n in TOKENIZER_FILES if not (path / n).is_file()]
    if missing:
        raise CheckpointError(f"{path} is not a Qwen tokenizer folder (missing {', '.join(missing)}): give the "
                              "folder holding vocab.json, merges.txt and tokenizer_config.json (ComfyUI ships one in "
                              "comfy/text_encoders/qwen25_tokenizer).")
    return path.resolve()


def _build(root: Path, tokenizer_dir: Path) -> None:
    _write_json(root / "model_index.json", {
        "_class_name": "MiniMaxH3ModularPipeline",
        "vae": ["diffusers", "AutoencoderKLMiniMaxH3"], "audio_vae": ["diffusers", "AutoencoderKLMiniMaxH3Audio"],
        "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"], "processor": ["transformers", "Qwen3VLProcessor"],
        "scheduler": ["diffusers", "MiniMaxH3Scheduler"], "audio_scheduler": ["diffusers", "MiniMaxH3Scheduler"],
    })
    _write_json(root / "vae" / "config.json", VIDEO_VAE)
    _write_json(root / "audio_vae" / "config.json", AUDIO_VAE)
    _write_json(root / "text_encoder" / "config.json",
                dict(text_encoder_config(), architectures=["Qwen3VLForConditionalGeneration"], model_type="qwen3_vl"))
    for name, shift in SCHEDULER_SHIFTS.items():
        _write_json(root / name / "scheduler_config.json", {"_class_name": "MiniMaxH3Scheduler", "shift": shift})
    for part in ("tokenizer", "processor"):
        (root / part).mkdir(parents=True, exist_ok=True)
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(tokenizer_dir / name, root / part / name)
        config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        config.pop("chat_template", None)  # a chat template is never applied: H3's presentations are raw text
        config["processor_class"] = "Qwen3VLProcessor"
        _write_json(root / part / "tokenizer_config.json", config)
    _write_json(root / "processor" / "processor_config.json", PROCESSOR)
    _write_json(root / MARKER, {"tokenizer_from": str(tokenizer_dir)})


def release_folder(tokenizer_dir: str | os.PathLike, cache: str | os.PathLike) -> Path:
    """A weightless diffusers folder with the release's configs and the given tokenizer, under `cache` (the
    package's cache folder), made once per tokenizer and reused. Built beside and renamed into place."""
    tokenizer_dir = check_tokenizer_dir(tokenizer_dir)
    digest = hashlib.sha256(json.dumps([VIDEO_VAE, AUDIO_VAE, text_encoder_config(), PROCESSOR,
                                        SCHEDULER_SHIFTS]).encode()).hexdigest()[:8]
    target = Path(cache) / f"h3-release-configs-{digest}-{tokenizer_digest(tokenizer_dir)}"
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".h3-release-", dir=target.parent))
    try:
        _build(staging, tokenizer_dir)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / MARKER).is_file():  # lost a race to another builder: theirs is the same
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def is_release_folder(folder: str | os.PathLike) -> bool:
    return (Path(folder) / MARKER).is_file()
