"""Ulysses scaling on several GPUs of one host (NCCL): a full-width H3 DiT with `--layers` blocks (bf16, random
weights, the same on every rank) at the 5/10/15-s 1344x768 shapes, degree 1 (plain forward on GPU 0) vs degree N.

    python bench/sp_scaling.py --world 2 [--seconds 5 10 15] [--layers 2] [--iters 5] [--json OUT]

Reports per shape: ms per forward at degree 1 and N, efficiency t1 / (N * tN), the all-to-all time of one block's
four exchanges (q, k, v out, attention back) measured alone on the same tensors and its share of the forward, peak
memory per rank, and the degree-N output against degree 1 on identical inputs (relative L2, bf16).
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
from comfyui_h3.backend.parallel.ulysses import SequenceShard, _heads_to_rows, _rows_to_heads  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds, resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan  # noqa: E402

TEXT_ROWS = 502


def _model(layers: int, dev) -> H3Transformer:
    import torch.distributed as dist

    cfg = H3TransformerConfig(num_layers=layers, num_refiner_layers=1)
    with torch.device("meta"):
        model = H3Transformer(cfg)
    model = model.to_empty(device=dev).to(torch.bfloat16)
    with torch.no_grad():
        gen = torch.Generator(device=dev).manual_seed(0)
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen)
            dist.broadcast(p.data, src=0)  # every rank holds rank 0's weights
    model.rope_inv_freq = model.rope_inv_freq.float()
    model.fuse_projections()
    return model.eval()


def _inputs(seconds: float, cfg, dev):
    import torch.distributed as dist

    geo = resolve_geometry(frames_for_seconds(seconds), 768, 1344)
    layout = build_layout(torch.ones(TEXT_ROWS, dtype=torch.long), geo, cfg.patch_size).to(dev)
    ts, idx = row_timestep_plan(layout, 0.4, 0.6)
    g = torch.Generator(device=dev).manual_seed(1)
    tensors = [torch.randn(1, layout.video_indices.numel(), 96, device=dev, generator=g),
               torch.randn(1, layout.audio_indices.numel(), 32, device=dev, generator=g),
               torch.randn(1, TEXT_ROWS, cfg.text_dim, device=dev, generator=g, dtype=torch.bfloat16)]
    for t in tensors:
        dist.broadcast(t, src=0)
    return layout, (*tensors, ts.to(dev), idx.to(dev), layout.token_tags, layout.position_ids, layout.video_indices,
                    layout.audio_indices, layout.text_indices)


def _rank(rank: int, world: int, port: int, args, out_path: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device(f"cuda:{rank}")
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    model = _model(args.layers, dev)
    results = {"world": world, "layers": args.layers, "device": torch.cuda.get_device_name(dev), "shapes": {}}
    for seconds in args.seconds:
        layout, inputs = _inputs(seconds, model.config, dev)
        shard = SequenceShard(rank, world, layout.seq_len)
        row = {"rows": layout.seq_len}
        with torch.no_grad():
            reference = None
            if rank == 0:
                reference = model(*inputs)[0].float()
                row["degree1_ms"], row["degree1_peak_gib"] = timed(lambda: model(*inputs), args.iters)
            dist.barrier()
            torch.cuda.empty_cache()
            out = model(*inputs, shard=shard)[0].float()
            if rank == 0:
                row["rel_l2_vs_degree1"] = ((out - reference).norm() / reference.norm()).item()
            del reference, out
            ms, peak = timed(lambda: model(*inputs, shard=shard), args.iters)
            heads, dim = model.config.num_attention_heads, model.config.attention_head_dim
            local = torch.randn(1, shard.local_len, heads, dim, device=dev, dtype=torch.bfloat16)

            def exchanges():
                spread = _rows_to_heads(local, shard)
                for _ in range(2):
                    _rows_to_heads(local, shard)
                return _heads_to_rows(spread, shard)

            a2a_ms = timed(exchanges, args.iters)[0] if world > 1 else 0.0
        peaks = [torch.zeros(1, device=dev) for _ in range(world)]
        dist.all_gather(peaks, torch.tensor([peak], device=dev))
        row.update({f"degree{world}_ms": ms, f"degree{world}_peak_gib_per_rank": [p.item() for p in peaks],
                    "alltoall_ms_per_block": a2a_ms,
                    "alltoall_share": a2a_ms * args.layers / ms if ms else 0.0})  # refiner: text only, no exchange
        if rank == 0:
            row["efficiency"] = row["degree1_ms"] / (world * ms)
            results["shapes"][f"{seconds:g}s"] = row
            print(json.dumps({f"{seconds:g}s": row}), flush=True)
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(results, handle, indent=1)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--seconds", type=float, nargs="+", default=[5.0, 10.0, 15.0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", default="sp_scaling.json")
    args = ap.parse_args()
    if args.world < 2:
        raise SystemExit("sp_scaling needs at least 2 CUDA devices (bench/sp_overhead.py covers degree 1).")
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(args.world, _free_port(), args, os.path.abspath(args.json)), nprocs=args.world)
    with open(args.json) as handle:
        print(json.dumps(json.load(handle), indent=1))


if __name__ == "__main__":
    main()
