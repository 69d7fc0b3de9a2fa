"""Strict loading of ComfyUI's native MiniMax-H3 single files into our modules (key maps: native_keys.py; reading and
FP8: native_file.py). Every key of the file must map onto the module with the shape the config builds, and every
tensor the module needs must come from the file: anything else is a CheckpointError naming the file and the first
bad keys, raised before a weight is read. What the file cannot say (configs, the tokenizer) comes from a diffusers
folder: the user's, or the release's configs the package ships (pipelines/h3/release_config.py).

The DiT's architecture is read off the file's shapes (as ComfyUI's model detection does), with the values shapes do
not carry (rotary theta, norm epsilons, patch size) from the base config; the other components follow their config.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

import torch

from .checkpoint import CheckpointError, FiniteCheck, _first, aligned, meta_shapes, reading
from .native_file import NativeFile
from .native_keys import NATIVE_PREFIXES, KeyMap, audio_vae_map, text_encoder_map, transformer_map, video_vae_map

__all__ = ["native_kind", "native_file_kind", "check_native_file", "native_heads", "transformer_config_from_native",
           "load_native_transformer",
           "load_native_text_encoder", "load_native_vae", "load_native_audio_vae", "fold_weight_norm", "KINDS"]

KINDS = {"transformer": "diffusion model (DiT)", "text_encoder": "text encoder (Qwen3-VL)",
         "vae": "video VAE", "audio_vae": "audio VAE"}

# Keys that say what a native file is (ComfyUI's own detection keys, model_detection.py / sd.py).
_SIGNATURES = {
    "transformer": ("video_patch_proj.weight", "audio_patch_proj.weight"),
    "text_encoder": ("visual.deepstack_merger_list.0.norm.weight", "model.embed_tokens.weight"),
    "vae": ("decoder.transformer_blocks.0.scale1", "encoder.conv_in.weight", "decoder.x_embedder.weight"),
    "audio_vae": ("pre_block.attn.zero_k_bias",),
}
# ... and keys that say it is a diffusers-layout file instead (a shard of a folder picked as a single file).
_DIFFUSERS_SIGNS = ("transformer_blocks.0.attn.to_q.weight", "model.language_model.embed_tokens.weight",
                    "decoder.proj_in.weight", "encoder.block.0.weight_v")


def native_kind(keys) -> str | None:
    """"transformer" / "text_encoder" / "vae" / "audio_vae" for a native file's keys (prefix stripped), or None."""
    keys = set(keys)
    for kind, signs in _SIGNATURES.items():
        if all(s in keys for s in signs):
            return kind
    return None


def _open(path, kind: str) -> NativeFile:
    nf = NativeFile(path, NATIVE_PREFIXES[kind])
    found = native_kind(nf.keys)
    if found != kind:
        if found is not None:
            raise CheckpointError(f"{nf.path} is a native MiniMax-H3 {KINDS[found]} file, not a {KINDS[kind]}: pick "
                                  f"it for the {found} input.")
        if any(k in nf.keys for k in _DIFFUSERS_SIGNS):
            raise CheckpointError(f"{nf.path} is a diffusers-layout weight file, not a ComfyUI single file: pick the "
                                  "diffusers folder it belongs to as the model instead.")
        raise CheckpointError(f"{nf.path} is not a native MiniMax-H3 {KINDS[kind]} file (none of its keys are; "
                              f"first keys: {_first(nf.keys, 3)}).")
    nf.require_supported()
    return nf


def check_native_file(path, kind: str) -> None:
    """The file is a native `kind` file (header only; the keys against the config are checked at load)."""
    _open(path, kind).close()


def native_file_kind(path) -> str | None:
    """What a safetensors file is, as a native MiniMax-H3 component (header only), or None for a readable file that
    is none; a file that cannot be read (a damaged or crafted header) is the CheckpointError its load would give."""
    with NativeFile(path) as nf:
        keys = nf.keys
        for kind, prefixes in NATIVE_PREFIXES.items():
            for prefix in prefixes:
                if keys and all(k.startswith(prefix) for k in keys):
                    keys = {k[len(prefix):] for k in keys}
                    break
        return native_kind(keys)


def native_heads(path) -> int:
    """The attention heads of a native DiT file (header only)."""
    with _open(path, "transformer") as nf:
        missing = [k for k in ("blocks.0.attn.qkv_proj.weight", "blocks.0.attn.q_norm.weight") if k not in nf.keys]
        if missing:
            raise CheckpointError(f"{nf.path} is missing DiT weights (a partial or damaged file?): {_first(missing)}")
        return nf.shape("blocks.0.attn.qkv_proj.weight")[0] // (3 * nf.shape("blocks.0.attn.q_norm.weight")[0])


def _check_keys(nf: NativeFile, km: KeyMap, expected: Mapping[str, tuple], what: str, config: str) -> None:
    unexpected = nf.keys - km.native_keys()
    if unexpected:
        raise CheckpointError(f"{nf.path} holds keys a native MiniMax-H3 {what} does not have (or not with "
                              f"{config}): {_first(unexpected)}")
    missing = km.required_native_keys() - nf.keys
    if missing:
        raise CheckpointError(f"{nf.path} is missing {what} weights (a partial or damaged file?): {_first(missing)}")
    bad = [f"{k} {nf.shape(k)} vs {tuple(expected[k])}" for k in sorted(expected)
           if k in nf.keys and nf.shape(k) != tuple(expected[k])]
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        raise CheckpointError(f"{nf.path} does not match {config} (stored shape vs the config's): "
                              f"{'; '.join(bad[:3])}{more}")


def _count(keys, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in keys for m in [pattern.match(k)] if m}
    return max(found) + 1 if found else 0


# A pruned DiT's curve table and AdaLN projections (the block's, the output norm's): float32 whatever the engine's
# dtype, as ComfyUI builds them in that form (adaln_dtype float32); they are a few MB.
def _curve_fp32(key: str) -> bool:
    return key == "adaln_t_table" or key.startswith("norm_out.linear.") or ".adaln_proj.linear." in key


# -- the DiT -----------------------------------------------------------------------------------------------------------

def transformer_config_from_native(nf: NativeFile, base, config_name: str = "the release's DiT config"):
    """The file's H3TransformerConfig: widths and depths read off its shapes (as ComfyUI's detection does), which
    must be `base`'s (the folder's config, or the release's; a file with fewer blocks is another model, or a cut
    one); the values shapes do not carry (rotary theta, epsilons, patch) are `base`'s."""
    pruned = "adaln_t_table" in nf.keys
    embedder = (("blocks.0.adaln_proj.linear.weight",) if pruned
                else ("time_embedder.proj_in.weight", "time_embedder.proj_out.weight"))
    needed = ("video_patch_proj.weight", "final_layer.video_out.weight", "final_layer.audio_out.weight",
              "blocks.0.attn.q_norm.weight", "blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.fc1.weight",
              "condition_proj.weight", "rope.inv_freq") + embedder
    missing = [k for k in needed if k not in nf.keys]
    if missing:
        raise CheckpointError(f"{nf.path} is missing DiT weights (a partial or damaged file?): {_first(missing)}")
    s = nf.shape
    patch = base.patch_size[0] * base.patch_size[1] * base.patch_size[2]
    hidden, video_in = s("video_patch_proj.weight")
    if s("final_layer.video_out.weight")[0] != video_in:
        raise CheckpointError(f"{nf.path}: final_layer.video_out has {s('final_layer.video_out.weight')[0]} rows "
                              f"for {video_in}-wide patches (a bank of several output heads): not supported.")
    head_dim = s("blocks.0.attn.q_norm.weight")[0]
    found = dict(
        num_layers=_count(nf.keys, "blocks."), num_refiner_layers=_count(nf.keys, "token_refiner.blocks."),
        hidden_size=hidden, in_channels=video_in // patch, audio_in_channels=s("final_layer.audio_out.weight")[0],
        attention_head_dim=head_dim, num_attention_heads=s("blocks.0.attn.qkv_proj.weight")[0] // (3 * head_dim),
        ffn_dim=s("blocks.0.mlp.fc1.weight")[0] // 2, text_dim=s("condition_proj.weight")[1],
        rope_freq_dim=s("rope.inv_freq")[0])
    curve = {}
    if pruned:  # the curve's grid and width are the file's own (1025 x 8 in Comfy-Org's); the embedder is gone
        curve = _curve_shape(nf)
    else:
        found.update(freq_dim=s("time_embedder.proj_in.weight")[1],
                     time_embed_hidden_dim=s("time_embedder.proj_in.weight")[0],
                     time_embed_dim=s("time_embedder.proj_out.weight")[0])
    differ = [f"{k} {v} (file) vs {getattr(base, k)}" for k, v in found.items() if v != getattr(base, k)]
    if differ:
        more = f" (+{len(differ) - 3} more)" if len(differ) > 3 else ""
        raise CheckpointError(f"{nf.path} does not match {config_name}: {'; '.join(differ[:3])}{more}")
    return replace(base, **found, **curve)


def _curve_shape(nf: NativeFile) -> dict:
    """A pruned file's adaln_t_table: [grid >= 2, width], its width the AdaLN projections' input width (ComfyUI
    reads both off the table: model_detection.py, adaln_curve_grid / time_embed_dim)."""
    table = nf.shape("adaln_t_table")
    width = nf.shape("blocks.0.adaln_proj.linear.weight")
    if len(table) != 2 or table[0] < 2 or len(width) != 2 or table[1] != width[1]:
        raise CheckpointError(f"{nf.path}: adaln_t_table has shape {table}; a pruned DiT's curve table is [grid >= 2, "
                              f"width] with the width its AdaLN projections take (blocks.0.adaln_proj.linear.weight "
                              f"is {width}): a damaged or different file.")
    return dict(adaln_curve_grid=table[0], time_embed_dim=table[1])


def _check_rope(nf: NativeFile, cfg) -> None:
    """The file's rotary frequencies are the ones our config computes (to the precision they were stored in)."""
    from .h3_ops import rope_inv_freq

    stored = nf.get("rope.inv_freq")
    ours = rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta)
    tol = torch.finfo(stored.dtype).eps if stored.dtype.is_floating_point else 0.0
    if stored.shape != ours.shape or not torch.allclose(stored.float(), ours, rtol=2 * tol, atol=0.0):
        raise CheckpointError(f"{nf.path}: rope.inv_freq is not the rotary frequencies of rope_theta "
                              f"{cfg.rope_theta:g} / {cfg.rope_freq_dim} per axis: a different model.")


def load_native_transformer(path, base_config: str | os.PathLike | None = None, device="cpu",
                            dtype: torch.dtype | None = None, attention="sdpa", fuse: bool = True,
                            storage: str = "compute", adapter=None, loras=()):
    """Our H3Transformer from a native DiT file (bf16/fp16/fp32, or FP8 dequantised per tensor as it loads).
    `base_config`: a transformer config.json for what shapes do not say (None: the release's values). The rest as
    h3_transformer.load_h3_transformer."""
    from .h3_transformer import (FP32_MODULE_PREFIXES, H3Transformer, H3TransformerConfig, check_storage,
                                 finish_loading)

    check_storage(storage, device)
    base = H3TransformerConfig.from_json(base_config) if base_config else H3TransformerConfig()
    with _open(path, "transformer") as nf:
        cfg = transformer_config_from_native(nf, base, str(base_config) if base_config else
                                             "the released MiniMax-H3 DiT (give the diffusers folder it belongs to)")
        if cfg.adaln_curve_grid and adapter is not None:
            raise CheckpointError(f"{nf.path} is a pruned native DiT (no time embedder, AdaLN over a curve table): a "
                                  "FastH3 adapter is made for the full DiT; pick the non-pruned bf16 file for it.")
        with reading(nf.path), torch.device("meta"):
            model = H3Transformer(cfg, attention)
        ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        km = transformer_map(ours)
        _check_keys(nf, km, km.native_shapes(ours), "DiT", "the DiT its shapes describe")
        _check_rope(nf, cfg)

        quantised = set(nf.quantised())
        dequantised = {o for link in km.links if link.native in quantised for o in link.ours}

        def dtype_for(key: str, stored: torch.dtype) -> torch.dtype:
            if cfg.adaln_curve_grid and _curve_fp32(key):  # float32, as ComfyUI's curve form runs them
                return torch.float32
            if dtype is None:  # as stored; an FP8 weight as bfloat16, what it was quantised from
                return torch.bfloat16 if key in dequantised else stored
            return torch.float32 if key.startswith(FP32_MODULE_PREFIXES) else dtype

        finite = FiniteCheck(nf.path)  # NaN / Inf named by their native keys, checked on `device`

        def read(k: str) -> torch.Tensor:  # FP8 dequantised in float32, cast once to the target below
            return finite.add(k, nf.get(k, torch.float32 if k in quantised else None, device))

        state = {key: aligned(t.to(dtype_for(key, t.dtype))) for key, t in km.from_native(read)}
        finite.verify()
        model.load_state_dict(state, strict=True, assign=True)
    del state
    return finish_loading(model, cfg, device, fuse=fuse, storage=storage, adapter=adapter, loras=loras)


# -- the text encoder --------------------------------------------------------------------------------------------------

def load_native_text_encoder(path, config_folder: str | os.PathLike, dtype: torch.dtype, layers: int):
    """Qwen3VLForConditionalGeneration with `layers` decoder layers from a native conditioner file, its final norm
    and LM head the identity (H3 reads the un-normalised hidden state after layer `layers`), exactly as
    components.load_text_encoder makes it from a folder. `config_folder`: the text_encoder/ folder with config.json."""
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    config_folder = Path(config_folder)
    with reading(config_folder / "config.json"):
        config = AutoConfig.from_pretrained(config_folder)
    if config.text_config.num_hidden_layers < layers:
        raise CheckpointError(f"MiniMax-H3 reads hidden_states[{layers}] of Qwen3-VL; {config_folder / 'config.json'} "
                              f"has only {config.text_config.num_hidden_layers} decoder layers.")
    config.text_config.num_hidden_layers = layers
    with _open(path, "text_encoder") as nf:
        ours = meta_shapes(lambda: Qwen3VLForConditionalGeneration._from_config(config))
        km = text_encoder_map(ours, layers)
        _check_keys(nf, km, km.native_shapes(ours), "text encoder", str(config_folder / "config.json"))
        finite = FiniteCheck(nf.path)
        state = dict(km.from_native(lambda k: finite.add(k, nf.get(k, None))))
        finite.verify()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the final norm and LM head are not in the file on purpose: checked below
    try:
        with reading(path):
            model, info = Qwen3VLForConditionalGeneration.from_pretrained(
                None, config=config, state_dict=state, dtype=dtype, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    bad = [k for k in info.get("missing_keys", ()) if k not in km.dropped]
    bad += list(info.get("unexpected_keys", ())) + [str(k) for k in info.get("mismatched_keys", ())]
    if bad:
        raise CheckpointError(f"{path}: the text encoder did not load whole ({_first(bad)})")
    model.model.language_model.norm = torch.nn.Identity()
    model.lm_head = torch.nn.Identity()
    return model


# -- the VAEs ----------------------------------------------------------------------------------------------------------

def fold_weight_norm(module: torch.nn.Module) -> torch.nn.Module:
    """Replace every (old-style) weight norm of `module` by the plain weight it computes (what the native audio VAE
    file stores); the forward is unchanged."""
    from torch.nn.utils.weight_norm import WeightNorm

    for sub in module.modules():
        for hook in list(sub._forward_pre_hooks.values()):
            if isinstance(hook, WeightNorm):
                torch.nn.utils.remove_weight_norm(sub, hook.name)
    return module


def _fp32_kept(cls, key: str) -> bool:
    keep = getattr(cls, "_keep_in_fp32_modules", None) or ()
    return any(m in key.split(".") for m in keep)


def _load_vae(cls, path, kind: str, config_folder, dtype: torch.dtype, make_map: Callable[[dict, dict], KeyMap],
              fold: bool, stats_required: bool):
    import accelerate

    config_folder = Path(config_folder)
    with reading(config_folder / "config.json"):
        config = dict(cls.load_config(config_folder))
    with _open(path, kind) as nf:
        finite = FiniteCheck(nf.path)
        channels = config.get("latent_channels", 24)
        for name in ("latents_mean", "latents_std"):
            if name in nf.keys:
                if nf.shape(name) != (channels,):
                    raise CheckpointError(f"{nf.path}: {name} has shape {nf.shape(name)}, the config's "
                                          f"{channels} latent channels need ({channels},).")
                config[name] = finite.add(name, nf.get(name, torch.float32)).tolist()
            elif stats_required:
                raise CheckpointError(f"{nf.path} is missing {name} (the latent normalisation the native "
                                      f"{KINDS[kind]} file carries): a partial or damaged file?")
        with reading(config_folder / "config.json"), accelerate.init_empty_weights():
            model = cls.from_config(config)
        if fold:
            fold_weight_norm(model)
        ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        km = make_map(ours, config)
        expected = km.native_shapes(ours)
        if "decoder.mask_token" in km.extras:
            expected["decoder.mask_token"] = (1, 1, ours["decoder.proj_in.weight"][0])
        _check_keys(nf, km, expected, KINDS[kind], str(config_folder / "config.json"))

        def target(key: str, stored: torch.dtype) -> torch.dtype:
            if not stored.is_floating_point:
                return stored
            return torch.float32 if dtype != torch.float32 and _fp32_kept(cls, key) else dtype

        state = {k: aligned(t.to(target(k, t.dtype)))
                 for k, t in km.from_native(lambda k: finite.add(k, nf.get(k, None)))}
        finite.verify()
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def load_native_vae(path, config_folder, dtype: torch.dtype = torch.float32):
    """AutoencoderKLMiniMaxH3 from a native video VAE file; its latent normalisation is the file's when it carries
    one, else the config's."""
    from diffusers import AutoencoderKLMiniMaxH3

    return _load_vae(AutoencoderKLMiniMaxH3, path, "vae", config_folder, dtype,
                     lambda ours, cfg: video_vae_map(ours, int(cfg.get("decoder_num_attention_heads", 32))),
                     fold=False, stats_required=False)


def load_native_audio_vae(path, config_folder, dtype: torch.dtype = torch.float32):
    """AutoencoderKLMiniMaxH3Audio (weight norms folded, as the file stores them) from a native audio VAE file; its
    latent normalisation is the file's."""
    import warnings

    from diffusers import AutoencoderKLMiniMaxH3Audio

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
        return _load_vae(AutoencoderKLMiniMaxH3Audio, path, "audio_vae", config_folder, dtype,
                         lambda ours, cfg: audio_vae_map(ours), fold=True, stats_required=True)
