"""FP8 GEMMs (WeightPolicy storage "fp8", backend/models/fp8_linear.py) against bf16 for the MiniMax-H3 DiT block at
the released size, random weights, one GPU. Default shape: 10 s at 1344x768 (73,888 rows). One JSON object per line:

  env       torch / triton / GPU / rows
  gemms     the block's four GEMMs (fused QKV, attention out, SwiGLU in, SwiGLU out): bf16; FP8 _scaled_mm alone
            (inputs quantised beforehand; also with fast accumulation); FP8 with each input quantised as the block
            does it (fused into RMSNorm+modulation and SwiGLU, the attention output by one pass); the bf16 GEMMs with
            the producers the FP8 path replaces (RMSNorm+modulation twice, SwiGLU), eager; FP8 with the quantisation
            as separate passes after the bf16 producers (torch ops, and the Triton row kernel)
  producers each producer alone: bf16 vs its fused FP8 kernel
  errors    relative error vs bf16 of each GEMM, of the block's attention and SwiGLU branches (what it adds to the
            residual) and of its output
  block     whole block, eager and compiled (torch.compile as the engine does), bf16 vs FP8, peak memory; the
            50-block forward estimated as 50 blocks (the rest of a forward is the same in both and < 1%)
  forward   a 50-block stack of distinct random blocks (at --chain-seconds, eager): relative error of the FP8
            stack's output vs the bf16 stack's, at a few depths
  weights   bytes of the block's GEMM weights, the whole block and the whole DiT, bf16 vs FP8
  summary   the ratios the issue's targets read (forward <= 0.93x of bf16 compiled, >= 25 ms saved per block)

    python bench/fp8_gemm.py [--seconds 10] [--iters 5] [--chain-blocks 50] [--chain-seconds 5] [--no-compile]
                             [--out FILE.jsonl]
    python bench/fp8_gemm.py --tiny     # tiny config, CPU, emulated FP8: checks that every part runs (timings are
                                        # not meaningful)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_timing import timed as measure  # noqa: E402  (bench/ on sys.path)

from comfyui_h3.backend.attention.dispatch import get_attention  # noqa: E402
from comfyui_h3.backend.models import fp8_linear as f8  # noqa: E402
from comfyui_h3.backend.models.h3_ops import RowSegments, rms_norm, rope_inv_freq, rope_tables  # noqa: E402
from comfyui_h3.backend.models.h3_transformer import (  # noqa: E402
    FP32_MODULE_PREFIXES, H3Block, H3Transformer, H3TransformerConfig)
from comfyui_h3.backend.models.tiny import TINY_TRANSFORMER_CONFIG  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan  # noqa: E402

BF16 = torch.bfloat16
START = time.perf_counter()


def emit(part: str, out, **values) -> None:
    line = json.dumps({"part": part, "elapsed_s": round(time.perf_counter() - START, 1), **values})
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


class Shape:
    """The packed request the block sees: rows, AdaLN row segments, rotary tables, a time embedding."""

    def __init__(self, cfg: H3TransformerConfig, seconds: float, text: int, height: int, width: int, dev):
        geo = resolve_geometry(int(round(seconds * 24)), height, width)
        layout = build_layout(torch.ones(text, dtype=torch.long), geo, cfg.patch_size)
        ts, row_idx = row_timestep_plan(layout, 0.4, 0.6)
        self.rows = layout.seq_len
        self.segments = RowSegments.from_rows(row_idx * 3 + layout.token_tags)
        self.rope = rope_tables(layout.position_ids.to(dev), rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta).to(dev))
        self.temb = torch.randn(ts.numel(), cfg.time_embed_dim, device=dev)


@torch.no_grad()
def randomise_(block: H3Block) -> None:
    """N(0, 0.02) weights (bench/dit_block.py's choice), RMSNorm weights 1."""
    for name, t in list(block.named_parameters()) + list(block.named_buffers()):
        if t.numel() and t.is_floating_point():
            t.fill_(1.0) if "norm" in name else t.normal_(0, 0.02)


def gemm_pairs(fp8_block: H3Block, block: H3Block):
    return ((fp8_block.attn.qkv_fp8, block.attn.qkv_weight), (fp8_block.attn.to_out[0], block.attn.to_out[0].weight),
            (fp8_block.ff.net[0].proj, block.ff.net[0].proj.weight), (fp8_block.ff.net[2], block.ff.net[2].weight))


@torch.no_grad()
def load_fp8_from_(fp8_block: H3Block, block: H3Block) -> None:
    """Give an FP8 block the bf16 block's weights in place (a compiled FP8 block keeps its graph)."""
    source = dict(block.named_parameters())
    for name, p in fp8_block.named_parameters():
        if p.numel():
            p.copy_(source[name])
    for layer, weight in gemm_pairs(fp8_block, block):
        q, s = f8.quantise_weight(weight)
        layer.weight.copy_(q)
        layer.weight_scale.copy_(s)


def tensor_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def gemm_parts(ctx, x: torch.Tensor) -> dict:
    """The block's four GEMMs and the producers of their inputs, bf16 vs FP8."""
    cfg, shape, block, kernels, emulate, it = ctx.cfg, ctx.shape, ctx.block, ctx.kernels, ctx.emulate, ctx.iters
    seq, hidden, inner, ffn, eps = x.shape[1], cfg.hidden_size, cfg.num_attention_heads * cfg.attention_head_dim, \
        cfg.ffn_dim, cfg.norm_eps
    shift1, scale1, _, shift2, scale2, _ = ctx.modulation
    runs = shape.segments.runs
    h = shape.segments.modulate_(rms_norm(x, block.norm1.weight, eps), scale1, shift1)
    a = torch.randn(1, seq, inner, device=x.device, dtype=BF16)  # an attention output
    g = torch.randn(1, seq, 2 * ffn, device=x.device, dtype=BF16)  # a SwiGLU input [value | gate]
    value, gate = g.chunk(2, dim=-1)
    u = value * torch.nn.functional.silu(gate)
    hq, aq, uq = (f8.quantise_rows(t, kernels) for t in (h, a, u))
    qkv_l, out_l, in_l, down_l = (layer for layer, _ in gemm_pairs(ctx.fp8_block, block))

    def gemms_bf16():
        torch.nn.functional.linear(h, block.attn.qkv_weight)
        block.attn.to_out[0](a)
        block.ff.net[0].proj(h)
        block.ff.net[2](u)

    def gemms_fp8(fast_accum=f8.FAST_ACCUM):
        for layer, rows in ((qkv_l, hq), (out_l, aq), (in_l, hq), (down_l, uq)):
            f8.fp8_matmul(rows, layer.weight, layer.weight_scale, emulate, fast_accum)

    def gemms_bf16_with_producers():
        h1 = shape.segments.modulate_(rms_norm(x, block.norm1.weight, eps), scale1, shift1)
        torch.nn.functional.linear(h1, block.attn.qkv_weight)
        block.attn.to_out[0](a)
        h2 = shape.segments.modulate_(rms_norm(x, block.norm2.weight, eps), scale2, shift2)
        v, gt = block.ff.net[0].proj(h2).chunk(2, dim=-1)
        block.ff.net[2](v * torch.nn.functional.silu(gt))

    def gemms_fp8_fused():  # what an FP8 block runs around its GEMMs
        qkv_l(f8.norm_modulate_rows(x, block.norm1.weight, eps, runs, scale1, shift1, kernels))
        out_l(a)  # the attention output (cuDNN's) quantised by one row pass inside the layer
        hh = in_l(f8.norm_modulate_rows(x, block.norm2.weight, eps, runs, scale2, shift2, kernels))
        down_l(f8.swiglu_rows(hh, kernels))

    def gemms_fp8_separate(quant_kernels):  # bf16 producers, then a separate quantisation pass per input
        h1 = shape.segments.modulate_(rms_norm(x, block.norm1.weight, eps), scale1, shift1)
        qkv_l(f8.quantise_rows(h1, quant_kernels))
        out_l(f8.quantise_rows(a, quant_kernels))
        h2 = shape.segments.modulate_(rms_norm(x, block.norm2.weight, eps), scale2, shift2)
        v, gt = in_l(f8.quantise_rows(h2, quant_kernels)).chunk(2, dim=-1)
        down_l(f8.quantise_rows(v * torch.nn.functional.silu(gt), quant_kernels))

    gemm = {"bf16_ms": measure(gemms_bf16, it)[0], "fp8_ms": measure(gemms_fp8, it)[0],
            "fp8_fast_accum_ms": measure(lambda: gemms_fp8(True), it)[0],
            "fp8_with_fused_quant_ms": measure(gemms_fp8_fused, it)[0],
            "bf16_with_producers_ms": measure(gemms_bf16_with_producers, it)[0],
            "fp8_separate_torch_quant_ms": measure(lambda: gemms_fp8_separate(False), it)[0],
            "fp8_separate_triton_quant_ms": measure(lambda: gemms_fp8_separate(kernels), it)[0]}
    flops = 2 * seq * hidden * (3 * inner + 2 * ffn) + 2 * seq * inner * hidden + 2 * seq * ffn * hidden
    gemm.update(tflop=flops / 1e12, bf16_tflops=flops / gemm["bf16_ms"] / 1e9, fp8_tflops=flops / gemm["fp8_ms"] / 1e9,
                ratio_fp8_fused_over_bf16=gemm["fp8_with_fused_quant_ms"] / gemm["bf16_ms"],
                ratio_fp8_fused_over_bf16_with_producers=gemm["fp8_with_fused_quant_ms"]
                / gemm["bf16_with_producers_ms"])
    emit("gemms", ctx.out, **gemm)

    prod = {
        "norm_mod_bf16_ms": measure(lambda: shape.segments.modulate_(rms_norm(x, block.norm1.weight, eps), scale1,
                                                                      shift1), it)[0],
        "norm_mod_quant_fp8_ms": measure(lambda: f8.norm_modulate_rows(x, block.norm1.weight, eps, runs, scale1,
                                                                        shift1, kernels), it)[0],
        "swiglu_bf16_ms": measure(lambda: value * torch.nn.functional.silu(gate), it)[0],
        "swiglu_quant_fp8_ms": measure(lambda: f8.swiglu_rows(g, kernels), it)[0],
        "attn_out_quant_fp8_ms": measure(lambda: f8.quantise_rows(a, kernels), it)[0],
        "attn_out_quant_torch_ms": measure(lambda: f8.quantise_rows(a, False), it)[0]}
    emit("producers", ctx.out, **prod)

    ctx.gemm_errors = {
        "qkv": rel(qkv_l(hq), torch.nn.functional.linear(h, block.attn.qkv_weight)),
        "attn_out": rel(out_l(aq), block.attn.to_out[0](a)), "ffn_in": rel(in_l(hq), block.ff.net[0].proj(h)),
        "ffn_out": rel(down_l(uq), block.ff.net[2](u)),
        "qkv_fast_accum": rel(f8.fp8_matmul(hq, qkv_l.weight, qkv_l.weight_scale, emulate, True),
                              torch.nn.functional.linear(h, block.attn.qkv_weight))}
    return gemm


def run_block(ctx, b: H3Block, x: torch.Tensor):
    return lambda: b(x.clone(), ctx.modulation, ctx.shape.segments, ctx.shape.rope, ctx.attention)


def error_parts(ctx, x: torch.Tensor) -> dict:
    """Relative error vs bf16: each GEMM (from gemm_parts), each branch of the block, its output."""
    block, fp8_block, shape, eps = ctx.block, ctx.fp8_block, ctx.shape, ctx.cfg.norm_eps
    shift1, scale1, _, shift2, scale2, _ = ctx.modulation
    errors = dict(ctx.gemm_errors)
    errors["block_out"] = rel(run_block(ctx, fp8_block, x)(), run_block(ctx, block, x)())
    # the block's two branches (what it adds to the residual, before the gates), each from its own input
    for name, norm, scale, shift, bf16_fn, fp8_fn in (
            ("attn_branch", block.norm1.weight, scale1, shift1, lambda t: block.attn(t, shape.rope, ctx.attention),
             lambda t: fp8_block.attn(t, shape.rope, ctx.attention)),
            ("ff_branch", block.norm2.weight, scale2, shift2, block.ff, fp8_block.ff)):
        want = bf16_fn(shape.segments.modulate_(rms_norm(x, norm, eps), scale, shift))
        errors[name] = rel(fp8_fn(f8.norm_modulate_rows(x, norm, eps, shape.segments.runs, scale, shift,
                                                        ctx.kernels)), want)
    emit("errors", ctx.out, **errors)
    return errors


def block_parts(ctx, x: torch.Tensor, backend: str | None) -> dict:
    """The whole block, eager and (backend given) compiled, bf16 vs FP8."""
    block, fp8_block, it = ctx.block, ctx.fp8_block, ctx.iters
    blk = {}
    blk["bf16_eager_ms"], blk["bf16_eager_peak_gib"] = measure(run_block(ctx, block, x), it)
    blk["fp8_eager_ms"], blk["fp8_eager_peak_gib"] = measure(run_block(ctx, fp8_block, x), it)
    compiled = False
    if backend:
        try:
            block.compile(backend=backend)  # regional compilation, as components.compile_blocks does
            fp8_block.compile(backend=backend)
            blk["bf16_compiled_ms"], blk["bf16_compiled_peak_gib"] = measure(run_block(ctx, block, x), it, warmup=3)
            blk["fp8_compiled_ms"], blk["fp8_compiled_peak_gib"] = measure(run_block(ctx, fp8_block, x), it,
                                                                           warmup=3)
            blk["compiled_block_out_rel_err"] = rel(run_block(ctx, fp8_block, x)(), run_block(ctx, block, x)())
            compiled = True
        except Exception as exc:  # noqa: BLE001 - report it and go on with the eager numbers
            blk["compile_error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    key = "compiled" if compiled else "eager"
    layers = ctx.cfg.num_layers
    blk.update(ratio=blk[f"fp8_{key}_ms"] / blk[f"bf16_{key}_ms"],
               saved_ms_per_block=blk[f"bf16_{key}_ms"] - blk[f"fp8_{key}_ms"],
               forward_estimate_bf16_s=layers * blk[f"bf16_{key}_ms"] / 1e3,
               forward_estimate_fp8_s=layers * blk[f"fp8_{key}_ms"] / 1e3, timed=key)
    emit("block", ctx.out, **blk)
    return blk


def chain_parts(ctx, blocks: int, chain: Shape) -> dict:
    """A stack of distinct random blocks: the bf16 and FP8 streams side by side, one block's weights at a time;
    eager (.forward): a second shape would recompile the compiled blocks."""
    block, fp8_block = ctx.block, ctx.fp8_block
    xb = torch.randn(1, chain.rows, ctx.cfg.hidden_size, device=ctx.dev, dtype=BF16)
    xf = xb.clone()
    depths = {}
    for i in range(blocks):
        torch.manual_seed(1000 + i)
        randomise_(block)
        load_fp8_from_(fp8_block, block)
        mod = block.adaln_proj(chain.temb)
        xb = block.forward(xb, mod, chain.segments, chain.rope, ctx.attention)
        xf = fp8_block.forward(xf, mod, chain.segments, chain.rope, ctx.attention)
        if i + 1 in (1, 2, 5, 10, 25, 50) or i + 1 == blocks:
            depths[str(i + 1)] = rel(xf, xb)
    emit("forward", ctx.out, blocks=blocks, rows=chain.rows, eager=True, rel_err_by_depth=depths,
         forward_rel_err=depths[str(blocks)], finite=bool(torch.isfinite(xf).all()))
    return depths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--text", type=int, default=502)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--chain-blocks", type=int, default=50)
    ap.add_argument("--chain-seconds", type=float, default=5.0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU with emulated FP8 (a dry run)")
    ap.add_argument("--out", help="also write the JSON lines here")
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else None
    if args.tiny:
        dev, emulate, backend = torch.device("cpu"), True, "aot_eager"
        cfg = H3TransformerConfig.from_dict(TINY_TRANSFORMER_CONFIG)
        height, width, text = 64, 96, 9
        args.seconds, args.chain_seconds, args.iters = 5.0, 5.0, 2
        args.chain_blocks = min(args.chain_blocks, 4)
    else:
        if not torch.cuda.is_available():
            sys.exit("bench/fp8_gemm.py needs a CUDA GPU (or --tiny for a CPU dry run).")
        dev, emulate, backend = torch.device("cuda"), False, "inductor"
        f8.check_scaled_mm(dev)
        cfg = H3TransformerConfig()
        height, width, text = 768, 1344, args.text
    kernels = not emulate
    torch.manual_seed(0)
    shape = Shape(cfg, args.seconds, text, height, width, dev)
    seq, hidden, ffn = shape.rows, cfg.hidden_size, cfg.ffn_dim
    kernel_module = f8._kernels() if kernels else None
    emit("env", out, torch=torch.__version__, triton=getattr(kernel_module, "triton", None) and
         kernel_module.triton.__version__, device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
         capability=list(torch.cuda.get_device_capability()) if dev.type == "cuda" else None, rows=seq,
         seconds=args.seconds, mode="emulated" if emulate else "scaled_mm", fused_kernels=kernel_module is not None,
         fast_accum_default=f8.FAST_ACCUM, hidden=hidden, ffn=ffn, heads=cfg.num_attention_heads)

    with torch.device(dev):  # initialised where it runs (645M parameters: slow on the host)
        block = H3Block(cfg).to(BF16).eval().requires_grad_(False)
    randomise_(block)
    block.attn.fuse_qkv()
    fp8_block = copy.deepcopy(block)
    fp8_block.use_fp8_gemms(emulate)
    ctx = argparse.Namespace(cfg=cfg, dev=dev, emulate=emulate, kernels=kernels, shape=shape, block=block,
                             fp8_block=fp8_block, attention=get_attention("sdpa"), iters=args.iters, out=out)
    with torch.no_grad():
        ctx.modulation = block.adaln_proj(shape.temb)
        x = torch.randn(1, seq, hidden, device=dev, dtype=BF16)  # the residual stream entering the block
        gemm = gemm_parts(ctx, x)
        errors = error_parts(ctx, x)
        blk = block_parts(ctx, x, None if args.no_compile else backend)
        del x
        depths = chain_parts(ctx, args.chain_blocks, Shape(cfg, args.chain_seconds, text, height, width, dev))
    key = blk["timed"]

    gemm_bf16 = sum(w.numel() * w.element_size() for _, w in gemm_pairs(fp8_block, block))
    gemm_fp8 = f8.gemm_weight_bytes(fp8_block)
    with torch.device("meta"):
        dit = H3Transformer(cfg)
    dit_bf16 = sum(p.numel() * (4 if n.startswith(FP32_MODULE_PREFIXES) else 2) for n, p in dit.named_parameters())
    dit_fp8 = dit_bf16 - cfg.num_layers * (gemm_bf16 - gemm_fp8)
    emit("weights", out, block_gemm_bf16_bytes=gemm_bf16, block_gemm_fp8_bytes=gemm_fp8,
         block_gemm_ratio=gemm_fp8 / gemm_bf16, block_bf16_bytes=tensor_bytes(block),
         block_fp8_bytes=tensor_bytes(fp8_block), block_ratio=tensor_bytes(fp8_block) / tensor_bytes(block),
         dit_bf16_gib=dit_bf16 / 2**30, dit_fp8_gib=dit_fp8 / 2**30, dit_ratio=dit_fp8 / dit_bf16)
    emit("summary", out, rows=seq, gemm_bf16_ms=gemm["bf16_ms"], gemm_fp8_with_fused_quant_ms=gemm[
        "fp8_with_fused_quant_ms"], block_timed=key, block_ratio=blk["ratio"],
         saved_ms_per_block=blk["saved_ms_per_block"], target_forward_ratio_le_0_93=blk["ratio"] <= 0.93,
         target_saved_ge_25ms=blk["saved_ms_per_block"] >= 25.0, block_out_rel_err=errors["block_out"],
         branch_rel_err=max(errors["attn_branch"], errors["ff_branch"]),
         forward_rel_err=depths[str(args.chain_blocks)], dit_weights_ratio=dit_fp8 / dit_bf16,
         gemm_weights_ratio=gemm_fp8 / gemm_bf16)
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
