"""LoRA files for the H3 DiT: read (safetensors header only), held strictly to a model's parameters; their deltas
(lora_apply.py merges them into a loaded model and switches them).

Layouts (recognised key by key; one file may mix them):

- diffusers / PEFT: `<module>.lora_A.weight` [r, in], `<module>.lora_B.weight` [out, r] (or PEFT's
  `.lora_A.default.weight`), optional `<module>.alpha` (scale alpha / r; without it the `lora_alpha` / `r` a PEFT
  `lora_adapter_metadata` header entry states, or for a LightX2V Turbo file the release's alpha / r
  (turbo_lora.py), else 1).
  Module names are ours (= the diffusers partition's: `transformer_blocks.0.attn.to_q`), optionally under
  `transformer.` or `base_model.model.`.
- kohya: `lora_unet_<module with "." as "_">.lora_down.weight` [r, in] / `.lora_up.weight` [out, r] / `.alpha`
  (scale alpha / r; without it 1); the module written in our names or in ComfyUI's native ones.
- ComfyUI's native H3 names (`diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight`, ...), with lora_A/B or
  lora_down/up: a native tensor that joins several of ours (q | k | v in `qkv_proj`, the SwiGLU halves of `mlp.fc1`)
  gets its delta split the way the native key map (native_keys.py) splits the weight itself.
- full-weight diffs, in any of these namings: `<module>.diff` (a weight delta), `<module>.diff_b` (a bias delta).
- assigned weights, `<module>.set_weight`, only where the caller allows them (read_lora(assigned=True)): FastH3's
  adapter (models/fasth3.py) is read here too; a user's LoRA at a strength cannot assign (what would 0.5 mean?).

LyCORIS LoHa / LoKr / LoCon-mid keys are refused by name (no H3 file in those formats could be examined here).

The delta of a module is scale * (B @ A) (+ diff), reshaped to the weight (a kohya 1x1 conv factor is 4-D), and a
LoRA enters a weight as W + strength * delta; several LoRAs add their deltas. `adaln_strength` scales the edits of
the time path (time embedder, every block's adaln_proj, norm_out's projection) on their own. Merged in float32 on
the weight's device, the result in the weight's dtype: before the QKV fusion and any FP8 quantisation
(h3_transformer.finish_loading), so every weight policy (FP8, streamed blocks, the AdaLN table cache, Ulysses ranks)
sees the merged weights.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch
from safetensors import safe_open

from .checkpoint import CheckpointError, FiniteCheck, _first, reading
from .native_keys import Link, transformer_map
from .turbo_lora import release_scale

LOW_RANK_SUFFIXES = {".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_down.weight": "A", ".lora_up.weight": "B",
                     ".lora_A.default.weight": "A", ".lora_B.default.weight": "B",  # PEFT's adapter-named dict
                     ".alpha": "alpha", ".diff_b": "diff_b", ".diff": "diff"}
LYCORIS = (".hada_w1_a", ".hada_w1_b", ".hada_w2_a", ".hada_w2_b", ".hada_t1", ".hada_t2", ".lokr_w1", ".lokr_w2",
           ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2_a", ".lokr_w2_b", ".lokr_t2", ".lora_mid.weight", ".dora_scale")
OUR_PREFIXES = ("base_model.model.", "transformer.")
NATIVE_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
KOHYA_PREFIXES = ("lora_unet_", "lora_transformer_")
ASSIGNED_SUFFIX = ".set_weight"  # part "set": the weight replaced (FastH3's adapter only)
TIME_PATH = re.compile(r"(^time_embedder\.|\.adaln_proj\.|^norm_out\.linear\.)")  # in our names
# Names other video models' LoRAs use and H3's DiT has not got: a hint in the refusal
OTHER_MODELS = (("self_attn", "Wan"), ("cross_attn", "Wan"), ("mmattn", "SeedVR2"), ("vid_in", "SeedVR2"),
                ("double_blocks", "HunyuanVideo / Flux"), ("single_blocks", "HunyuanVideo / Flux"))


@dataclass(frozen=True)
class LoraChoice:
    """One LoRA as an engine applies it: the file, its sha256 (the engine's identity follows the file's content),
    its strength, and the time path's strength (None: `strength`)."""

    path: str
    sha256: str
    strength: float = 1.0
    adaln_strength: float | None = None

    def strength_for(self, param: str) -> float:
        if self.adaln_strength is not None and TIME_PATH.search(param):
            return self.adaln_strength
        return self.strength

    def record(self) -> dict:
        """The manifest's entry (backend/manifest.py)."""
        return {"file": self.path, "sha256": self.sha256, "strength": self.strength,
                "adaln_strength": self.strength if self.adaln_strength is None else self.adaln_strength}


@dataclass(frozen=True)
class ModuleEdit:
    """One module's edit in a file: `parts` (A / B / alpha / diff / diff_b -> tensor key) and where it lands: our
    parameter names for its weight and bias (several when a native tensor joins several of ours, `link` then says
    how to split the delta)."""

    module: str  # as the file names it, prefix stripped
    parts: Mapping[str, str]
    weight: Link
    bias: Link | None


@dataclass(frozen=True)
class LoraFile:
    path: Path
    edits: tuple[ModuleEdit, ...]
    shapes: Mapping[str, tuple]
    metadata_alpha: float | None  # the scale of edits without their own alpha: PEFT's lora_alpha / r from the
    # header, or a Turbo release's alpha / r (turbo_lora.py); None: 1

    @property
    def ranks(self) -> list[int]:
        return sorted({self.shapes[e.parts["A"]][0] for e in self.edits if "A" in e.parts})

    def describe(self) -> str:
        low = sum("A" in e.parts for e in self.edits)
        diffs = sum(("diff" in e.parts) + ("diff_b" in e.parts) for e in self.edits)
        return f"{self.path.name} (rank {'/'.join(map(str, self.ranks)) or '-'}, {low} low-rank, {diffs} diffs)"


@lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """The file's sha256, computed once per (path, size, mtime)."""
    st = os.stat(path)
    return _sha256(os.fspath(path), st.st_size, st.st_mtime_ns)


def lora_choice(path: str | os.PathLike, strength: float = 1.0, adaln_strength: float | None = None) -> LoraChoice:
    """A checked LoraChoice: a .safetensors file that exists, finite strengths."""
    p = Path(path).expanduser()
    if p.suffix != ".safetensors":
        raise CheckpointError(f"{p} is not a .safetensors file; LoRAs are read from safetensors only.")
    if not p.is_file():
        raise CheckpointError(f"LoRA file not found: {p}")
    for name, value in (("strength", strength), ("adaln_strength", adaln_strength)):
        if value is not None and (isinstance(value, bool) or not math.isfinite(float(value))):
            raise ValueError(f"LoRA {name} must be a finite number, got {value!r} for {p.name}.")
    return LoraChoice(str(p.resolve()), file_sha256(p), float(strength),
                      None if adaln_strength is None else float(adaln_strength))


def parse_lora_arg(text: str) -> tuple[str, float]:
    """CLI `--lora FILE[:STRENGTH]` -> (file, strength); a colon in the path itself is kept (only a trailing
    number after the last colon is a strength)."""
    path, sep, tail = text.rpartition(":")
    if sep and path:
        try:
            return path, float(tail)
        except ValueError:
            pass
    return text, 1.0


class _Names:
    """Every name a LoRA may give one of our modules -> (weight link, bias link)."""

    def __init__(self, our_shapes: Mapping[str, Sequence[int]]):
        self.ours: dict[str, tuple[Link, Link | None]] = {}
        for key in our_shapes:
            if key.endswith(".weight"):
                module = key[: -len(".weight")]
                bias = module + ".bias"
                self.ours[module] = (Link(key, (key,)), Link(bias, (bias,)) if bias in our_shapes else None)
        self.native: dict[str, tuple[Link, Link | None]] = {}
        links = {link.native: link for link in transformer_map(our_shapes).links}
        for native, link in links.items():
            if native.endswith(".weight"):
                module = native[: -len(".weight")]
                self.native[module] = (link, links.get(module + ".bias"))
        self.flat = {m.replace(".", "_"): v for table in (self.native, self.ours) for m, v in table.items()}

    def resolve(self, module: str, kohya: bool) -> tuple[Link, Link | None] | None:
        if kohya:
            return self.flat.get(module)
        for prefix in NATIVE_PREFIXES:
            if module.startswith(prefix):
                return self.native.get(module[len(prefix):])
        for prefix in OUR_PREFIXES:
            if module.startswith(prefix) and module[len(prefix):] in self.ours:
                return self.ours[module[len(prefix):]]
        return self.ours.get(module) or self.native.get(module)


def split_key(key: str, assigned: bool = False) -> tuple[str, str, bool] | None:
    """A tensor key -> (module, part, kohya naming), or None when it is no LoRA part (`.set_weight`, part "set",
    only when `assigned`)."""
    suffixes = {**LOW_RANK_SUFFIXES, ASSIGNED_SUFFIX: "set"} if assigned else LOW_RANK_SUFFIXES
    for suffix, part in suffixes.items():
        if key.endswith(suffix):
            module = key[: -len(suffix)]
            for prefix in KOHYA_PREFIXES:
                if module.startswith(prefix):
                    return module[len(prefix):], part, True
            return module, part, False
    return None


def _metadata_alpha(metadata: Mapping[str, str], file: Path) -> float | None:
    raw = metadata.get("lora_adapter_metadata")
    if not raw:
        return None
    try:
        info = json.loads(raw)
        alpha, rank = info.get("lora_alpha"), info.get("r")
        return None if alpha is None or not rank else float(alpha) / float(rank)
    except (ValueError, TypeError, AttributeError):
        raise CheckpointError(f"{file}: its lora_adapter_metadata header entry is not the JSON PEFT writes "
                              f"({raw[:80]!r}).") from None


def read_lora(path: str | os.PathLike, our_shapes: Mapping[str, Sequence[int]], assigned: bool = False) -> LoraFile:
    """The file's header, held to a model's parameters (name -> shape, our unfused names): every tensor a LoRA
    part, every module one the model has, low-rank pairs complete, of one rank each, and of the module's shape.
    `assigned`: `.set_weight` tensors are parts too (FastH3's adapter)."""
    file = Path(path)
    with reading(file), safe_open(str(file), framework="pt", device="cpu") as handle:
        metadata = dict(handle.metadata() or {})
        shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
        stored = {key: handle.get_slice(key).get_dtype() for key in handle.keys()}
    if not shapes:
        raise CheckpointError(f"{file} holds no tensors: it is no LoRA.")
    lycoris = sorted(k for k in shapes if k.endswith(LYCORIS))
    if lycoris:
        raise CheckpointError(f"{file} is a LyCORIS file (LoHa / LoKr / LoCon / DoRA parts: {_first(lycoris, 3)}); "
                              "H3 LoRA reads plain low-rank (lora_A/B, lora_down/up) and diff files only.")
    not_float = [f"{k} ({v})" for k, v in sorted(stored.items()) if v not in ("F64", "F32", "F16", "BF16")]
    if not_float:
        raise CheckpointError(f"{file} stores LoRA tensors as non-float types: {_first(not_float, 3)} (a damaged "
                              "file, or no LoRA?).")
    names = _Names(our_shapes)
    grouped: dict[tuple[str, bool], dict[str, str]] = {}
    strangers = []
    for key in sorted(shapes):
        split = split_key(key, assigned)
        if split is None:
            strangers.append(key)
            continue
        module, part, kohya = split
        grouped.setdefault((module, kohya), {})[part] = key
    assigns = [k for k in strangers if k.endswith(ASSIGNED_SUFFIX)]
    if assigns:
        raise CheckpointError(f"{file} assigns whole weights ({_first(assigns, 3)}): that is FastH3's adapter form, "
                              "not a LoRA; choose it as the loader's FastH3 student.")
    if strangers:
        raise CheckpointError(f"{file} holds tensors that are no LoRA part (.lora_A/.lora_B/.lora_down/.lora_up "
                              f".weight, .alpha, .diff, .diff_b): {_first(strangers)}")
    edits, unknown, bad = [], [], []
    for (module, kohya), parts in grouped.items():
        target = names.resolve(module, kohya)
        if target is None:
            unknown.append(next(iter(parts.values())))
            continue
        weight, bias = target
        if ("A" in parts) != ("B" in parts):
            bad.append(f"{parts.get('A') or parts['B']}: its other half (up / B or down / A) is missing")
            continue
        if "alpha" in parts and ("A" not in parts or math.prod(shapes[parts["alpha"]]) != 1):
            bad.append(f"{parts['alpha']} {shapes[parts['alpha']]}: an alpha is one number beside a low-rank pair")
            continue
        if set(parts) <= {"alpha"}:
            unknown.append(parts["alpha"])
            continue
        want = weight.native_shape([our_shapes[k] for k in weight.ours])
        if "A" in parts:
            a, b = shapes[parts["A"]], shapes[parts["B"]]
            a2, b2 = (a[0], math.prod(a[1:])), (b[0], math.prod(b[1:]))
            if len(a) < 2 or len(b) < 2 or b2[1] != a2[0] or (b2[0], a2[1]) != (want[0], math.prod(want[1:])):
                bad.append(f"{parts['A']} {a} / {parts['B']} {b} for a weight {tuple(want)}")
        for part in ("diff", "set"):
            if part in parts and shapes[parts[part]] != tuple(want):
                bad.append(f"{parts[part]} {shapes[parts[part]]} for a weight {tuple(want)}")
        if "diff_b" in parts:
            want_b = None if bias is None else bias.native_shape([our_shapes[k] for k in bias.ours])
            if want_b is None or shapes[parts["diff_b"]] != tuple(want_b):
                bad.append(f"{parts['diff_b']} {shapes[parts['diff_b']]} for a bias {want_b}")
        edits.append(ModuleEdit(module, parts, weight, bias))
    if unknown:
        guess = next((model for word, model in OTHER_MODELS if any(word in k for k in unknown)), None)
        hint = f"; it looks like a {guess} LoRA" if guess else " (is it a LoRA for another model?)"
        raise CheckpointError(f"{file} edits modules the H3 DiT has not got: {_first(unknown)}{hint}.")
    if bad:
        raise CheckpointError(f"{file} does not fit this H3 DiT: {'; '.join(bad[:3])}"
                              f"{f' (+{len(bad) - 3} more)' if len(bad) > 3 else ''}")
    scale = _metadata_alpha(metadata, file)
    ranks = {shapes[e.parts["A"]][0] for e in edits if "A" in e.parts}
    if scale is None and len(ranks) == 1 and not any("alpha" in e.parts for e in edits):
        scale = release_scale(file, ranks.pop())  # a Turbo file's PEFT copy: the release's alpha
    return LoraFile(file, tuple(edits), shapes, scale)


def deltas(lora: LoraFile, handle, device) -> Iterable[tuple[str, torch.Tensor]]:
    """(our parameter, its float32 delta at strength 1) for every edit of the file, one module at a time (a full
    set of deltas would be a float32 copy of every touched weight)."""

    def get(key):
        return handle.get_tensor(key).to(device, torch.float32)

    for edit in lora.edits:
        parts = edit.parts
        weight = None
        if "A" in parts:
            a, b = get(parts["A"]), get(parts["B"])
            rank = a.shape[0]
            if "alpha" in parts:
                scale = float(get(parts["alpha"]).reshape(())) / rank
            else:
                scale = 1.0 if lora.metadata_alpha is None else lora.metadata_alpha
            weight = (b.reshape(b.shape[0], -1) @ a.reshape(rank, -1)) * scale
        if "diff" in parts:
            diff = get(parts["diff"])
            weight = diff if weight is None else weight.reshape(diff.shape) + diff
        if weight is not None:
            for key, piece in zip(edit.weight.ours, edit.weight.from_native(weight)):
                yield key, piece
        if "diff_b" in parts:
            for key, piece in zip(edit.bias.ours, edit.bias.from_native(get(parts["diff_b"]))):
                yield key, piece


def assignments(lora: LoraFile, handle, device) -> Iterable[tuple[str, torch.Tensor]]:
    """(our parameter, the float32 value it is set to) for every `.set_weight` of the file (read_lora(assigned=True)),
    one module at a time; applied after the deltas (FastH3's reconstruction order)."""
    for edit in lora.edits:
        if "set" in edit.parts:
            value = handle.get_tensor(edit.parts["set"]).to(device, torch.float32)
            yield from zip(edit.weight.ours, edit.weight.from_native(value))


def check_lora_finite(lora: LoraFile, handle, device) -> None:
    """CheckpointError naming the file and its first tensors holding NaN / Inf (checked on `device`, one sync)."""
    finite = FiniteCheck(lora.path)
    for edit in lora.edits:
        for key in edit.parts.values():
            finite.add(key, handle.get_tensor(key).to(device))
    finite.verify()
