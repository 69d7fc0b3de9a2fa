"""FastH3 (FastVideo's 4-step DMD2 student of MiniMax-H3) as released: one safetensors adapter over the base DiT's
`transformer/` partition (docs/FASTH3.md has the sources). The reconstruction, as the file's own metadata states it:

    W = W_base + lora_B @ lora_A;  then .diff / .diff_b added;  then .set_weight assigned

Tensor names follow the diffusers DiT, which is ours (`transformer_blocks.0.attn.to_q`, `ff.net.0.proj`, ...):
`<module>.lora_A.weight` [r, in] and `<module>.lora_B.weight` [out, r] (scale 1: no alpha), `<module>.diff` (a weight
delta), `<module>.diff_b` (a bias delta), `<module>.set_weight` (a weight assigned). The VSA variant assigns
`transformer_blocks.{i}.attn.to_gate_compress` in every block: the learned gates of VSA's coarse branch, a module the
base has not got (H3Attention.add_gate installs it).

`read_adapter` reads only the header (names, shapes, metadata) and checks what makes it FastVideo's file (format,
declared counts, one rank, gates in every block or none); the tensors themselves are read, held to the model and
turned into deltas by the LoRA reader every LoRA file goes through (models/lora.py, with `.set_weight` allowed):
`check_adapter` holds it to a model's parameter shapes, `fuse_adapter` applies it (float32 arithmetic on the
weights' device, the result in each weight's dtype) and installs the gates. Every refusal is one CheckpointError
naming the file and the first offending tensors.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open

from .checkpoint import CheckpointError, _first, reading
from .lora import LoraFile, assignments, check_lora_finite, deltas, read_lora, split_key

FORMAT = "fastvideo-lora-v2"  # the safetensors metadata `format` of FastVideo's adapter files
ADAPTER_FILE = "adapter_model.safetensors"
# the LoRA reader's part -> this file's operation name (the metadata counts use these); alpha and kohya names are
# no part of FastVideo's format
OPERATIONS = {"A": "lora_A", "B": "lora_B", "set": "set", "diff_b": "diff_b", "diff": "diff"}
FASTVIDEO_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".set_weight", ".diff_b", ".diff")
GATE = re.compile(r"transformer_blocks\.(\d+)\.attn\.to_gate_compress\.weight")
DECLARED = {"low_rank_tensors": ("lora_A", "lora_B"), "diff_tensors": ("diff", "diff_b"),
            "set_weight_tensors": ("set",)}  # metadata count -> the operations it counts


@dataclass(frozen=True)
class Adapter:
    path: Path
    metadata: dict
    shapes: dict  # tensor name -> shape
    targets: dict = field(repr=False)  # parameter name -> {operation: tensor name}

    @property
    def gates(self) -> list[str]:
        return sorted(t for t in self.targets if GATE.fullmatch(t))

    @property
    def has_gates(self) -> bool:
        return bool(self.gates)

    @property
    def rank(self) -> int | None:
        ranks = {self.shapes[ops["lora_A"]][0] for ops in self.targets.values() if "lora_A" in ops
                 and len(self.shapes[ops["lora_A"]]) == 2}
        return ranks.pop() if len(ranks) == 1 else None

    def describe(self) -> str:
        counts = {op: sum(op in ops for ops in self.targets.values()) for op in ("lora_A", "diff", "diff_b", "set")}
        return (f"{self.path} ({self.metadata.get('finetuned_model', 'FastH3')}: rank {self.rank}, "
                f"{counts['lora_A']} low-rank, {counts['diff'] + counts['diff_b']} diffs, {counts['set']} assigned, "
                f"{len(self.gates)} learned VSA gates)")


def resolve_adapter_file(path: str | os.PathLike) -> Path:
    """An adapter file, or a folder holding exactly one (adapter_model.safetensors, or its only .safetensors)."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix != ".safetensors":
            raise CheckpointError(f"{p} is not a .safetensors file; FastH3 adapters are read from safetensors only.")
        return p
    if not p.is_dir():
        raise CheckpointError(f"FastH3 adapter not found: {p}")
    if (p / ADAPTER_FILE).is_file():
        return p / ADAPTER_FILE
    files = sorted(p.glob("*.safetensors"))
    if len(files) == 1:
        return files[0]
    variants = sorted(d.name for d in p.iterdir() if (d / ADAPTER_FILE).is_file())
    if variants:
        raise CheckpointError(f"{p} holds several FastH3 variants ({', '.join(variants)}): point at one, e.g. "
                              f"{p / variants[-1] / ADAPTER_FILE}.")
    raise CheckpointError(f"{p} holds {'no' if not files else 'several'} .safetensors files; point at the FastH3 "
                          f"adapter file ({ADAPTER_FILE}).")


def _split(name: str) -> tuple[str, str] | None:
    """A tensor name -> (the parameter it edits, operation), None for what FastVideo's format has not got."""
    split = split_key(name, assigned=True) if name.endswith(FASTVIDEO_SUFFIXES) else None
    if split is None or split[2]:  # kohya's lora_unet_ names are no FastVideo file's
        return None
    op = OPERATIONS[split[1]]
    return split[0] + (".bias" if op == "diff_b" else ".weight"), op


def read_adapter(path: str | os.PathLike) -> Adapter:
    """The adapter's header, checked on its own: FastVideo's format, known tensor kinds only, one rank, and the
    tensor counts its metadata declares (pairs and shapes: check_adapter, by the LoRA reader)."""
    file = resolve_adapter_file(path)
    with reading(file), safe_open(str(file), framework="pt", device="cpu") as handle:
        metadata = dict(handle.metadata() or {})
        shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
        stored = {key: handle.get_slice(key).get_dtype() for key in handle.keys()}
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a FastH3 adapter: its metadata format is {metadata.get('format')!r}, "
                              f"expected {FORMAT!r} (FastVideo's release, e.g. vsa-datafree/{ADAPTER_FILE}).")
    not_float = [f"{k} ({v})" for k, v in sorted(stored.items()) if v not in ("F64", "F32", "F16", "BF16")]
    if not_float:  # a cast to float would invent the deltas
        raise CheckpointError(f"{file} stores adapter tensors as non-float types: {_first(not_float, 3)}; FastH3 "
                              "adapters are bf16 / fp16 / fp32 (a damaged file?).")
    targets: dict[str, dict[str, str]] = {}
    unknown = []
    for key in shapes:
        split = _split(key)
        if split is None:
            unknown.append(key)
            continue
        targets.setdefault(split[0], {})[split[1]] = key
    if unknown:
        raise CheckpointError(f"{file} holds tensors that are no FastH3 adapter part (.lora_A.weight, .lora_B.weight, "
                              f".diff, .diff_b, .set_weight): {_first(unknown)}")
    adapter = Adapter(file, metadata, shapes, targets)
    if "lora_A" in {op for ops in targets.values() for op in ops} and adapter.rank is None:
        raise CheckpointError(f"{file} mixes low-rank factors of different ranks.")
    declared_rank = metadata.get("rank")
    if declared_rank is not None and adapter.rank is not None and str(adapter.rank) != str(declared_rank).strip():
        raise CheckpointError(f"{file} declares rank {declared_rank} but its factors have rank {adapter.rank}.")
    for key, ops in DECLARED.items():
        if key not in metadata:
            continue
        carried = sum(op in have for have in targets.values() for op in ops)
        try:
            declared = int(metadata[key])
        except ValueError:
            raise CheckpointError(f"{file} declares a non-numeric {key}={metadata[key]!r}.") from None
        if declared != carried:
            raise CheckpointError(f"{file} declares {key}={declared} but carries {carried}: the file is incomplete "
                                  "(download it again).")
    return adapter


def check_adapter(adapter: Adapter, expected: Mapping[str, tuple], num_blocks: int) -> LoraFile:
    """Hold the adapter to a model's parameters (name -> shape, before any gate is installed): learned gates come
    for every block or none, each only assigned; everything else as the LoRA reader holds any file (every edit a
    module of the model, of its shape). Returns the file as that reader gives it."""
    shapes = dict(expected)
    bad_gates = []
    for target in adapter.gates:
        index = int(GATE.fullmatch(target).group(1))
        q_key = f"transformer_blocks.{index}.attn.to_q.weight"
        if target in shapes:
            continue
        if index >= num_blocks or set(adapter.targets[target]) != {"set"} or q_key not in shapes:
            bad_gates.extend(adapter.targets[target].values())
            continue
        shapes[target] = tuple(shapes[q_key])  # a gate projects like to_q: [inner, hidden]
    if bad_gates:
        raise CheckpointError(f"{adapter.path} edits parameters this model has not got: {_first(bad_gates)} (is it "
                              "an adapter for this model's transformer/?)")
    gates = len(adapter.gates)
    if gates not in (0, num_blocks):
        raise CheckpointError(f"{adapter.path} sets learned VSA gates for {gates} of the model's {num_blocks} blocks; "
                              "a student carries them in every block or none.")
    return read_lora(adapter.path, shapes, assigned=True)


@torch.no_grad()
def fuse_adapter(model: torch.nn.Module, adapter: Adapter) -> None:
    """Apply the adapter to a loaded H3Transformer in place (before fuse_projections / FP8), gates included:
    W = W + delta (the LoRA reader's: B @ A + diff), then the assigned tensors (gates among them)."""
    params = dict(model.named_parameters())
    lora = check_adapter(adapter, {k: tuple(v.shape) for k, v in params.items()}, len(model.transformer_blocks))
    device = next(p for p in params.values() if p.numel()).device
    with reading(adapter.path), safe_open(str(adapter.path), framework="pt", device="cpu") as handle:
        check_lora_finite(lora, handle, device)  # a NaN adapter would load and make black video
        for target in adapter.gates:
            attn = model.transformer_blocks[int(GATE.fullmatch(target).group(1))].attn
            if attn.to_gate_compress is None:  # its values are assigned below
                attn.add_gate(torch.empty_like(attn.to_q.weight))
        params = dict(model.named_parameters())
        for key, delta in deltas(lora, handle, device):
            param = params[key]
            param.copy_((param.float() + delta.reshape(param.shape)).to(param.dtype))
        for key, value in assignments(lora, handle, device):
            params[key].copy_(value.to(params[key].dtype))
    model.vsa_gates = adapter.has_gates
    logging.getLogger(__name__).info("FastH3 student fused: %s", adapter.describe())
