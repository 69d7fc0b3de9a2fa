"""Strict safetensors loading for diffusers-layout model folders (single file or sharded with an index).

Every key of the module must come from the checkpoint with the right shape, and every checkpoint key must land in
the module: anything else is an error that names the file and the first offending keys. Weights are only ever read
with safetensors (never pickle).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import safe_open

WEIGHT_STEMS = ("diffusion_pytorch_model", "model")


class CheckpointError(ValueError):
    """A model folder that cannot be loaded as-is: missing, corrupt, or not matching the architecture."""


def _first(keys: Iterable[str], n: int = 5) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def find_shards(folder: str | os.PathLike) -> dict[Path, list[str] | None]:
    """Map each safetensors file of a component folder to the keys the index assigns it (None: read its header)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"Model component folder not found: {folder}")
    for stem in WEIGHT_STEMS:
        index = folder / f"{stem}.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (ValueError, KeyError) as exc:
                raise CheckpointError(f"Unreadable shard index {index}: {exc}") from exc
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


def load_into(
    module: torch.nn.Module,
    folder: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype_for: Callable[[str, torch.dtype], torch.dtype] | None = None,
    ignore_unexpected: Callable[[str], bool] | None = None,
) -> None:
    """Load a component folder into `module` strictly, assigning tensors (works on a meta-device module).

    `dtype_for(key, stored_dtype)` picks each tensor's dtype (default: as stored)."""
    expected = {k: v for k, v in module.state_dict().items()}
    seen: set[str] = set()
    for shard, listed in find_shards(folder).items():
        try:
            handle = safe_open(str(shard), framework="pt", device=str(device))
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"Cannot read {shard}: {exc}") from exc
        with handle:
            keys = list(handle.keys())
            if listed is not None and set(listed) - set(keys):
                raise CheckpointError(
                    f"{shard} lacks keys its index assigns to it: {_first(set(listed) - set(keys))}"
                )
            unexpected = [k for k in keys if k not in expected and not (ignore_unexpected and ignore_unexpected(k))]
            if unexpected:
                raise CheckpointError(f"{shard} holds keys this model does not have: {_first(unexpected)}")
            state = {}
            for key in keys:
                if key not in expected:
                    continue
                try:
                    tensor = handle.get_tensor(key)
                except Exception as exc:
                    raise CheckpointError(f"Cannot read tensor {key!r} from {shard}: {exc}") from exc
                want = expected[key]
                if tuple(tensor.shape) != tuple(want.shape):
                    raise CheckpointError(
                        f"{shard}: {key} has shape {tuple(tensor.shape)}, the model expects {tuple(want.shape)}"
                    )
                if dtype_for is not None:
                    tensor = tensor.to(dtype_for(key, tensor.dtype))
                state[key] = tensor
                seen.add(key)
            module.load_state_dict(state, strict=False, assign=True)
    missing = set(expected) - seen
    if missing:
        raise CheckpointError(f"{folder} is missing weights: {_first(missing)}")


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"Missing config file {path}") from None
    except ValueError as exc:
        raise CheckpointError(f"Unreadable JSON in {path}: {exc}") from exc
