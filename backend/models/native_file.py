"""Reading a ComfyUI native single file: its keys with the checkpoint prefix stripped, its quantisation understood,
each tensor dequantised when it is read (one tensor at a time, so a 66 GB file never sits in memory twice).

Quantised formats ComfyUI's loader accepts and we read (comfy/utils.py convert_old_quants, comfy/ops.py):
- plain FP8 weights (float8_e4m3fn / float8_e5m2 tensors, no scale): value = weight;
- "scaled fp8" (the older format): a `scaled_fp8` marker tensor and per layer `<layer>.scale_weight` (and an ignored
  `<layer>.scale_input`): value = weight * scale_weight;
- the current format: per layer `<layer>.comfy_quant` (a uint8 tensor holding JSON `{"format": "float8_e4m3fn"}`) or
  the safetensors header's `_quantization_metadata` (`{"layers": {layer: {"format": ...}}}`), with
  `<layer>.weight_scale` (and an ignored `<layer>.input_scale`): value = weight * weight_scale.
Other formats the native loader knows (int8 / convrot, nvfp4, mxfp8, ...) are refused naming the format: they need
ComfyUI's own kernels to dequantise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors import safe_open

from .checkpoint import CheckpointError, _first, aligned, reading

FP8_FORMATS = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
FP8_DTYPES = tuple(FP8_FORMATS.values())
_SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
_IGNORED_SUFFIXES = (".scale_input", ".input_scale", ".comfy_quant")


class NativeFile:
    """An open native single file (a context manager). `keys`: the weight keys without prefix and without the
    quantisation's own tensors; `get(key, dtype)` reads one tensor, dequantised, in `dtype` (None: as stored, or
    bfloat16 for a quantised one)."""

    def __init__(self, path: str | os.PathLike, prefixes: Sequence[str] = ()):
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"Model file not found: {self.path}")
        if self.path.suffix != ".safetensors":
            raise CheckpointError(f"{self.path} is not a .safetensors file; only safetensors weights are loaded.")
        with reading(self.path):
            self._handle = safe_open(str(self.path), framework="pt", device="cpu")
            raw = list(self._handle.keys())
            self.metadata = self._handle.metadata() or {}
        self.prefix = _common_prefix(self.path, raw, prefixes)
        full = {k[len(self.prefix):]: k for k in raw}
        self._full = full
        self.scales: dict[str, str] = {}  # weight key -> its scale tensor's key
        self.formats: dict[str, str] = {}  # weight key -> quantisation format
        self.unsupported: str | None = None  # why the file cannot be dequantised here (require_supported)
        self._read_quantisation(full)
        aux = {k for k in full if k == "scaled_fp8" or k.endswith(_SCALE_SUFFIXES + _IGNORED_SUFFIXES)}
        self.keys: set[str] = set(full) - aux

    # -- quantisation --------------------------------------------------------------------------------------------------
    def _read_quantisation(self, full: dict[str, str]) -> None:
        layers = self._header_layers()
        for key in full:
            if key.endswith(".comfy_quant"):
                layers[key[: -len(".comfy_quant")]] = self._layer_conf(key, full[key])
        legacy = "scaled_fp8" in full
        for key in full:
            for suffix in _SCALE_SUFFIXES:
                if key.endswith(suffix):
                    layer = key[: -len(suffix)]
                    if legacy and layer not in layers:
                        layers[layer] = {"format": "float8_e4m3fn"}
                    self.scales[layer + ".weight"] = key
        for layer, conf in layers.items():
            fmt = conf.get("format")
            if not isinstance(fmt, str):  # ComfyUI's loader fails on such a layer too
                raise CheckpointError(f"{self.path}: the quantisation of layer {layer} names no format (its entry is "
                                      f"{json.dumps(conf)[:60]}): a damaged or crafted header.")
            if fmt not in FP8_FORMATS:
                self.unsupported = self.unsupported or (
                    f"{self.path} is quantised as {fmt!r} (layer {layer}): only bf16/fp16/fp32 and FP8 "
                    f"(float8_e4m3fn / float8_e5m2, scaled or not) native files can be read; pick the bf16 or "
                    f"fp8_scaled file of this model.")
                continue
            self.formats[layer + ".weight"] = fmt
        for weight, scale in self.scales.items():
            if weight not in self.formats and not self.unsupported:
                raise CheckpointError(f"{self.path}: {scale} scales a layer its quantisation metadata does not name.")
        self._check_stored_types(full, scaled=legacy or bool(layers))

    def _check_stored_types(self, full: dict[str, str], scaled: bool) -> None:
        """Every weight is stored as a float, or as FP8 its format names; in a scaled file (a `scaled_fp8` marker, or
        per-layer formats) every FP8 weight has its scale: FP8 values mean nothing without it, and a plain cast of
        an int8 weight invents values. Otherwise the file is unsupported (raised when it is loaded: it is listed)."""
        aux = {k for k in full if k == "scaled_fp8" or k.endswith(_SCALE_SUFFIXES + _IGNORED_SUFFIXES)}
        not_float, unscaled = [], []
        for key in sorted(set(full) - aux):
            stored = self._handle.get_slice(full[key]).get_dtype()
            fp8 = stored in ("F8_E4M3", "F8_E5M2") or (stored == "U8" and key in self.formats)
            if not fp8 and stored not in _FLOAT_STORAGE:
                not_float.append(f"{key} ({stored})")
            elif fp8 and scaled and key not in self.scales:
                unscaled.append(key)
        if not_float:
            self.unsupported = self.unsupported or (
                f"{self.path} stores weights as non-float types: {_first(not_float, 3)} (an integer quantisation "
                f"without ComfyUI's format metadata, or a damaged file): only bf16/fp16/fp32 and FP8 native files "
                f"can be read; pick the bf16 or fp8_scaled file of this model.")
        elif unscaled:
            self.unsupported = self.unsupported or (
                f"{self.path} is a scaled FP8 file whose FP8 weights lack their scale tensors (.weight_scale / "
                f".scale_weight): {_first(unscaled, 3)}; a partial or damaged file (download it again).")

    def _header_layers(self) -> dict[str, dict]:
        """The header's `_quantization_metadata`: {"layers": {layer: {"format": ...}}}; anything else there is a
        CheckpointError naming the file (a crafted header must not get further than that)."""
        raw = self.metadata.get("_quantization_metadata")
        if raw is None:
            return {}
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(f"{self.path}: unreadable _quantization_metadata in its header "
                                  f"({type(exc).__name__}).") from None
        layers = parsed.get("layers", {}) if isinstance(parsed, dict) else None
        if not isinstance(layers, dict) or not all(isinstance(v, dict) for v in layers.values()):
            raise CheckpointError(f"{self.path}: the _quantization_metadata in its header is not ComfyUI's "
                                  f"{{\"layers\": {{layer: {{\"format\": ...}}}}}} (it starts {raw[:60]!r}).")
        return dict(layers)

    def _layer_conf(self, key: str, stored: str) -> dict:
        """A `<layer>.comfy_quant` tensor: the UTF-8 bytes of a JSON object, {"format": ...}."""
        with reading(self.path):
            raw = self._handle.get_tensor(stored)
        try:
            if raw.dtype not in (torch.uint8, torch.int8) or raw.ndim != 1:
                raise ValueError(f"a {raw.ndim}-D {raw.dtype} tensor")
            conf = json.loads(raw.view(torch.uint8).numpy().tobytes().decode("utf-8"))
            if not isinstance(conf, dict):
                raise ValueError(f"JSON {type(conf).__name__}")
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise CheckpointError(f"{self.path}: {key} is not the JSON object ComfyUI writes there "
                                  f"({type(exc).__name__}: {str(exc)[:80]}).") from None
        return conf

    def require_supported(self) -> None:
        """Raise the CheckpointError of a quantisation this reader cannot dequantise (int8, nvfp4, ...)."""
        if self.unsupported:
            raise CheckpointError(self.unsupported)

    def quantised(self) -> dict[str, str]:
        """weight key -> format, for every quantised (or plainly FP8-stored) weight."""
        out = dict(self.formats)
        for key in self.keys - set(out):
            if self.dtype(key) in FP8_DTYPES:
                out[key] = "float8_e4m3fn" if self.dtype(key) == torch.float8_e4m3fn else "float8_e5m2"
        return out

    # -- reading -------------------------------------------------------------------------------------------------------
    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle.get_slice(self._full[key]).get_shape())

    def dtype(self, key: str) -> torch.dtype:
        name = self._handle.get_slice(self._full[key]).get_dtype()
        return _SAFETENSORS_DTYPES.get(name, torch.float32)

    def get(self, key: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        self.require_supported()
        if key not in self.keys:
            raise CheckpointError(f"{self.path} has no tensor {key}")
        with reading(self.path):
            tensor = self._handle.get_tensor(self._full[key]).to(device)
        fmt = self.formats.get(key)
        if fmt is not None or tensor.dtype in FP8_DTYPES:
            want = FP8_FORMATS.get(fmt, tensor.dtype)
            if tensor.dtype == torch.uint8:  # FP8 stored as bytes (older writers)
                tensor = tensor.view(want)
            if tensor.dtype not in FP8_DTYPES:
                raise CheckpointError(f"{self.path}: {key} is marked {fmt} but stored as {tensor.dtype}.")
            value = tensor.to(torch.float32)
            if key in self.scales:
                with reading(self.path):
                    scale = self._handle.get_tensor(self._full[self.scales[key]]).to(device)
                value = value * _broadcast_scale(self.path, key, _checked_scale(self.path, self.scales[key], scale),
                                                 value)
            return aligned(value.to(dtype or torch.bfloat16))
        return aligned(tensor if dtype is None else tensor.to(dtype))

    def close(self) -> None:
        self._handle = None

    def __enter__(self) -> "NativeFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_FLOAT_STORAGE = ("F64", "F32", "F16", "BF16")
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "U8": torch.uint8,
                       "I8": torch.int8, "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}


def _checked_scale(path: Path, key: str, scale: torch.Tensor) -> torch.Tensor:
    """A dequantisation scale as float32: stored as a float, every value finite and above 0 (a 0 or NaN scale
    zeroes or poisons its whole layer without any other error)."""
    if not scale.is_floating_point():
        raise CheckpointError(f"{path}: the scale {key} is stored as {str(scale.dtype).replace('torch.', '')}; "
                              "scales are floats (a damaged file?).")
    scale = scale.to(torch.float32)
    if not bool((torch.isfinite(scale) & (scale > 0)).all()):
        bad = scale.reshape(-1)[~(torch.isfinite(scale) & (scale > 0)).reshape(-1)][:3].tolist()
        raise CheckpointError(f"{path}: the scale {key} holds {', '.join(f'{v:g}' for v in bad)}; an FP8 scale is a "
                              "finite number above 0 (a damaged file: download it again).")
    return scale


def _broadcast_scale(path: Path, key: str, scale: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A per-tensor scale (one value) or a per-output-channel one (dim 0 of the weight)."""
    if scale.numel() == 1:
        return scale.reshape(())
    if scale.numel() == value.shape[0]:
        return scale.reshape((-1,) + (1,) * (value.ndim - 1))
    raise CheckpointError(f"{path}: the scale of {key} has {scale.numel()} values for a weight of shape "
                          f"{tuple(value.shape)} (one, or one per output channel, expected).")


def _common_prefix(path: Path, keys: Iterable[str], prefixes: Sequence[str]) -> str:
    """The checkpoint prefix every key carries (one of `prefixes`), or "": a file where only some keys carry it is
    refused (a mixed checkpoint holds other models' tensors)."""
    keys = list(keys)
    for prefix in prefixes:
        carrying = [k for k in keys if k.startswith(prefix)]
        if carrying and len(carrying) == len(keys):
            return prefix
        if carrying:
            others = [k for k in keys if not k.startswith(prefix)]
            raise CheckpointError(f"{path} mixes keys under {prefix!r} with others ({_first(others, 3)}): it holds "
                                  "more than one model; pick the component's own file.")
    return ""
