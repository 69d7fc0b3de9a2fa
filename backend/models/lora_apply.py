"""Applying LoRAs to a loaded H3 DiT: merged at load, and switched (another set, other strengths, none) on a loaded
model without reading its base weights again.

Both are one operation: the weights a LoRA set touches are set to base + the set's deltas, where `base` is the
weight as loaded (after a FastH3 student's adapter, before any LoRA). The base of a touched weight comes from
`model.lora_base` (host copies taken the first time a LoRA touched it) or, for a weight no LoRA has touched yet,
from the model itself: its parameter, or its rows of the fused QKV weight (a concatenation: exact). It cannot come
from FP8 codes (quantised: lossy): a switch that needs such a weight raises CannotSwitch, and the caller loads the
model again. The merge is the load's: per weight, per LoRA in order, `(w.float() + strength * delta).to(w.dtype)`,
strength-0 edits skipped; the result then enters the weight's current storage -- a parameter, the fused QKV
weight's rows, or FP8 codes quantised from it as the load quantises -- so a switched model holds exactly the
weights a model loaded with that set holds (tests/pipelines/h3/test_lora_switch.py).

Memory: one transformer block's touched weights at a time on the device beside the model, and on the host the base
copies (bf16, the size of the touched weights; whole QKV groups, so an FP8 model can rebuild its fused codes). They
are kept only while they fit half of the host's free memory (device_memory.host_free_bytes); a model that could not
keep them switches by loading again.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Iterable, Sequence

import torch
from safetensors import safe_open

from ..device_memory import host_free_bytes
from .checkpoint import CheckpointError, reading
from .fp8_linear import Fp8Linear
from .lora import LoraChoice, LoraFile, check_lora_finite, deltas, file_sha256, read_lora

QKV_MEMBERS = ("to_q", "to_k", "to_v", "to_gate_compress")  # fused into attn.qkv_weight / qkv_fp8, in this order
HOST_SHARE = 0.5  # of the host's free memory, what one process's base copies may take (the H3 family divides it
# among the ranks sharing a host when it builds a rank: set_host_share)


def set_host_share(ranks_on_host: int) -> None:
    """This process is one of `ranks_on_host` ranks on its host, each keeping its own base copies."""
    global HOST_SHARE
    HOST_SHARE = 0.5 / max(1, int(ranks_on_host))


class CannotSwitch(RuntimeError):
    """This loaded model cannot take that LoRA set in place (a base weight it would need is gone): load it again."""


def touched_keys(lora: LoraFile) -> set[str]:
    """Our parameter names the file's edits change."""
    keys: set[str] = set()
    for edit in lora.edits:
        if "A" in edit.parts or "diff" in edit.parts:
            keys.update(edit.weight.ours)
        if "diff_b" in edit.parts:
            keys.update(edit.bias.ours)
    return keys


def _unit(key: str) -> str:
    """The piece of the model switched at once: a transformer block, or everything else."""
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] == "transformer_blocks" else ""


def _qkv_of(model: torch.nn.Module, key: str):
    """(attention module, member name) when `key` is a weight of a fusable QKV group, else None."""
    path, _, leaf = key.rpartition(".")
    owner, _, member = path.rpartition(".")
    if leaf != "weight" or member not in QKV_MEMBERS or not owner:
        return None
    attn = model.get_submodule(owner)
    return (attn, member) if hasattr(attn, "fuse_qkv") else None


def _members(attn) -> list[str]:
    return [m for m in QKV_MEMBERS if getattr(attn, m, None) is not None]


def _group(model: torch.nn.Module, key: str) -> list[str]:
    """`key` and the keys stored with it: a QKV group's every member (FP8 quantises them as one tensor)."""
    found = _qkv_of(model, key)
    if found is None:
        return [key]
    owner = key.rsplit(".", 2)[0]
    return [f"{owner}.{m}.weight" for m in _members(found[0])]


def _fp8_module(model: torch.nn.Module, key: str) -> Fp8Linear | None:
    path, _, leaf = key.rpartition(".")
    if leaf != "weight" or not path:
        return None
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    return module if isinstance(module, Fp8Linear) else None


def _current(model: torch.nn.Module, key: str) -> torch.Tensor | None:
    """The unfused weight `key` as the model holds it now (a view or the parameter), None where it is not held
    exactly (FP8 codes, a placeholder of the AdaLN cache)."""
    found = _qkv_of(model, key)
    if found is not None:
        attn, member = found
        if attn.qkv_fp8 is not None:
            return None
        if attn.qkv_weight is not None:
            start = 0
            for m in _members(attn):
                rows = getattr(attn, m).out_features
                if m == member:
                    return attn.qkv_weight[start:start + rows]
                start += rows
    if _fp8_module(model, key) is not None:
        return None
    param = model.get_parameter(key)
    return param.data if param.numel() else None


def _install(model: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Put unfused weights (whole QKV groups) into the model's storage of them: parameter, fused rows or FP8."""
    done: set[str] = set()
    for key, value in values.items():
        if key in done:
            continue
        found = _qkv_of(model, key)
        if found is not None and (found[0].qkv_fp8 is not None or found[0].qkv_weight is not None):
            attn = found[0]
            group = _group(model, key)
            done.update(group)
            fused = torch.cat([values[k] for k in group], dim=0)
            if attn.qkv_fp8 is not None:
                attn.qkv_fp8 = Fp8Linear.from_weight(fused, attn.qkv_fp8.emulate)
            else:
                attn.qkv_weight.copy_(fused)
            continue
        fp8 = _fp8_module(model, key)
        if fp8 is not None:
            path = key.rpartition(".")[0]
            owner, _, name = path.rpartition(".")
            parent = model.get_submodule(owner)
            new = Fp8Linear.from_weight(value, fp8.emulate)
            if name.isdigit():
                parent[int(name)] = new
            else:
                setattr(parent, name, new)
        else:
            model.get_parameter(key).data.copy_(value)
        done.add(key)


def _merged(base: torch.Tensor, strength: float, delta: torch.Tensor) -> torch.Tensor:
    """The load's merge arithmetic, in float32, rounded once to the weight's dtype."""
    return (base.float() + strength * delta.reshape(base.shape)).to(base.dtype)


def _read(choices: Sequence[LoraChoice], shapes: dict, device) -> list[LoraFile]:
    """Every file read and checked (unchanged since chosen, header, shapes, NaN) before any weight changes."""
    loras = []
    for choice in choices:
        if file_sha256(choice.path) != choice.sha256:
            raise CheckpointError(f"{choice.path} changed since it was chosen (its sha256 differs): queue the prompt "
                                  "again.")
        lora = read_lora(choice.path, shapes)
        with reading(lora.path), safe_open(str(lora.path), framework="pt", device="cpu") as handle:
            check_lora_finite(lora, handle, device)
        loras.append(lora)
    return loras


def _shapes(model: torch.nn.Module) -> dict[str, tuple]:
    """Every weight's unfused shape (fused and FP8 ones by their modules' features), what a file is checked against."""
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters() if v.numel()}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, Fp8Linear):
            shapes[f"{prefix}weight"] = (module.out_features, module.in_features)
        elif isinstance(module, torch.nn.Linear) and not module.weight.numel():  # fused away or an AdaLN holder
            shapes[f"{prefix}weight"] = (module.out_features, module.in_features)
            if module.bias is not None:
                shapes[f"{prefix}bias"] = (module.out_features,)
    return shapes


def _host_room() -> float:
    free = host_free_bytes()
    return float("inf") if free is None else HOST_SHARE * free


@torch.no_grad()
def apply_loras(model: torch.nn.Module, choices: Sequence[LoraChoice]) -> dict:
    """Set the model's LoRAs to `choices` (in that order; () = none): at load (nothing merged yet) and on a loaded
    model. Sets model.loras (their manifest entries), model.lora_keys (what they touch), model.lora_base (the base
    copies kept; None once one could not be kept). Raises CannotSwitch, leaving the model as it was, where a base
    weight needed is gone; CheckpointError for a bad or changed file, before any weight changes. Returns what it
    did: seconds are the caller's to take; `weights` touched, `lora_bytes` of the files read."""
    choices = tuple(choices)
    old = set(getattr(model, "lora_keys", ()))
    base: dict[str, torch.Tensor] | None = getattr(model, "lora_base", {})
    if not choices and not old:
        model.loras, model.lora_keys, model.lora_base = [], set(), base
        return {"weights": 0, "lora_bytes": 0}
    device = next(p for p in model.parameters() if p.numel()).device
    loras = _read(choices, _shapes(model), device)
    new = set().union(*(touched_keys(lora) for lora in loras)) if loras else set()
    keys = sorted({k for key in old | new for k in _group(model, key)})
    missing = [k for k in keys if (base is None or k not in base) and (k in old or _current(model, k) is None)]
    if missing:
        raise CannotSwitch(f"{len(missing)} base weights this LoRA set needs are no longer held exactly "
                           f"(first: {missing[0]}): the model loads again.")
    kept = base
    if base is not None:
        extra = [k for k in keys if k not in base]
        need = sum(t.numel() * t.element_size() for t in map(lambda k: _current(model, k), extra))
        if need > _host_room():
            kept = None  # this switch still works; the next one away from it loads again
    units: dict[str, list[str]] = {}
    for key in keys:
        units.setdefault(_unit(key), []).append(key)
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(lora.path), framework="pt", device="cpu")) for lora in loras]
        for unit, unit_keys in units.items():
            values = {}
            for key in unit_keys:
                if base is not None and key in base:
                    values[key] = base[key].to(device, copy=True)
                else:
                    current = _current(model, key)  # the model's own storage: merged below into new tensors
                    if kept is not None:
                        kept[key] = current.to("cpu", copy=True)
                    values[key] = current
            for choice, lora, handle in zip(choices, loras, handles):
                for key, delta in _unit_deltas(lora, handle, device, unit):
                    strength = choice.strength_for(key)
                    if strength and key in values:
                        values[key] = _merged(values[key], strength, delta)
            _install(model, values)
            del values
    model.loras = [choice.record() for choice in choices]
    model.lora_keys = new
    model.lora_base = kept
    return {"weights": len(keys), "lora_bytes": sum(lora.path.stat().st_size for lora in loras)}


def _unit_deltas(lora: LoraFile, handle, device, unit: str) -> Iterable[tuple[str, torch.Tensor]]:
    """deltas() of the file's edits that land in `unit`."""
    edits = [e for e in lora.edits if _unit(e.weight.ours[0]) == unit]
    if edits:
        yield from deltas(LoraFile(lora.path, tuple(edits), lora.shapes, lora.metadata_alpha), handle, device)
