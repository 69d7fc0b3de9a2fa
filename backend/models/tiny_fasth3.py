"""A tiny FastH3 student over the tiny H3 set (tiny.py): a random adapter in the released layout (fasth3.py), so the
student path -- fusion at load, the learned VSA gates, the 4-step schedule -- runs on a CPU in seconds. Random
weights: what it generates is noise-like, like the tiny set's.

Which modules carry what mirrors the release's own accounting (its metadata: 724 low-rank tensors, 82 diffs, 50
gates; docs/FASTH3.md): low-rank factors on every block's to_q / to_k / to_v / to_out.0 / ff.net.0.proj / ff.net.2 /
adaln_proj.linear and the refiner blocks' same projections (50 x 7 + 2 x 6 = 362 pairs); a bias diff on every bias (8
model-level + one per block = 58); a gate in every block. Which 24 weights the release gives a full `.diff` is not
established; here: the model-level projections and norms and every block's norm1 / norm2 (the loader takes a diff on
any weight).

Keep this module pure: no printing; deterministic (one torch.Generator, tensors drawn in a fixed order).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .fasth3 import FORMAT

TINY_STUDENT_RANK = 4
TINY_STUDENT_SEED = 1515
LOW_RANK = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
MODEL_LEVEL_DIFFS = ("proj_in", "audio_proj_in", "context_embedder", "time_embedder.linear_1",
                     "time_embedder.linear_2", "norm_out.linear", "norm_out.norm", "proj_out", "audio_proj_out")


def student_layout(shapes: dict[str, tuple]) -> tuple[list[str], list[str], list[str]]:
    """A DiT's parameter shapes -> (modules with low-rank factors, weights with a diff, biases with a diff)."""
    blocks = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("transformer_blocks.")})
    refiner = sorted({int(k.split(".")[2]) for k in shapes if k.startswith("token_refiner.refiner_blocks.")})
    low_rank = [f"transformer_blocks.{i}.{m}" for i in blocks for m in LOW_RANK + ("adaln_proj.linear",)]
    low_rank += [f"token_refiner.refiner_blocks.{i}.{m}" for i in refiner for m in LOW_RANK]
    diffs = [f"{m}.weight" for m in MODEL_LEVEL_DIFFS]
    diffs += [f"{prefix}.{i}.{norm}.weight" for prefix, ids in (("transformer_blocks", blocks),
                                                                 ("token_refiner.refiner_blocks", refiner))
              for i in ids for norm in ("norm1", "norm2")]
    biases = sorted(k for k in shapes if k.endswith(".bias"))
    return low_rank, diffs, biases


def make_tiny_fasth3(out_file: str | os.PathLike, config: dict | None = None, gates: bool = True,
                     rank: int = TINY_STUDENT_RANK, seed: int = TINY_STUDENT_SEED,
                     dtype: torch.dtype = torch.float32) -> Path:
    """Write a random student adapter for a DiT of `config` (default: the tiny set's transformer; a released
    transformer/config.json's dict gives a full-size random student for timing, e.g. rank 64 in bfloat16) to
    `out_file` (written beside it and renamed into place). `gates`: the VSA variant (learned gates in every block)."""
    from safetensors.torch import save_file

    from .checkpoint import meta_shapes
    from .h3_transformer import H3Transformer, H3TransformerConfig
    from .tiny import TINY_TRANSFORMER_CONFIG

    cfg = H3TransformerConfig.from_dict(dict(config or TINY_TRANSFORMER_CONFIG))
    shapes = meta_shapes(lambda: H3Transformer(cfg))
    low_rank, diffs, biases = student_layout(shapes)
    gen = torch.Generator("cpu").manual_seed(seed)

    def draw(shape, scale):
        return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).contiguous()

    tensors: dict[str, torch.Tensor] = {}
    for module in low_rank:
        out_dim, in_dim = shapes[f"{module}.weight"]
        # scaled by fan-in, so a full-size random student stays finite too
        tensors[f"{module}.lora_A.weight"] = draw((rank, in_dim), in_dim ** -0.5)
        tensors[f"{module}.lora_B.weight"] = draw((out_dim, rank), 0.2 * rank ** -0.5)
    for key in diffs:
        tensors[key[: -len(".weight")] + ".diff"] = draw(shapes[key], 0.05)
    for key in biases:
        tensors[key[: -len(".bias")] + ".diff_b"] = draw(shapes[key], 0.05)
    if gates:
        for i in range(cfg.num_layers):
            tensors[f"transformer_blocks.{i}.attn.to_gate_compress.set_weight"] = draw(
                shapes[f"transformer_blocks.{i}.attn.to_q.weight"], 0.5 * cfg.hidden_size ** -0.5)
    metadata = {
        "format": FORMAT, "base_model": "comfyui-h3/tiny-h3", "rank": str(rank),
        "finetuned_model": "comfyui-h3/tiny-fasth3" + ("-vsa" if gates else "-dense") + " (random weights)",
        "low_rank_tensors": str(2 * len(low_rank)), "diff_tensors": str(len(diffs) + len(biases)),
        "set_weight_tensors": str(cfg.num_layers if gates else 0),
        "application": "W = W_base + lora_B @ lora_A; then .diff/.diff_b added and .set_weight assigned",
    }
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(staging), metadata=metadata)
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    return out
