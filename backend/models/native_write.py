"""Writing ComfyUI's native MiniMax-H3 single-file layout from a diffusers folder (the inverse of native_load.py,
through the same key maps). The tests make the native layout of the tiny set with it; it also turns a diffusers
folder into files ComfyUI's own loaders take. Never over an existing file: written beside and renamed into place.

FP8 (the DiT only; the native loader's formats, see native_file.py): every 2-D weight of the blocks and the token
refiner stored as float8_e4m3fn with one float32 scale per tensor (amax / 448), as `comfy_quant` (per-layer JSON +
`weight_scale`, ComfyUI's current format), `scaled` (the older `scaled_fp8` marker + `scale_weight`) or `plain` (FP8
weights, no scale).

Pruned DiT (ComfyUI's "curve form", `minimax_h3_*_pruned_*`; read in comfy/ldm/minimax/model.py and
model_detection.py): no `time_embedder.*`; a float32 buffer `adaln_t_table` [grid, width]; every AdaLN projection
(`blocks.N.adaln_proj.linear`, `final_layer.adaln_proj.linear`) takes `width` inputs and is applied WITHOUT silu to
the table's rows interpolated at t (h3_transformer.curve_rows: grid point g is t = g / (grid - 1)). The file is the
same function sampled: with g(t) = silu(time_embedder(t)) [D] and G = g at the grid points, either
- width = D (rank None): adaln_t_table = G, projections unchanged: at grid points the modulation is the full DiT's
  exactly (to float rounding), between them the linear blend of the two neighbours'; or
- width = r < D (Comfy-Org's files: [1025, 8]): with mean m of G's rows and V [D, r] the leading right singular
  vectors of G - m: adaln_t_table = (G - m) V, weight' = weight V, bias' = bias + weight m (float32), exact up to the
  rank-r truncation (the time curve is smooth, so a small r keeps it closely).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .checkpoint import find_shards, read_json, reading
from .native_keys import audio_vae_map, text_encoder_map, transformer_map, video_vae_map

FP8_LAYOUTS = ("comfy_quant", "scaled", "plain")
_FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _stored(folder) -> dict[str, torch.Tensor]:
    out = {}
    for shard in find_shards(folder):
        with reading(shard), safe_open(str(shard), framework="pt", device="cpu") as handle:
            out.update({k: handle.get_tensor(k) for k in handle.keys()})
    return out


def _save(tensors: dict[str, torch.Tensor], out, metadata: dict | None = None) -> Path:
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; not overwriting it.")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp's file is owner-only; this is an ordinary model file
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _quantise(native: dict[str, torch.Tensor], layout: str) -> tuple[dict[str, torch.Tensor], dict | None]:
    out, metadata = {}, None
    if layout == "scaled":
        out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    for key, tensor in native.items():
        layer = key[: -len(".weight")]
        if not (key.endswith(".weight") and tensor.ndim == 2 and key.startswith(("blocks.", "token_refiner.blocks."))):
            out[key] = tensor
            continue
        w = tensor.float()
        scale = (w.abs().amax() / _FP8_MAX).clamp(min=1e-12) if layout != "plain" else torch.tensor(1.0)
        out[key] = (w / scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        if layout == "comfy_quant":
            out[f"{layer}.weight_scale"] = scale.float().reshape(())
            out[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()),
                                                      dtype=torch.uint8)
        elif layout == "scaled":
            out[f"{layer}.scale_weight"] = scale.float().reshape(())
    return out, metadata


def write_native_transformer(partition, out, fp8: str | None = None, prefix: str = "") -> Path:
    """A diffusers transformer partition folder -> one native DiT file (`fp8`: None, or one of FP8_LAYOUTS;
    `prefix`: e.g. "model.diffusion_model." as full ComfyUI checkpoints carry it)."""
    from .h3_ops import rope_inv_freq
    from .h3_transformer import H3TransformerConfig

    cfg = H3TransformerConfig.from_json(Path(partition) / "config.json")
    stored = _stored(partition)
    native = transformer_map(stored).to_native(stored)
    native["rope.inv_freq"] = rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta)
    return _save_dit(native, out, fp8, prefix)


def _save_dit(native: dict, out, fp8: str | None, prefix: str) -> Path:
    """A native DiT's tensors -> the file, quantised to the `fp8` layout when one is asked, keys under `prefix`."""
    metadata = None
    if fp8 is not None:
        if fp8 not in FP8_LAYOUTS:
            raise ValueError(f"fp8 layout must be one of {FP8_LAYOUTS}, got {fp8!r}.")
        native, metadata = _quantise(native, fp8)
    return _save({prefix + k: v for k, v in native.items()}, out, metadata)


def write_native_pruned_transformer(partition, out, grid: int = 1025, rank: int | None = None,
                                    fp8: str | None = None, prefix: str = "") -> Path:
    """A diffusers transformer partition folder -> a pruned ("curve form") native DiT file sampling its time
    embedder and AdaLN projections at `grid` points of t in [0, 1] (module docstring). `rank` None keeps the full
    width (exact at the grid points); `fp8` / `prefix` as write_native_transformer."""
    from .h3_ops import rope_inv_freq
    from .h3_transformer import load_h3_transformer

    if grid < 2:
        raise ValueError(f"a curve table needs at least 2 grid points, got {grid}.")
    dit = load_h3_transformer(partition, fuse=False)
    cfg = dit.config
    t = (torch.arange(grid, dtype=torch.float64) / (grid - 1)).to(torch.float32)
    with torch.no_grad():
        curve = torch.nn.functional.silu(dit.time_embedding(t)).to(torch.float32)  # [grid, D]
    stored = {k: v for k, v in _stored(partition).items() if not k.startswith("time_embedder.")}
    native = transformer_map(stored).to_native(stored)
    native["rope.inv_freq"] = rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta)
    if rank is None or rank >= curve.shape[1]:
        native["adaln_t_table"] = curve
    else:
        mean = curve.mean(dim=0)
        basis = torch.linalg.svd((curve - mean).double(), full_matrices=False).Vh[:rank].T.to(torch.float32)
        native["adaln_t_table"] = ((curve - mean) @ basis).contiguous()
        for key in [k for k in native if k.endswith("adaln_proj.linear.weight")]:
            weight = native[key].to(torch.float32)
            bias_key = key[: -len("weight")] + "bias"
            native[bias_key] = native[bias_key].to(torch.float32) + weight @ mean
            native[key] = (weight @ basis).contiguous()
    return _save_dit(native, out, fp8, prefix)


def write_native_text_encoder(folder, out, layers: int) -> Path:
    """A diffusers text_encoder/ folder -> the native conditioner file (the first `layers` decoder layers, no final
    norm, no LM head)."""
    stored = _stored(folder)
    return _save(text_encoder_map(stored, layers).to_native(stored), out)


def write_native_vae(folder, out) -> Path:
    """A diffusers vae/ folder -> the native video VAE file (with its latent normalisation and the decoder's unused
    mask token, as the native module keeps them)."""
    config = read_json(Path(folder) / "config.json")
    stored = _stored(folder)
    native = video_vae_map(stored, int(config.get("decoder_num_attention_heads", 32))).to_native(stored)
    native["latents_mean"] = torch.tensor(config["latents_mean"], dtype=torch.float32)
    native["latents_std"] = torch.tensor(config["latents_std"], dtype=torch.float32)
    native["decoder.mask_token"] = torch.zeros(1, 1, stored["decoder.proj_in.weight"].shape[0])
    return _save(native, out)


def write_native_audio_vae(folder, out) -> Path:
    """A diffusers audio_vae/ folder -> the native audio VAE file: weight norms folded into plain weights (the
    function the weight-norm hook runs, so a native load decodes bit for bit as the folder does), plus the latent
    normalisation."""
    import warnings

    from diffusers import AutoencoderKLMiniMaxH3Audio

    from .native_load import fold_weight_norm

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
        with reading(folder):
            model = AutoencoderKLMiniMaxH3Audio.from_pretrained(folder, torch_dtype=torch.float32)
    fold_weight_norm(model)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    native = audio_vae_map(state).to_native(state)
    native["latents_mean"] = torch.tensor(model.config.latents_mean, dtype=torch.float32)
    native["latents_std"] = torch.tensor(model.config.latents_std, dtype=torch.float32)
    return _save(native, out)
