"""Writing H3 LoRA files in each layout models/lora.py reads, from low-rank factors and diffs given in our module
names: what tools/write_lora.py and the tests make their files with (and a way to convert a LoRA between layouts).

`factors`: {our module (e.g. "transformer_blocks.0.attn.to_q"): (A [r, in], B [out, r])}; `alphas`: {module: alpha}
(the file then stores alpha and its reader scales by alpha / r); `diffs`: {our parameter (".weight" / ".bias"):
delta}. Layouts:

- "diffusers": `transformer.<module>.lora_A.weight` / `.lora_B.weight` / `.alpha`
- "peft": `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`, the alpha in the header's
  `lora_adapter_metadata` (one lora_alpha and r for the file, as PEFT writes it)
- "kohya": `lora_unet_<module, "." as "_">.lora_down.weight` / `.lora_up.weight` / `.alpha`
- "native": ComfyUI's native names, `diffusion_model.<native module>.lora_A.weight` / `.lora_B.weight` / `.alpha`:
  q, k, v of a block join into its `qkv_proj` (A stacked, B block-diagonal: B @ A is the three deltas stacked; the
  three need one rank and one alpha), the SwiGLU input's B rows swapped into the native [gate | value] order.
Diffs keep `.diff` / `.diff_b` under each layout's naming (native: a q/k/v diff joins into qkv_proj's).
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import torch
from safetensors.torch import save_file

from .native_keys import transformer_map

LAYOUTS = ("diffusers", "peft", "kohya", "native")


def _native_links(our_keys):
    """our weight / bias key -> (its native link, index among the link's members)."""
    return {key: (link, i) for link in transformer_map(our_keys).links for i, key in enumerate(link.ours)}


def lora_tensors(factors: Mapping[str, tuple], layout: str, our_keys, alphas: Mapping[str, float] | None = None,
                 diffs: Mapping[str, torch.Tensor] | None = None) -> tuple[dict, dict]:
    """(tensors, header metadata) of a LoRA file in `layout`; `our_keys`: the model's parameter names (the native
    layout needs them to find which of our tensors join)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    alphas = dict(alphas or {})
    diffs = dict(diffs or {})
    out: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    if layout == "peft":
        ranks = {a.shape[0] for a, _ in factors.values()}
        values = {alphas.get(m) for m in factors}
        if len(values) > 1 or len(ranks) > 1:
            raise ValueError("the peft layout states one lora_alpha and r for the file: give one rank and one alpha")
        alpha = values.pop() if values else None
        if alpha is not None:
            metadata["lora_adapter_metadata"] = json.dumps({"r": ranks.pop(), "lora_alpha": alpha})
        alphas = {}
    if layout == "native":
        factors, alphas, diffs = _join_native(factors, alphas, diffs, list(our_keys))
    names = {"diffusers": ("transformer.{}", ".lora_A.weight", ".lora_B.weight"),
             "peft": ("base_model.model.{}", ".lora_A.weight", ".lora_B.weight"),
             "kohya": ("lora_unet_{}", ".lora_down.weight", ".lora_up.weight"),
             "native": ("diffusion_model.{}", ".lora_A.weight", ".lora_B.weight")}
    form, a_suffix, b_suffix = names[layout]

    def name(module: str) -> str:
        return form.format(module.replace(".", "_") if layout == "kohya" else module)

    for module, (a, b) in factors.items():
        out[name(module) + a_suffix] = a.contiguous()
        out[name(module) + b_suffix] = b.contiguous()
        if module in alphas:
            out[name(module) + ".alpha"] = torch.tensor(float(alphas[module]), dtype=a.dtype)
    for param, delta in diffs.items():
        module, _, kind = param.rpartition(".")
        out[name(module) + (".diff" if kind == "weight" else ".diff_b")] = delta.contiguous()
    return out, metadata


def _join_native(factors, alphas, diffs, our_keys):
    links = _native_links(our_keys)
    joined, joined_alpha, joined_diffs = {}, {}, {}
    groups: dict = {}
    for module, pair in factors.items():
        link, i = links[module + ".weight"]
        groups.setdefault(link, {})[i] = (module, pair)
    for link, members in groups.items():
        native = link.native[: -len(".weight")]
        if len(members) != len(link.ours):
            raise ValueError(f"the native layout joins {', '.join(link.ours)} into {link.native}: give factors "
                             "for all of them")
        ordered = [members[i] for i in range(len(link.ours))]
        ranks = {pair[0].shape[0] for _, pair in ordered}
        module_alphas = {alphas.get(m) for m, _ in ordered}
        if len(ranks) > 1 or len(module_alphas) > 1:
            raise ValueError(f"{link.native} joins {len(ordered)} modules: they need one rank and one alpha")
        a = torch.cat([pair[0] for _, pair in ordered])
        b = torch.block_diag(*[pair[1] for _, pair in ordered])
        if link.kind == "swap":
            b = link.to_native([b])
        # A stacked k times is rank k*r with each block's delta scaled by alpha / (k*r): alpha scales by k to keep it
        alpha = module_alphas.pop()
        if alpha is not None:
            joined_alpha[native] = alpha * len(ordered)
        joined[native] = (a, b)
    diff_groups: dict = {}
    for param, delta in diffs.items():
        link, i = links[param]
        diff_groups.setdefault(link, {})[i] = delta
    for link, members in diff_groups.items():
        if len(members) != len(link.ours):
            raise ValueError(f"the native layout joins {', '.join(link.ours)} into {link.native}: give diffs for "
                             "all of them")
        joined_diffs[link.native] = link.to_native([members[i] for i in range(len(link.ours))])
    return joined, joined_alpha, joined_diffs


def write_lora(path: str | os.PathLike, factors: Mapping[str, tuple], layout: str, our_keys,
               alphas: Mapping[str, float] | None = None, diffs: Mapping[str, torch.Tensor] | None = None) -> str:
    """Write the file (a new path only: an existing file is never replaced); its path."""
    path = os.fspath(path)
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists; write the LoRA to a new file.")
    tensors, metadata = lora_tensors(factors, layout, our_keys, alphas, diffs)
    tmp = f"{path}.{os.getpid()}.partial"  # never seen as complete until renamed
    try:
        save_file(tensors, tmp, metadata=metadata or None)
        if os.path.exists(path):
            raise FileExistsError(f"{path} appeared while the LoRA was written; it is left as it is.")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


LOW_RANK_MODULES = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2",
                    "adaln_proj.linear")


def random_lora(shapes, rank: int, seed: int, dtype: torch.dtype = torch.float32, alpha: float | None = None):
    """(factors, alphas) of a random LoRA on every DiT block's attention, MLP and AdaLN projections (shapes: the
    model's parameter names -> shapes), as a creator's LoRA over all blocks; A scaled by fan-in and B small so a
    full-size one keeps the weights finite. `alpha` None: the file stores alpha = rank (scale 1)."""
    gen = torch.Generator("cpu").manual_seed(seed)
    blocks = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("transformer_blocks.")})
    factors, alphas = {}, {}
    for i in blocks:
        for m in LOW_RANK_MODULES:
            module = f"transformer_blocks.{i}.{m}"
            if f"{module}.weight" not in shapes:
                continue
            out_dim, in_dim = shapes[f"{module}.weight"]
            a = torch.randn(rank, in_dim, generator=gen) * in_dim ** -0.5
            b = torch.randn(out_dim, rank, generator=gen) * 0.1 * rank ** -0.5
            factors[module] = (a.to(dtype), b.to(dtype))
            alphas[module] = float(rank if alpha is None else alpha)
    return factors, alphas


def make_random_lora(out_file: str | os.PathLike, config: dict | None = None, rank: int = 4, seed: int = 2024,
                     layout: str = "kohya", dtype: torch.dtype = torch.float32) -> str:
    """A random LoRA for a DiT of `config` (default: the tiny set's transformer; a released config.json's dict
    gives a full-size one for timing) written to `out_file` in `layout`."""
    from .checkpoint import meta_shapes
    from .h3_transformer import H3Transformer, H3TransformerConfig
    from .tiny import TINY_TRANSFORMER_CONFIG

    cfg = H3TransformerConfig.from_dict(dict(config or TINY_TRANSFORMER_CONFIG))
    shapes = meta_shapes(lambda: H3Transformer(cfg))
    factors, alphas = random_lora(shapes, rank, seed, dtype)
    return write_lora(out_file, factors, layout, shapes, alphas)
