"""Cost of the sequence-parallel code path at degree 1, and the all-to-all plan's bytes per layer.

    python bench/sp_overhead.py [--seconds 10] [--layers 2] [--iters 5] [--json OUT]

On one GPU: a full-width H3 DiT with `--layers` blocks (bf16, random weights) at the 10-s 1344x768 shape, plain
forward vs the Ulysses path with a 1-rank NCCL group (sharding, all-to-all, row gather all exercised), same inputs,
CUDA events. Then the bytes one rank sends per block for degrees 2/4/8 at 5/10/15 s (computed, bf16 q/k/v/out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cuda_timing import timed  # noqa: E402  (bench/ is on sys.path when a script runs)

from comfyui_h3.backend.executor.mp_executor import _free_port  # noqa: E402
from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig  # noqa: E402
from comfyui_h3.backend.parallel.ulysses import SequenceShard, alltoall_bytes_per_layer  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds, resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan  # noqa: E402


def rows_for(seconds: float, text: int = 502) -> int:
    geo = resolve_geometry(frames_for_seconds(seconds), 768, 1344)
    return text + geo.audio_latents * 2 + geo.latent_frames * (geo.latent_height // 2) * (geo.latent_width // 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    plan = {f"{s}s": {"rows": rows_for(s), **{f"degree{d}_MB": alltoall_bytes_per_layer(rows_for(s), d) / 1e6
                                             for d in (2, 4, 8)}} for s in (5, 10, 15)}
    results = {"alltoall_plan_per_block": plan}
    if torch.cuda.is_available():
        import torch.distributed as dist

        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        dev = torch.device("cuda:0")
        cfg = H3TransformerConfig(num_layers=args.layers, num_refiner_layers=1)
        with torch.device("meta"):
            model = H3Transformer(cfg)
        model = model.to_empty(device=dev).to(torch.bfloat16)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.02)
        model.rope_inv_freq = model.rope_inv_freq.float()
        model.fuse_projections()
        model.eval()
        geo = resolve_geometry(frames_for_seconds(args.seconds), 768, 1344)
        layout = build_layout(torch.ones(502, dtype=torch.long), geo, cfg.patch_size).to(dev)
        ts, idx = row_timestep_plan(layout, 0.4, 0.6)
        g = torch.Generator(device=dev).manual_seed(0)
        inputs = (torch.randn(1, layout.video_indices.numel(), 96, device=dev, generator=g),
                  torch.randn(1, layout.audio_indices.numel(), 32, device=dev, generator=g),
                  torch.randn(1, 502, cfg.text_dim, device=dev, generator=g, dtype=torch.bfloat16),
                  ts.to(dev), idx.to(dev), layout.token_tags, layout.position_ids, layout.video_indices,
                  layout.audio_indices, layout.text_indices)
        shard = SequenceShard(0, 1, layout.seq_len)
        with torch.no_grad():
            plain = model(*inputs)
            sp = model(*inputs, shard=shard)
            results["sp1_vs_plain_video_rel_err"] = ((sp[0].float() - plain[0].float()).norm()
                                                     / plain[0].float().norm()).item()
            results["plain_ms"] = timed(lambda: model(*inputs), args.iters)[0]
            results["sp1_ms"] = timed(lambda: model(*inputs, shard=shard), args.iters)[0]
        results["sp1_over_plain"] = results["sp1_ms"] / results["plain_ms"]
        results.update(rows=layout.seq_len, layers=args.layers, device=torch.cuda.get_device_name())
        dist.barrier()  # gloo aborts a peer whose connection closes mid-read
        dist.destroy_process_group()
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
