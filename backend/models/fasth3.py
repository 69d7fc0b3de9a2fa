"""FastH3 (FastVideo's 4-step DMD2 student of MiniMax-H3) as released: one safetensors adapter over the base DiT's
`transformer/` partition (docs/FASTH3.md has the sources). The reconstruction, as the file's own metadata states it:

    W = W_base + lora_B @ lora_A;  then .diff / .diff_b added;  then .set_weight assigned

Tensor names follow the diffusers DiT, which is ours (`transformer_blocks.0.attn.to_q`, `ff.net.0.proj`, ...):
`<module>.lora_A.weight` [r, in] and `<module>.lora_B.weight` [out, r] (scale 1: no alpha), `<module>.diff` (a weight
delta), `<module>.diff_b` (a bias delta), `<module>.set_weight` (a weight assigned). The VSA variant assigns
`transformer_blocks.{i}.attn.to_gate_compress` in every block: the learned gates of VSA's coarse branch, a module the
base has not got (H3Attention.add_gate installs it).

`read_adapter` reads only the header (names, shapes, metadata) and checks the file on its own; `check_adapter` holds
it to a model's parameter shapes; `fuse_adapter` applies it (float32 arithmetic on the weights' device, the result in
each weight's dtype) and installs the gates. Every refusal is one CheckpointError naming the file and the first
offending tensors.
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

from .checkpoint import CheckpointError, FiniteCheck, _first, reading

FORMAT = "fastvideo-lora-v2"  # the safetensors metadata `format` of FastVideo's adapter files
ADAPTER_FILE = "adapter_model.safetensors"
# suffix -> (operation, suffix of the parameter it edits); ".diff_b" before ".diff"
SUFFIXES = ((".lora_A.weight", "lora_A", ".weight"), (".lora_B.weight", "lora_B", ".weight"),
            (".set_weight", "set", ".weight"), (".diff_b", "diff_b", ".bias"), (".diff", "diff", ".weight"))
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
        ranks = {self.shapes[ops["lora_A"]][0] for ops in self.targets.values() if "lora_A" in ops}
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
    for suffix, op, target_suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] + target_suffix, op
    return None


def read_adapter(path: str | os.PathLike) -> Adapter:
    """The adapter's header, checked on its own: FastVideo's format, known tensor kinds only, complete low-rank
    pairs of one rank, and the tensor counts its metadata declares."""
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
    unpaired = [ops.get("lora_A") or ops["lora_B"] for ops in targets.values()
                if ("lora_A" in ops) != ("lora_B" in ops)]
    if unpaired:
        raise CheckpointError(f"{file} has low-rank factors without their other half (lora_A / lora_B): "
                              f"{_first(unpaired)}")
    bad = []
    for ops in targets.values():
        if "lora_A" in ops:
            a, b = shapes[ops["lora_A"]], shapes[ops["lora_B"]]
            if len(a) != 2 or len(b) != 2 or b[1] != a[0]:
                bad.append(f"{ops['lora_A']} {a} / {ops['lora_B']} {b}")
    if bad:
        raise CheckpointError(f"{file}: low-rank factors must be lora_A [r, in] and lora_B [out, r]: {_first(bad, 3)}")
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


def check_adapter(adapter: Adapter, expected: Mapping[str, tuple], num_blocks: int) -> None:
    """Hold the adapter to a model's parameters (name -> shape): every edit names a parameter of it with a fitting
    shape; learned gates come for every block or none."""
    unknown, wrong = [], []
    for target, ops in sorted(adapter.targets.items()):
        gate = GATE.fullmatch(target)
        if gate is not None and target not in expected:
            index = int(gate.group(1))
            q_key = f"transformer_blocks.{index}.attn.to_q.weight"
            if index >= num_blocks or set(ops) != {"set"}:
                unknown.extend(ops.values())
                continue
            want = expected[q_key]
        elif target in expected:
            want = tuple(expected[target])
        else:
            unknown.extend(ops.values())
            continue
        for op, key in ops.items():
            shape = adapter.shapes[key]
            if op == "lora_A":
                shape = (adapter.shapes[ops["lora_B"]][0], shape[1])
            if op != "lora_B" and tuple(shape) != tuple(want):
                wrong.append(f"{key} {tuple(adapter.shapes[key])} for {target} {tuple(want)}")
    if unknown:
        raise CheckpointError(f"{adapter.path} edits parameters this model has not got: {_first(unknown)} (is it an "
                              "adapter for this model's transformer/?)")
    if wrong:
        more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise CheckpointError(f"{adapter.path} does not fit this model: {'; '.join(wrong[:3])}{more}")
    gates = len(adapter.gates)
    if gates not in (0, num_blocks):
        raise CheckpointError(f"{adapter.path} sets learned VSA gates for {gates} of the model's {num_blocks} blocks; "
                              "a student carries them in every block or none.")


@torch.no_grad()
def fuse_adapter(model: torch.nn.Module, adapter: Adapter) -> None:
    """Apply the adapter to a loaded H3Transformer in place (before fuse_projections / FP8), gates included."""
    params = dict(model.named_parameters())
    check_adapter(adapter, {k: tuple(v.shape) for k, v in params.items()}, len(model.transformer_blocks))
    finite = FiniteCheck(adapter.path)  # a NaN adapter would load and make black video: checked on the device
    with reading(adapter.path), safe_open(str(adapter.path), framework="pt", device="cpu") as handle:
        for target, ops in sorted(adapter.targets.items()):
            gate = GATE.fullmatch(target)
            if gate is not None and target not in params:
                attn = model.transformer_blocks[int(gate.group(1))].attn
                weight = handle.get_tensor(ops["set"]).to(attn.to_q.weight.device, attn.to_q.weight.dtype)
                attn.add_gate(finite.add(ops["set"], weight))
                continue
            param = params[target]
            if "set" in ops and len(ops) == 1:
                param.copy_(finite.add(ops["set"], handle.get_tensor(ops["set"]).to(param.device, param.dtype)))
                continue
            part = {op: finite.add(key, handle.get_tensor(key).to(param.device).float()) for op, key in ops.items()}
            w = param.float()
            if "lora_A" in part:
                w = w + part["lora_B"] @ part["lora_A"]
            for op in ("diff", "diff_b"):
                if op in part:
                    w = w + part[op]
            w = part.get("set", w)  # assigned last, as the release's reconstruction states
            param.copy_(w.to(param.dtype))
    finite.verify()
    model.vsa_gates = adapter.has_gates
    logging.getLogger(__name__).info("FastH3 student fused: %s", adapter.describe())
