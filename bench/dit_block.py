"""Our MiniMax-H3 block vs diffusers' MiniMaxH3TransformerBlock at the released size, same random bf16 weights,
same inputs, one GPU. Default shape: 10 s at 1344x768 (243 frames -> 72 latent frames -> 72,576 video rows + 810
audio rows + 502 text rows = 73,888 rows).

    python bench/dit_block.py [--seconds 10] [--iters 5] [--compile [--tuned]] [--profile] [--json OUT.json]

--profile: kernel-by-kernel tables (bench/kernel_profile.py) of diffusers' block and ours (compiled when --compile):
where the time outside the GEMMs and attention goes. --tuned: also compile ours with the engine's block options
(components.block_compile_options: Inductor's coordinate-descent tuning) and time that.

Prints per-variant median ms, peak memory, and our/diffusers ratio; checks outputs agree (bf16 rel err).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cuda_timing import timed  # noqa: E402  (bench/ is on sys.path when a script runs)
from kernel_profile import kernel_table, print_table  # noqa: E402

from comfyui_h3.backend.attention.dispatch import get_attention  # noqa: E402
from comfyui_h3.backend.models.h3_ops import RowSegments, rope_inv_freq, rope_tables  # noqa: E402
from comfyui_h3.backend.models.h3_transformer import H3Block, H3TransformerConfig  # noqa: E402
from comfyui_h3.backend.models.tiny import TINY_TRANSFORMER_CONFIG  # noqa: E402
from comfyui_h3.backend.pipelines.h3.components import block_compile_options  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan  # noqa: E402


def time_qkv_variant(variant: str, cfg, ref, inputs: dict, args, compile_backend: str, profiles: dict) -> dict:
    """Our block with another QKV layout, compiled (with coordinate-descent tuning under --tuned): median ms, and the
    attention kernel's own ms from a profile (--profile) -- the layout of q/k/v is what cuDNN sees."""
    if variant not in ("separate", "fused_contiguous_v"):
        raise SystemExit(f"unknown --qkv-variants entry {variant!r}")
    block = H3Block(cfg).to(inputs["x"].device, inputs["x"].dtype).eval()
    block.load_state_dict(ref.state_dict())
    attention = inputs["attention"]
    if variant == "fused_contiguous_v":
        block.attn.fuse_qkv()
        dense = attention

        def attention(q, k, v, plan=None):
            return dense(q, k, v.contiguous(), plan)

    block.compile(backend=compile_backend, options=block_compile_options(compile_backend) if args.tuned else None)

    @torch.no_grad()
    def run():
        return block(inputs["x"].clone(), block.adaln_proj(inputs["temb"]), inputs["segments"], inputs["rope"],
                     attention)

    out = {}
    out[f"compiled_{variant}_ms"], out[f"compiled_{variant}_peak_gib"] = timed(run, args.iters, warmup=3)
    if args.profile:
        rows, totals = kernel_table(run, iters=3)
        print_table(f"ours_compiled_{variant}", rows, totals)
        profiles[f"ours_compiled_{variant}"] = {"kernels": rows, "totals_ms": totals}
        out.update({f"compiled_{variant}_{kind}_ms": ms for kind, ms in totals.items()})
    del block
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--text", type=int, default=502)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tuned", action="store_true", help="with --compile: also Inductor coordinate-descent tuning")
    ap.add_argument("--profile", action="store_true", help="kernel tables of diffusers' block and ours")
    ap.add_argument("--qkv-variants", default="",
                    help="with --compile: also time these compiled QKV layouts (comma list of: separate = three "
                         "GEMMs, contiguous q/k/v as diffusers has them; fused_contiguous_v = the fused GEMM with V "
                         "copied contiguous before attention)")
    ap.add_argument("--json")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU (a dry run: every part runs)")
    args = ap.parse_args()
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

    if args.tiny:
        dev, cfg, (height, width), args.text, args.iters = torch.device("cpu"), \
            H3TransformerConfig.from_dict(TINY_TRANSFORMER_CONFIG), (64, 96), 9, 2
    else:
        if not torch.cuda.is_available():
            sys.exit("bench/dit_block.py needs a CUDA GPU (or --tiny for a CPU dry run).")
        dev, cfg, (height, width) = torch.device("cuda"), H3TransformerConfig(), (768, 1344)
    dtype = torch.bfloat16
    geo = resolve_geometry(int(round(args.seconds * 24)), height, width)
    tags = torch.ones(args.text, dtype=torch.long)
    layout = build_layout(tags, geo, cfg.patch_size)
    ts, row_idx = row_timestep_plan(layout, 0.4, 0.6)
    adaln_rows = row_idx * 3 + layout.token_tags
    seq = layout.seq_len
    heads, head_dim = cfg.num_attention_heads, cfg.attention_head_dim
    print(f"shape: {args.seconds:g} s {width}x{height} -> {seq} rows; heads {heads}x{head_dim}; bf16; "
          f"torch {torch.__version__}; {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}", flush=True)

    torch.manual_seed(0)
    ref = MiniMaxH3TransformerBlock(cfg.hidden_size, cfg.num_attention_heads, cfg.attention_head_dim, cfg.ffn_dim,
                                    cfg.time_embed_dim, cfg.norm_eps, cfg.qk_norm_eps).to(dev, dtype).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.02)
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
    ours = H3Block(cfg).to(dev, dtype).eval()
    ours.load_state_dict(ref.state_dict())
    ours.attn.fuse_qkv()
    n_params = sum(p.numel() for p in ref.parameters())

    x = torch.randn(1, seq, cfg.hidden_size, device=dev, dtype=dtype)
    temb = torch.randn(ts.numel(), cfg.time_embed_dim, device=dev, dtype=torch.float32)
    cos, sin = rope_tables(layout.position_ids.to(dev), rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta).to(dev))
    adaln_dev = adaln_rows.to(dev)
    segments = RowSegments.from_rows(adaln_rows)
    attention = get_attention("sdpa")

    @torch.no_grad()
    def run_ref():
        return ref(x, temb, adaln_dev, (cos, sin))

    @torch.no_grad()
    def run_ours():
        return ours(x.clone(), ours.adaln_proj(temb), segments, (cos, sin), attention)

    results = {}
    compile_backend = "aot_eager" if args.tiny else "inductor"  # the CPU dry run checks the path, not Inductor's C++
    want = run_ref()
    got = run_ours()
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    del want, got
    results["diffusers_block_ms"], results["diffusers_peak_gib"] = timed(run_ref, args.iters)
    results["ours_block_ms"], results["ours_peak_gib"] = timed(run_ours, args.iters)
    if args.compile:
        ours.compile(backend=compile_backend)  # regional compilation, as the engine does (compile_blocks)
        results["ours_compiled_ms"], results["ours_compiled_peak_gib"] = timed(run_ours, args.iters, warmup=3)
        got = run_ours()
        want = run_ref()
        results["compiled_bf16_rel_err_vs_diffusers"] = ((got.float() - want.float()).norm()
                                                         / want.float().norm()).item()
        del got, want
    profiles = {}
    if args.profile:
        for label, fn in (("diffusers", run_ref), ("ours_compiled" if args.compile else "ours_eager", run_ours)):
            rows, totals = kernel_table(fn, iters=3)
            print_table(label, rows, totals)
            profiles[label] = {"kernels": rows, "totals_ms": totals}
    for variant in filter(None, args.qkv_variants.split(",")) if args.compile else ():
        inputs = dict(x=x, temb=temb, segments=segments, rope=(cos, sin), attention=attention)
        results.update(time_qkv_variant(variant, cfg, ref, inputs, args, compile_backend, profiles))
    if args.compile and args.tuned:
        from torch._dynamo import reset as dynamo_reset

        dynamo_reset()
        ours.compile(backend=compile_backend, options=block_compile_options(compile_backend))  # the engine's options
        results["ours_tuned_ms"], _ = timed(run_ours, args.iters, warmup=3)
        if args.profile:
            rows, totals = kernel_table(run_ours, iters=3)
            print_table("ours_compiled_tuned", rows, totals)
            profiles["ours_compiled_tuned"] = {"kernels": rows, "totals_ms": totals}

    # Floors at this shape: attention alone (cuDNN SDPA) and the block's GEMMs alone.
    q = torch.randn(1, seq, heads, head_dim, device=dev, dtype=dtype)
    results["sdpa_only_ms"], _ = timed(lambda: attention(q, q, q), args.iters)
    qc = q.transpose(1, 2).contiguous()  # [B, H, S, D] contiguous: does the layout matter to cuDNN?
    cudnn_only = [torch.nn.attention.SDPBackend.CUDNN_ATTENTION] if dev.type == "cuda" else \
        [torch.nn.attention.SDPBackend.MATH]
    with torch.nn.attention.sdpa_kernel(cudnn_only):
        results["sdpa_bhsd_contiguous_ms"], _ = timed(
            lambda: torch.nn.functional.scaled_dot_product_attention(qc, qc, qc), args.iters)
    # q/k/v as views of one fused [B, S, 3, H, D] buffer (rows 3x wider apart), all three or V alone
    qkv = torch.randn(1, seq, 3, heads, head_dim, device=dev, dtype=dtype)
    fq, fk, fv = qkv.unbind(2)
    results["sdpa_fused_views_ms"], _ = timed(lambda: attention(fq, fk, fv), args.iters)
    results["sdpa_strided_v_ms"], _ = timed(lambda: attention(q, q, fv), args.iters)
    del qkv, fq, fk, fv
    w_qkv = ours.attn.qkv_weight
    h = torch.randn(1, seq, cfg.hidden_size, device=dev, dtype=dtype)

    def gemms():
        torch.nn.functional.linear(h, w_qkv)
        ours.attn.to_out[0](q.view(1, seq, heads * head_dim))
        f = ours.ff.net[0].proj(h)
        ours.ff.net[2](f[..., : cfg.ffn_dim])

    results["gemms_only_ms"], _ = timed(gemms, args.iters)
    results.update(rows=seq, block_params=n_params, bf16_rel_err_vs_diffusers=err,
                   ratio_ours_over_diffusers=results["ours_block_ms"] / results["diffusers_block_ms"])
    if args.compile:
        results["ratio_compiled_over_diffusers"] = results["ours_compiled_ms"] / results["diffusers_block_ms"]
    attn_flops = 4 * seq * seq * heads * head_dim
    results["sdpa_tflops"] = attn_flops / results["sdpa_only_ms"] / 1e9
    for key, value in results.items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({**results, "profiles": profiles}, handle, indent=1)


if __name__ == "__main__":
    main()
