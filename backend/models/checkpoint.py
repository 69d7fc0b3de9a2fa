"""Strict safetensors loading for diffusers-layout model folders (single file or sharded with an index).

Every key of the module must come from the checkpoint with the right shape, and every checkpoint key must land in
the module: anything else is an error that names the file and the first offending keys. Weights are only ever read
with safetensors (never pickle). Every model file is opened under `reading`, ours and the libraries' loads alike, so
a missing, unreadable, corrupt or mismatched file is always a CheckpointError that names it.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch
from safetensors import safe_open

WEIGHT_STEMS = ("diffusion_pytorch_model", "model")


class CheckpointError(ValueError):
    """A model folder that cannot be loaded as-is: missing, corrupt, or not matching the architecture."""


def _first(keys: Iterable[str], n: int = 5) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def _line(exc: BaseException) -> str:
    """The first line of an exception's message (library errors run to pages), with its type when it says little."""
    text = str(exc).strip().splitlines()
    text = text[0] if text else ""
    return f"{type(exc).__name__}: {text}" if len(text) < 12 else text


def stored_shapes(folder: str | os.PathLike) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """key -> (file, shape) for every tensor of a component folder, from the safetensors headers only (a few KB per
    file, no tensor data). A truncated file or a corrupt header is a CheckpointError naming the file; so is a shard
    that lacks keys its index assigns to it."""
    out: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for shard, listed in find_shards(folder).items():
        with reading(shard):
            with safe_open(str(shard), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    out[key] = (shard, tuple(handle.get_slice(key).get_shape()))
        if listed is not None:
            absent = [k for k in listed if out.get(k, (None,))[0] != shard]
            if absent:
                raise CheckpointError(f"{shard} lacks keys its index assigns to it: {_first(absent)}")
    return out


def mismatch_report(expected: Mapping[str, Sequence[int]], stored: Mapping[str, tuple[Path, tuple[int, ...]]],
                    config: str | os.PathLike = "its config") -> str | None:
    """The first tensors whose stored shape differs from what the config builds, grouped by the file holding them
    (None when every shared key fits)."""
    bad: dict[Path, list[str]] = {}
    for key in sorted(set(expected) & set(stored)):
        shard, shape = stored[key]
        if tuple(shape) != tuple(expected[key]):
            bad.setdefault(shard, []).append(f"{key} {tuple(shape)} vs {tuple(expected[key])}")
    if not bad:
        return None
    shard, lines = next(iter(bad.items()))
    more = f" (+{len(lines) - 3} more)" if len(lines) > 3 else ""
    others = f"; also {_first(map(str, list(bad)[1:]), 2)}" if len(bad) > 1 else ""
    return (f"{shard} does not match {config} (stored shape vs the config's): {'; '.join(lines[:3])}{more}"
            f"{others}")


@contextmanager
def reading(path: str | os.PathLike, expected: Callable[[], Mapping[str, Sequence[int]]] | None = None,
            config: str | os.PathLike | None = None) -> Iterator[None]:
    """Run a read of a model file or component folder; whatever fails in it (bad JSON, a corrupt or truncated
    safetensors, an OSError, tensors that do not fit the config, a library's own load error) leaves as one
    CheckpointError naming the file and, for a mismatch, the first bad keys.

    For a folder, `expected()` (key -> shape the config builds, e.g. the module built on the meta device) is asked
    only after a failure, to name the mismatched tensors and their file; `config` is the file that made them.
    Out-of-memory passes through untouched: it is not a fault of the file."""
    try:
        yield
    except (CheckpointError, MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:
        path = Path(path)
        if path.is_dir():
            stored = stored_shapes(path)  # a corrupt or truncated shard raises here, naming itself
            if expected is not None:
                try:
                    shapes = expected()
                except Exception:  # the diagnosis is best effort: the generic message below still names the folder
                    shapes = None
                report = shapes and mismatch_report(shapes, stored, config or path / "config.json")
                if report:
                    raise CheckpointError(report) from exc
        hint = " (the file is damaged or incomplete: download it again)" if "Safetensor" in type(exc).__name__ else ""
        verb = "load" if path.is_dir() else "read"
        raise CheckpointError(f"Cannot {verb} {path}: {_line(exc)}{hint}") from exc


def meta_shapes(build: Callable[[], torch.nn.Module]) -> dict[str, tuple[int, ...]]:
    """key -> shape of the module `build()` makes, built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        module = build()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def find_shards(folder: str | os.PathLike) -> dict[Path, list[str] | None]:
    """Map each safetensors file of a component folder to the keys the index assigns it (None: read its header).
    A single `.safetensors` file (the single-file releases, e.g. SeedVR2's) is its own one-file "folder"."""
    folder = Path(folder)
    if folder.is_file():
        if folder.suffix != ".safetensors":
            raise CheckpointError(f"{folder} is not a .safetensors file; only safetensors weights are loaded.")
        return {folder: None}
    if not folder.is_dir():
        raise CheckpointError(f"Model component folder not found: {folder}")
    for stem in WEIGHT_STEMS:
        index = folder / f"{stem}.safetensors.index.json"
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(f"Unreadable shard index {index}: it has no weight_map of key -> file name.")
            shards: dict[Path, list[str]] = {}
            for key, name in weight_map.items():
                shards.setdefault(folder / name, []).append(key)
            missing = [str(p) for p in shards if not p.is_file()]
            if missing:
                raise CheckpointError(f"{index} names shard files that are missing: {_first(missing)}")
            return shards
        single = folder / f"{stem}.safetensors"
        if single.is_file():
            return {single: None}
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.ckpt")):
        raise CheckpointError(f"{folder} holds only pickle weights (.bin/.pt/.ckpt); only safetensors are loaded.")
    raise CheckpointError(f"No safetensors weights in {folder}")


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in memory aligned to 64 bytes (a copy only when it is not). safetensors hands out CPU tensors at the
    file's byte offsets, and the CPU GEMM kernels round differently with unaligned operands (single-row products
    differ in the last bit), so the same weights read from two files would compute differently."""
    return tensor.clone() if tensor.device.type == "cpu" and tensor.data_ptr() % 64 else tensor


def load_into(
    module: torch.nn.Module,
    folder: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype_for: Callable[[str, torch.dtype], torch.dtype] | None = None,
    ignore_unexpected: Callable[[str], bool] | None = None,
    rename: Callable[[str], str] | None = None,
) -> None:
    """Load a component folder into `module` strictly, assigning tensors (works on a meta-device module).
    `rename(stored_key)`: the module's key for a stored one (a conversion with older names), checked the same way.

    `dtype_for(key, stored_dtype)` picks each tensor's dtype (default: as stored). Tensors holding NaN / Inf are a
    CheckpointError naming the shard (checked where they loaded, one sync at the end)."""
    expected = {k: v for k, v in module.state_dict().items()}
    seen: set[str] = set()
    finite = FiniteCheck(folder)
    for shard, listed in find_shards(folder).items():
        with reading(shard), safe_open(str(shard), framework="pt", device=str(device)) as handle:
            stored_keys = list(handle.keys())
            names = {k: rename(k) if rename is not None else k for k in stored_keys}
            keys = [names[k] for k in stored_keys]
            if listed is not None and set(listed) - set(stored_keys):
                raise CheckpointError(
                    f"{shard} lacks keys its index assigns to it: {_first(set(listed) - set(stored_keys))}"
                )
            unexpected = [k for k in keys if k not in expected and not (ignore_unexpected and ignore_unexpected(k))]
            if unexpected:
                raise CheckpointError(f"{shard} holds keys this model does not have: {_first(unexpected)}")
            state = {}
            for stored_key, key in zip(stored_keys, keys):
                if key not in expected:
                    continue
                tensor = handle.get_tensor(stored_key)
                want = expected[key]
                if tuple(tensor.shape) != tuple(want.shape):
                    raise CheckpointError(
                        f"{shard}: {key} has shape {tuple(tensor.shape)}, the model expects {tuple(want.shape)}"
                    )
                if want.is_floating_point() and not tensor.is_floating_point():  # a cast would invent the values
                    raise CheckpointError(
                        f"{shard}: {key} is stored as {str(tensor.dtype).replace('torch.', '')}, the model's tensor "
                        f"is floating point (an integer-quantised or damaged file): only float weights are loaded."
                    )
                if dtype_for is not None:
                    tensor = tensor.to(dtype_for(key, tensor.dtype))
                state[key] = finite.add(key, aligned(tensor))
                seen.add(key)
            module.load_state_dict(state, strict=False, assign=True)
    missing = set(expected) - seen
    if missing:
        raise CheckpointError(f"{folder} is missing weights: {_first(missing)}")
    finite.verify()


#: Elements per chunk of the finiteness check: bounds its temporaries (a bool per element) for 260M-param tensors.
_FINITE_CHUNK = 1 << 26


def _all_finite(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d bool on the tensor's device (no sync): no NaN / Inf in it. FP8 is widened to float16 per chunk
    (isfinite has no FP8 kernel; every FP8 value, NaN included, is exact in float16)."""
    flat = tensor.detach().reshape(-1)
    flags = []
    for chunk in flat.split(_FINITE_CHUNK):
        if chunk.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            chunk = chunk.to(torch.float16)
        flags.append(torch.isfinite(chunk).all())
    return torch.stack(flags).all() if len(flags) != 1 else flags[0]


class FiniteCheck:
    """Collects, tensor by tensor as a load goes, whether each floating tensor is free of NaN / Inf, on the tensor's
    own device and without a sync per tensor; :meth:`verify` syncs once per device and raises a CheckpointError
    naming `source` and the first bad keys. A file full of NaN loads without any other error and makes black video:
    every weight loader runs its tensors through this (the cost is one read of the weights where they are)."""

    def __init__(self, source: str | os.PathLike):
        self.source = Path(source)
        self._keys: list[str] = []
        self._flags: list[torch.Tensor] = []

    def add(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_floating_point() and tensor.numel() and tensor.device.type != "meta":
            self._keys.append(key)
            self._flags.append(_all_finite(tensor))
        return tensor

    def verify(self) -> None:
        if not self._flags:
            return
        by_device: dict[torch.device, list[int]] = {}
        for i, flag in enumerate(self._flags):
            by_device.setdefault(flag.device, []).append(i)
        ok = [True] * len(self._flags)
        for indices in by_device.values():
            for i, good in zip(indices, torch.stack([self._flags[i] for i in indices]).tolist()):
                ok[i] = bool(good)
        bad = [key for key, good in zip(self._keys, ok) if not good]
        self._keys, self._flags = [], []
        if bad:
            raise CheckpointError(f"{_holder(self.source, bad)} holds NaN or infinite values in {len(bad)} tensor(s): "
                                  f"{_first(bad)}; the weights are damaged (download the file again).")


def check_finite(tensors: Mapping[str, torch.Tensor] | torch.nn.Module | Iterable[tuple[str, torch.Tensor]],
                 source: str | os.PathLike) -> None:
    """CheckpointError naming `source` (a file, or a model folder: then the shard holding the first bad key) and the
    first keys whose tensors hold NaN or Inf; `tensors`: a module (its state dict), a mapping or (key, tensor) pairs."""
    if isinstance(tensors, torch.nn.Module):
        tensors = tensors.state_dict(keep_vars=True)
    check = FiniteCheck(source)
    for key, tensor in (tensors.items() if isinstance(tensors, Mapping) else tensors):
        check.add(key, tensor)
    check.verify()


def _holder(source: Path, keys: Sequence[str]) -> Path:
    """The weight file of a model folder that holds the first of `keys` (the folder itself when none can be told)."""
    if not source.is_dir():
        return source
    try:
        stored = stored_shapes(source)
    except CheckpointError:
        return source
    first = next((stored[k][0] for k in sorted(keys) if k in stored), None)
    return first or source


def read_json(path: str | os.PathLike) -> dict:
    """A model folder's JSON file as a dict; missing, unreadable or not a JSON object -> CheckpointError naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Missing config file {path}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are ValueErrors
        raise CheckpointError(f"Unreadable JSON in {path}: {_line(exc)}") from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot read {path}: {_line(exc)}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"Unreadable config {path}: expected a JSON object, got {type(raw).__name__}.")
    return raw
