"""SeedVR2 release files: which DiT a file holds (from its safetensors header alone), the strict load of a DiT or VAE
file, and the fixed text embedding.

Release layout (one folder, ComfyUI's `models/SEEDVR2/` by the popular pack's convention):
- DiT: `seedvr2_ema_3b_fp16.safetensors`, `seedvr2_ema_7b_fp16.safetensors`, `seedvr2_ema_7b_sharp_fp16.safetensors`,
  and fp8 e4m3fn variants with the same keys (the 7B "mixed" file keeps block 35 in fp16): every tensor is cast to
  the compute dtype at load, by its own stored dtype, never one dtype assumed per file.
- VAE: `ema_vae_fp16.safetensors`.
- Text: the prompt embedding the release ships as a pickle `pos_emb.pt` (a plain [58, 5120] tensor). It is read only
  with `torch.load(weights_only=True)`, checked to be one floating tensor of that width, and written once as
  `pos_emb.safetensors` beside it (when the folder is writable) so later loads are safetensors only.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..checkpoint import CheckpointError, load_into, meta_shapes, reading, stored_shapes

TEXT_WIDTH = 5120
TEXT_NAMES = ("pos_emb.safetensors", "pos_emb.pt")
VARIANTS = ("3b", "7b")


def header_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """key -> shape of a single safetensors file, from its header only (a truncated file or a corrupt header is a
    CheckpointError naming it)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Model file not found: {path}")
    return {k: shape for k, (_, shape) in stored_shapes(path).items()}


def dit_variant(shapes: dict[str, tuple[int, ...]], path: str | os.PathLike) -> str:
    """'3b' (shared `.all.` layers, an output RMSNorm) or '7b' (separate streams, biased GELU MLP)."""
    if "vid_out_norm.weight" in shapes or any(".all." in k for k in shapes):
        return "3b"
    if any(k.endswith(".mlp.vid.proj_in.bias") for k in shapes):
        return "7b"
    if "vae" in Path(path).name.lower() or any(k.startswith(("encoder.", "decoder.")) for k in shapes):
        raise CheckpointError(f"{path} is a VAE, not a SeedVR2 DiT: choose it as the VAE.")
    raise CheckpointError(f"{path} is not a SeedVR2 DiT checkpoint (no 3B or 7B block keys in its header).")


def dit_config_from_header(shapes: dict[str, tuple[int, ...]], path: str | os.PathLike):
    """The DiTConfig a file's tensors describe (released or tiny widths alike): width, heads, depth, shared layers,
    MLP hidden size all read off the shapes."""
    from .dit_config import DiTConfig

    variant = dit_variant(shapes, path)
    try:
        dim = shapes["vid_in.proj.weight"][0]
        blocks = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("blocks.")})
        layers = blocks[-1] + 1
        stream = "vid" if f"blocks.0.attn.proj_qkv.vid.weight" in shapes else "all"
        head_dim = shapes[f"blocks.0.attn.norm_q.{stream}.weight"][0]
        heads = shapes[f"blocks.0.attn.proj_qkv.{stream}.weight"][0] // (3 * head_dim)
        if variant == "3b":
            shared = [n for n in blocks if f"blocks.{n}.attn.proj_qkv.all.weight" in shapes]
            mm_layers = shared[0] if shared else layers
            hidden = shapes[f"blocks.{layers - 1}.mlp.all.proj_in.weight"][0] if shared else \
                shapes[f"blocks.0.mlp.vid.proj_in.weight"][0]
        else:
            mm_layers = layers
            hidden = shapes["blocks.0.mlp.vid.proj_in.weight"][0]
        txt_dim = shapes["txt_in.weight"][1]
    except (KeyError, IndexError) as exc:
        raise CheckpointError(f"{path} lacks the SeedVR2 {variant.upper()} tensor {exc}; the file is incomplete.") \
            from exc
    if set(blocks) != set(range(layers)):
        raise CheckpointError(f"{path} lacks blocks {sorted(set(range(layers)) - set(blocks))[:5]}; incomplete file.")
    return replace(DiTConfig.released(variant), dim=dim, heads=heads, head_dim=head_dim, layers=layers,
                   mm_layers=mm_layers, mlp_hidden=hidden, txt_dim=txt_dim,
                   rope_dim=head_dim if variant == "3b" else head_dim // 2)  # as the official configs tie them


def _floating(key: str, stored: torch.dtype, compute: torch.dtype) -> torch.dtype:
    # Every floating tensor (fp32, fp16, bf16, fp8 e4m3fn/e5m2) lands in the compute dtype; a plain per-tensor cast
    # is the whole dequantisation of the released fp8 files (they carry no scale tensors).
    return compute if stored.is_floating_point else stored


# A block's GEMM weight (attention qkv / out, MLP; any stream): what FP8 storage holds as float8 e4m3.
GEMM_WEIGHT = re.compile(r"^blocks\.\d+\.(attn\.proj_qkv|attn\.proj_out|mlp)\..*weight$")


def load_dit(path: str | os.PathLike, device: torch.device | str, dtype: torch.dtype, expect: str = "auto",
             keep_fp8: bool = False):
    """The DiT of a release file, strictly (every key, every shape), on `device` in `dtype`. `expect`: '3b'/'7b'
    refuses the other variant with a message naming both; 'auto' takes what the file holds. `keep_fp8`: the
    blocks' GEMM weights a file stores as float8 e4m3 stay so (FP8 storage takes them with scale 1, dit.py's
    use_fp8_gemms) instead of being cast to `dtype`."""
    from .dit import SeedVR2DiT, StoredRopeError

    shapes = header_shapes(path)
    config = dit_config_from_header(shapes, path)
    if expect != "auto" and config.variant != expect:
        raise CheckpointError(f"{path} holds a SeedVR2 {config.variant.upper()} DiT, but the {expect.upper()} model "
                              f"was chosen: pick a {expect.upper()} file or the {config.variant.upper()} model.")
    with torch.device("meta"):
        model = SeedVR2DiT(config)
    # RoPE buffers stay as stored: the model checks them at their own precision and keeps float32 (dit.py).
    def keep(key: str, stored: torch.dtype) -> torch.dtype:
        if key.endswith(".rope.rope.freqs") or (keep_fp8 and stored == torch.float8_e4m3fn and GEMM_WEIGHT.match(key)):
            return stored
        return _floating(key, stored, dtype)

    try:
        load_into(model, path, device="cpu", dtype_for=keep)
    except StoredRopeError as e:
        raise CheckpointError(f"{path}: {e}.") from None
    return _materialised(model, path).to(device=device).eval().requires_grad_(False)


def load_vae(path: str | os.PathLike, device: torch.device | str, dtype: torch.dtype):
    """The video VAE of a release file, strictly, on `device` in `dtype`."""
    from .vae import SeedVR2VAE

    stored = header_shapes(path)
    if not any(k.startswith("encoder.") for k in stored) or not any(k.startswith("decoder.") for k in stored):
        raise CheckpointError(f"{path} is not a SeedVR2 VAE checkpoint (no encoder./decoder. tensors).")
    renamed = _vae_names(stored)
    config = vae_config_from_header({renamed[k]: v for k, v in stored.items()}, path)
    with torch.device("meta"):
        model = SeedVR2VAE(config)
    # A conversion with diffusers' older attention names holds the same tensors renamed: the same strict load (dtype,
    # shape and NaN checks) reads it.
    load_into(model, path, device="cpu", dtype_for=lambda k, d: _floating(k, d, dtype), rename=renamed.__getitem__)
    return _materialised(model, path).to(device=device).eval().requires_grad_(False)


def _vae_names(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """stored key -> our key: the mid-block attention's older diffusers names (query/key/value/proj_attn) map to
    to_q/to_k/to_v/to_out.0; everything else is unchanged."""
    from .vae import rename_legacy_keys

    keys = list(shapes)
    return dict(zip(keys, rename_legacy_keys(dict.fromkeys(keys, None)).keys()))


def vae_config_from_header(shapes: dict[str, tuple[int, ...]], path: str | os.PathLike):
    """The released VAE, or the package's tiny one, whichever the file's tensors are exactly (keys and shapes)."""
    from .vae import SeedVR2VAE, VAEConfig

    for config in (VAEConfig.released(), VAEConfig.tiny()):
        if meta_shapes(lambda: SeedVR2VAE(config)) == shapes:
            return config
    want = meta_shapes(lambda: SeedVR2VAE(VAEConfig.released()))
    missing, extra = sorted(set(want) - set(shapes)), sorted(set(shapes) - set(want))
    wrong = sorted(k for k in set(want) & set(shapes) if want[k] != shapes[k])
    detail = (f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}" if extra else
              f"{wrong[0]} is {shapes[wrong[0]]}, expected {want[wrong[0]]}" if wrong else "")
    raise CheckpointError(f"{path} does not match the SeedVR2 VAE ({detail}).")


def _materialised(model: torch.nn.Module, path) -> torch.nn.Module:
    """A module built on the meta device after the strict load: nothing may remain on meta."""
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"{path} left {left[:3]} unloaded; the file does not fit this model.")
    return model


def find_text_embedding(folders: Iterable[str | os.PathLike]) -> Path | None:
    """The text embedding of the first of `folders` that holds one (:func:`text_embedding_in`)."""
    for folder in folders:
        found = text_embedding_in(folder)
        if found is not None:
            return found
    return None


def text_embedding_in(folder: str | os.PathLike) -> Path | None:
    """`pos_emb.safetensors` (preferred) or `pos_emb.pt` in `folder`. A safetensors copy this package wrote records
    the sha256 of the pickle it came from: when the `pos_emb.pt` beside it is another file now (replaced, or the copy
    came from elsewhere), the pickle is the source and the stale copy is passed over. A user's own safetensors (no
    such record) is always taken."""
    copy, pickle = Path(folder) / TEXT_NAMES[0], Path(folder) / TEXT_NAMES[1]
    if copy.is_file():
        made_from = _copy_source(copy)
        if made_from is None or not pickle.is_file() or made_from == _sha256(pickle):
            return copy
    return pickle if pickle.is_file() else None


_SOURCE_KEY = "comfyui_h3.source_sha256"


def _copy_source(path: Path) -> str | None:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return (handle.metadata() or {}).get(_SOURCE_KEY)
    except Exception:  # noqa: BLE001 - a damaged copy is the loader's to report, naming it
        return None


def _sha256(path: Path) -> str | None:
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def load_text_embedding(path: str | os.PathLike, copy_to: str | os.PathLike | None = None,
                        width: int | None = None) -> torch.Tensor:
    """The fixed prompt embedding [L, width] (float32, CPU); `width`: the DiT's `txt_dim` (5120 for the released
    models), checked here so a wrong file fails before any video work. A `.pt` is read as one plain tensor with
    `weights_only=True` (no code runs); `copy_to` (a model folder the user chose, never another pack's install): once
    the tensor passed every check, written there as `pos_emb.safetensors` when none is there, so later loads are
    safetensors only."""
    path = Path(path)
    if path.suffix == ".safetensors":
        with reading(path), safe_open(str(path), framework="pt", device="cpu") as handle:
            keys = list(handle.keys())
            if keys != ["pos_emb"]:
                raise CheckpointError(f"{path} should hold one tensor 'pos_emb', holds {keys[:5]}")
            tensor = handle.get_tensor("pos_emb")
    else:
        try:
            tensor = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle_errors() as exc:
            raise CheckpointError(f"Cannot read {path}: it is not a plain tensor file (torch.load with weights_only "
                                  f"refused it: {_first_line(exc)}); use the release's pos_emb.pt.") from None
        except OSError as exc:
            raise CheckpointError(f"Cannot read {path}: {exc}") from None
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{path} does not hold a plain tensor (found {type(tensor).__name__}).")
    if tensor.dim() != 2 or not tensor.is_floating_point() or tensor.shape[0] < 1:
        raise CheckpointError(f"{path}: the text embedding must be a [tokens, width] float tensor, got "
                              f"{tuple(tensor.shape)} {tensor.dtype}.")
    if width is not None and tensor.shape[1] != width:
        raise CheckpointError(f"{path}: the text embedding is {tuple(tensor.shape)}, the chosen DiT takes "
                              f"[tokens, {width}]: use the pos_emb.pt of the same SeedVR2 release.")
    if not torch.isfinite(tensor).all():
        raise CheckpointError(f"{path}: the text embedding holds NaN or infinite values.")
    if path.suffix != ".safetensors" and copy_to is not None:
        _write_safetensors_copy(Path(copy_to) / TEXT_NAMES[0], tensor, _sha256(path))
    return tensor.float()


def pickle_errors() -> tuple[type[BaseException], ...]:
    import pickle

    return (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError, ImportError)


def _first_line(exc: BaseException) -> str:
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()  # torch colours its weights_only hints
    return (text[0] if text else type(exc).__name__).rstrip(". ")


def _write_safetensors_copy(target: Path, tensor: torch.Tensor, source_sha256: str | None) -> None:
    if target.exists():  # a user's own file, or the copy made before: never overwritten
        return
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    metadata = {_SOURCE_KEY: source_sha256} if source_sha256 else None
    try:
        save_file({"pos_emb": tensor.contiguous()}, str(partial), metadata=metadata)
        os.replace(partial, target)  # published whole or not at all
    except OSError:  # a read-only model folder: the .pt stays the source, read again next time
        try:
            partial.unlink()
        except OSError:
            pass
