"""Ulysses scaling on several GPUs of one host (NCCL): a full-width H3 DiT with `--layers` blocks (bf16, random
weights, the same on every rank) at the 5/10/15-s 1344x768 shapes, degree 1 (plain forward on GPU 0) vs degree N.

    python bench/sp_scaling.py --world 2 [--seconds 5 10 15] [--layers 2] [--iters 5] [--peer] [--json OUT]

Reports per shape: ms per forward at degree 1 and N, efficiency t1 / (N * tN), the all-to-all time of one block's
four exchanges (q, k, v out, attention back) measured alone on the same tensors and its share of the forward, peak
memory per rank, and the degree-N output against degree 1 on identical inputs (relative L2, bf16). Ours gets what the
engine passes every step (rotary tables and AdaLN row segments built once on the host, denoise.py); without
them the forward builds the segments from device tensors, a host sync per call that costs ~100 ms at degree 2. `--peer`: the same
weights in diffusers' MiniMaxH3Transformer3DModel (cuDNN SDPA backend), plain on GPU 0 and with its own Ulysses
context parallelism (`enable_parallelism(ContextParallelConfig(ulysses_degree=N))`), in the same run.
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
from comfyui_h3.backend.pipelines.h3.step_plan import request_rope, step_segments  # noqa: E402

TEXT_ROWS = 502


def _models(layers: int, dev, peer: bool):
    """(ours, diffusers' MiniMaxH3Transformer3DModel with the same weights or None); rank 0's weights everywhere."""
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
    ref = None
    if peer:  # our checkpoint keys are the release's (before fusing): the peer loads the same tensors
        from diffusers import MiniMaxH3Transformer3DModel

        with torch.device("meta"):
            ref = MiniMaxH3Transformer3DModel(num_layers=layers, num_refiner_layers=1)
        ref = ref.to_empty(device=dev).to(torch.bfloat16)
        missing, unexpected = ref.load_state_dict(model.state_dict(), strict=False)
        buffers = {name for name, _ in ref.named_buffers()}
        if [k for k in missing if k not in buffers] or unexpected:
            raise RuntimeError(f"peer weights do not line up: missing {missing[:5]}, unexpected {unexpected[:5]}")
        ref.set_attention_backend("_native_cudnn")  # the same SDPA kernel family ours dispatches to
        ref.eval()
    model.fuse_projections()
    return model.eval(), ref


def _step_tables(model, host_layout, row_index, dev, shard=None):
    """What the engine builds once per request / step on the host and passes to every forward (step_plan, as
    denoise.py does): the rotary tables and the AdaLN row segments of this rank's rows."""
    return {"rope": request_rope(model, host_layout.position_ids.to(dev), shard),
            "segments": step_segments(host_layout.token_tags, row_index, shard)}


def _inputs(seconds: float, cfg, dev):
    """(host layout, host row index, device inputs in forward order)."""
    import torch.distributed as dist

    geo = resolve_geometry(frames_for_seconds(seconds), 768, 1344)
    host_layout = build_layout(torch.ones(TEXT_ROWS, dtype=torch.long), geo, cfg.patch_size)
    ts, idx = row_timestep_plan(host_layout, 0.4, 0.6)
    layout = host_layout.to(dev)
    g = torch.Generator(device=dev).manual_seed(1)
    tensors = [torch.randn(1, layout.video_indices.numel(), 96, device=dev, generator=g),
               torch.randn(1, layout.audio_indices.numel(), 32, device=dev, generator=g),
               torch.randn(1, TEXT_ROWS, cfg.text_dim, device=dev, generator=g, dtype=torch.bfloat16)]
    for t in tensors:
        dist.broadcast(t, src=0)
    return host_layout, idx, (*tensors, ts.to(dev), idx.to(dev), layout.token_tags, layout.position_ids,
                              layout.video_indices, layout.audio_indices, layout.text_indices)


def _profile(rank: int, title: str, fn) -> None:
    """The CUDA kernels of one forward on every rank (collectives need all of them), printed by rank 0."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    if rank == 0:
        print(f"== {title}\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70),
              flush=True)


def _rank(rank: int, world: int, port: int, args, out_path: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device(f"cuda:{rank}")
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    model, ref = _models(args.layers, dev, args.peer)
    results = {"world": world, "layers": args.layers, "device": torch.cuda.get_device_name(dev), "shapes": {}}
    peer_rows = {}
    if ref is not None:  # diffusers' plain forward on GPU 0 first, then its own Ulysses context parallelism
        for seconds in args.seconds:
            _, _, inputs = _inputs(seconds, model.config, dev)
            if rank == 0:
                with torch.no_grad():
                    peer_rows[seconds] = {"peer_degree1_ms": timed(lambda: ref(*inputs, return_dict=False),
                                                                   args.iters)[0]}
            dist.barrier()
        from diffusers import ContextParallelConfig

        ref.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    for seconds in args.seconds:
        layout, row_index, inputs = _inputs(seconds, model.config, dev)
        shard = SequenceShard(rank, world, layout.seq_len)
        plain_kw = _step_tables(model, layout, row_index, dev)
        sp_kw = dict(_step_tables(model, layout, row_index, dev, shard), shard=shard)
        row = {"rows": layout.seq_len}
        with torch.no_grad():
            reference = None
            if rank == 0:
                reference = model(*inputs, **plain_kw)[0].float()
                row["degree1_ms"], row["degree1_peak_gib"] = timed(lambda: model(*inputs, **plain_kw), args.iters)
            dist.barrier()
            torch.cuda.empty_cache()
            out = model(*inputs, **sp_kw)[0].float()
            if rank == 0:
                row["rel_l2_vs_degree1"] = ((out - reference).norm() / reference.norm()).item()
            del reference, out
            ms, peak = timed(lambda: model(*inputs, **sp_kw), args.iters)
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
        if ref is not None:
            with torch.no_grad():
                peer_out = ref(*inputs, return_dict=False)[0].float()
                ours_out = model(*inputs, **sp_kw)[0].float()
                peer_ms = timed(lambda: ref(*inputs, return_dict=False), args.iters)[0]
            if rank == 0:
                row.update(peer_rows.get(seconds, {}))
                row[f"peer_degree{world}_ms"] = peer_ms
                row["peer_efficiency"] = row["peer_degree1_ms"] / (world * peer_ms)
                row["ours_over_peer"] = ms / peer_ms
                row["rel_l2_vs_peer"] = ((ours_out - peer_out).norm() / peer_out.norm()).item()
            del peer_out, ours_out
        if args.profile:
            _profile(rank, f"ours degree {world}, {seconds:g} s", lambda: model(*inputs, **sp_kw))
            if ref is not None:
                _profile(rank, f"diffusers degree {world}, {seconds:g} s", lambda: ref(*inputs, return_dict=False))
        if rank == 0:
            row["efficiency"] = row["degree1_ms"] / (world * ms)
            results["shapes"][f"{seconds:g}s"] = row
            print(json.dumps({f"{seconds:g}s": row}), flush=True)
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(results, handle, indent=1)
    dist.barrier()  # gloo aborts a peer whose connection closes mid-read
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--seconds", type=float, nargs="+", default=[5.0, 10.0, 15.0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", default="sp_scaling.json")
    ap.add_argument("--peer", action="store_true", help="also diffusers' own Ulysses (enable_parallelism)")
    ap.add_argument("--profile", action="store_true", help="print each forward's top CUDA kernels (rank 0)")
    args = ap.parse_args()
    if args.world < 2:
        raise SystemExit("sp_scaling needs at least 2 CUDA devices (bench/sp_overhead.py covers degree 1).")
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(args.world, _free_port(), args, os.path.abspath(args.json)), nprocs=args.world)
    with open(args.json) as handle:
        print(json.dumps(json.load(handle), indent=1))


if __name__ == "__main__":
    main()
