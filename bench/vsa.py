"""Video Sparse Attention (backend/attention/vsa*.py) at the released size on one GPU: the full-size H3 block with
the "vsa" backend (~10% of the video tiles) vs the same block dense (cuDNN SDPA) and diffusers' block, same random
bf16 weights and inputs, in one run; then attention alone: the VSA path (tile selection, Triton kernel on the video
queries, dense SDPA on the prefix queries) vs cuDNN dense, the kernel's TFLOP/s on the blocks it attends, and its
error vs dense when every tile is selected. Default shape: 10 s at 1344x768 (73,888 rows).

    python bench/vsa.py [--seconds 5 10 15] [--topk 0.1] [--iters 5] [--compile] [--fp8] [--skip-diffusers]
                        [--steps 50 --dense-first 0.25 --layers 50] [--json OUT.json]
    python bench/vsa.py --tiny     # every part on the CPU with a tiny config (torch fallback; tested)
    python bench/vsa.py --kernel-only [--seconds 10] [--iters 3] [--kernels pointer tma tma-4d ...]
                        [--selection random local] [--warps 4 8] [--stages 2 3 4 5]
        the tile selection's parts (pooling, scores, top-k in torch and in Triton) on random q / k, then the Triton
        kernel alone at each shape: the pointer kernel and the TMA-descriptor variants (rows / 4-D views; two key
        blocks per iteration, look-ahead scores, conditional rescale: KERNEL_VARIANTS)
        for --warps x --stages, each vs the pointer kernel's default output, on
        views of a fused QKV buffer (the DiT's layout); one "kernel" line per launch setting, a launch error reported
        and the next setting run. With --tiny: on the CPU under TRITON_INTERPRET=1 (one setting each; tested)
    python bench/vsa.py --quality MODEL_DIR|tiny|full [--steps 50] [--seconds 5] [--size 1344x768]
                        [--settings 0.1:0.25 64:10 ...]
        final latents of one t2va request under each topk:dense setting vs dense (relative error, seconds);
        full: the released-size model with random weights in memory (bench/e2e.py's builders)

One JSON line per part on stdout ("part": env, plan, block, attention, projection per shape, then summary; quality:
one "quality" line per setting). `--fp8` adds the VSA block with FP8 GEMM weights; the projection: a forward as
--layers blocks and a --steps request with the first --dense-first of the steps dense, from the block times.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfyui_h3.backend.attention.dispatch import get_attention  # noqa: E402
from comfyui_h3.backend.attention.registry import get_backend  # noqa: E402
from comfyui_h3.backend.attention.vsa_kernel import select_tiles, sparse_attention, triton_supported  # noqa: E402
from comfyui_h3.backend.attention.vsa_plan import VSASettings, make_plan  # noqa: E402
from comfyui_h3.backend.models.h3_ops import RowSegments, rope_inv_freq, rope_tables  # noqa: E402
from comfyui_h3.backend.models.h3_transformer import H3Block, H3TransformerConfig  # noqa: E402
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry  # noqa: E402
from comfyui_h3.backend.pipelines.h3.layout import build_layout  # noqa: E402
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan  # noqa: E402

TINY = dict(num_attention_heads=2, attention_head_dim=32, hidden_size=64, num_layers=1, num_refiner_layers=1,
            ffn_dim=96, text_dim=40, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=24, rope_freq_dim=4)


def emit(part: str, **values) -> dict:
    print(json.dumps(dict(part=part, **values)), flush=True)
    return values


def timer(dev: torch.device):
    """(fn, iters) -> (median ms, peak GiB): CUDA events on a GPU, wall clock on the CPU."""
    if dev.type == "cuda":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from cuda_timing import timed

        return timed

    def cpu_timed(fn, iters, warmup=1):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), 0.0

    return cpu_timed


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def attended_pairs(plan, sel: torch.Tensor) -> float:
    """Query-key pairs the rule computes, summed over batch and heads: prefix queries x all rows, each video tile's
    rows x (prefix + its selected tiles' rows)."""
    sizes = plan.tile_sizes.to(sel.device, torch.float64)
    seq = plan.num_prefix + float(sizes.sum())
    keys = plan.num_prefix + sizes[sel].sum(-1)  # [B, H, T]
    video = float((keys * sizes).sum())
    return video + plan.num_prefix * seq * sel.shape[0] * sel.shape[1]


def quality(args) -> None:
    """Final latents of one t2va request with each VSA setting vs dense attention, same seed and weights. One engine
    is built with the vsa backend; each run swaps the runtime's backend (its per-request plan: the DiT's attention
    function is the same for every VSA setting, and the "sdpa" backend gives it no plan, i.e. dense attention).
    `--quality full`: the released-size model with random weights in memory (bench/e2e.py's builders; GPU)."""
    import tempfile

    from comfyui_h3.backend.models.tiny import make_tiny_h3
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    model = args.quality
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if model == "tiny":
        model = str(make_tiny_h3(os.path.join(tempfile.mkdtemp(), "tiny-h3")))
    elif model == "full":
        import e2e

        model = e2e.make_skeleton(tempfile.mkdtemp(), tiny=args.tiny)  # --tiny: its tiny configs (a dry run)
        e2e.patch_our_loaders(torch.device(device))
    dtype = "bfloat16" if device == "cuda" else "float32"
    small = args.quality == "tiny" or args.tiny
    w, h = (int(n) for n in (args.size or ("128x64" if small else "1344x768")).split("x"))
    request = dict(prompt="a red fox trots through fresh snow at dawn", num_frames=int(round(args.seconds[0] * 24)),
                   steps=args.steps, seed=42, width=w, height=h, decode=False)
    pipe = h3_config(model, dtype=dtype, device=device, attention="vsa").build_pipeline(0)

    def run(backend, steps=args.steps):
        pipe.attention = get_backend(backend)
        start = time.perf_counter()
        result = pipe.run(H3Request(**{**request, "steps": steps}))
        if device == "cuda":
            torch.cuda.synchronize()
        return result, time.perf_counter() - start

    run("sdpa", min(2, args.steps))  # warm-up (CUDA: compiles the blocks)
    dense, dense_s = run("sdpa")
    emit("quality", setting="dense", seconds=dense_s, video_rel_err=0.0, audio_rel_err=0.0, size=f"{w}x{h}",
         frames=request["num_frames"], steps=args.steps)
    for setting in args.settings:
        topk, _, dense_steps = setting.partition(":")
        got, secs = run(f"vsa:topk={topk},dense={dense_steps or 0}")
        emit("quality", setting=setting, seconds=secs, video_rel_err=rel(got.video_latents, dense.video_latents),
             audio_rel_err=rel(got.audio_latents, dense.audio_latents))


#: --kernel-only's launch variants: KERNEL_CONFIG overrides (vsa_kernel.py) beside num_warps / num_stages. From
#: Triton 3.6's sm_90 compile: TMA loads at a loaded row are double-buffered for num_stages 2-4 and triple-buffered
#: from 5 (the pointer kernel: num_stages buffers).
#: "-pairs": two key blocks per iteration; "-ahead": the next block's scores issued before this block's softmax;
#: "-lazy": the conditional rescale (vsa_kernel_tma.py).
_TMA = dict(tma=True, tma_pairs=1, tma_lookahead=False, tma_lazy=False)
KERNEL_VARIANTS = {"pointer": dict(tma=False, pairs=1), "tma": dict(_TMA, tma_view="rows"),
                   "tma-4d": dict(_TMA, tma_view="4d"), "tma-4d-pairs": dict(_TMA, tma_view="4d", tma_pairs=2),
                   "tma-4d-ahead": dict(_TMA, tma_view="4d", tma_lookahead=True),
                   "tma-4d-lazy": dict(_TMA, tma_view="4d", tma_lazy=True),
                   "tma-4d-ahead-lazy": dict(_TMA, tma_view="4d", tma_lookahead=True, tma_lazy=True)}


def kernel_only(args) -> None:
    """The video kernel alone at each --seconds shape: every variant in --kernels x num_warps x num_stages, timed on
    the same inputs (views of one fused [1, S, 3, H, D] QKV buffer) with its error vs the pointer kernel at
    KERNEL_CONFIG's settings. --tiny: the tiny config on CPU tensors through Triton's interpreter (fp16: its bf16 dot
    is broken), one setting per variant; without TRITON_INTERPRET=1 it reports the kernels as skipped."""
    from comfyui_h3.backend.attention.vsa_kernel import KERNEL_CONFIG, triton
    from comfyui_h3.backend.attention.vsa_kernel_tma import interpreting

    tiny = args.tiny
    dev = torch.device("cpu" if tiny else "cuda")
    dtype = torch.float16 if tiny else torch.bfloat16
    cfg = H3TransformerConfig(**TINY) if tiny else H3TransformerConfig()
    heads, hd = cfg.num_attention_heads, cfg.attention_head_dim
    runnable = triton is not None and (dev.type == "cuda" or interpreting())
    emit("env", device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", torch=torch.__version__,
         triton=getattr(triton, "__version__", None), dtype=str(dtype), heads=heads, head_dim=hd,
         kernel_config=dict(KERNEL_CONFIG), interpreted=dev.type == "cpu" and runnable)
    if not runnable:
        emit("kernel", skipped="needs a CUDA GPU and triton, or TRITON_INTERPRET=1 on the CPU")
        return
    settings = [(4, 3)] if tiny else list(itertools.product(args.warps, args.stages))
    for seconds in args.seconds:
        for selection in args.selection:
            kernel_shape(args, cfg, seconds, dev, dtype, settings, selection)


def local_selection(num_tiles: int, k: int, batch: int, heads: int, device) -> torch.Tensor:
    """[B, H, T, k]: each video tile's k nearest tiles in tile order (a window around itself, shifted inside the
    grid), the same for every head. Random q / k make every tile's selection different and scattered, the worst case
    for reuse of key tiles across query tiles in the L2 cache; a trained model's selections are local (the premise of
    VSA), which this models at its most local."""
    start = (torch.arange(num_tiles) - k // 2).clamp(0, num_tiles - k)
    sel = start[:, None] + torch.arange(k)
    return sel.expand(batch, heads, num_tiles, k).to(device)


def kernel_shape(args, cfg, seconds: float, dev, dtype, settings, selection: str = "random") -> None:
    """--kernel-only at one clip length and selection ("random": select_tiles on the random q / k; "local":
    local_selection): a "plan" line, then one "kernel" line per (variant, warps, stages)."""
    from comfyui_h3.backend.attention.vsa_kernel import triton_video_attention
    from comfyui_h3.backend.attention.vsa_kernel_tma import tma_view

    tiny, heads, hd = dev.type == "cpu", cfg.num_attention_heads, cfg.attention_head_dim
    timed = timer(dev)
    geo = resolve_geometry(int(round(seconds * 24)), 128 if tiny else 768, 256 if tiny else 1344)
    layout = build_layout(torch.ones(24 if tiny else args.text, dtype=torch.long), geo, cfg.patch_size)
    plan = make_plan(layout, VSASettings(topk=args.topk, dense_steps=0))
    seq, p = layout.seq_len, plan.num_prefix
    torch.manual_seed(0)
    q, k, v = torch.randn(1, seq, 3, heads, hd, device=dev, dtype=dtype).unbind(2)
    starts, sizes, _ = plan.tables(dev)
    sel = (select_tiles(q, k, p, plan.tile_sizes, plan.topk) if selection == "random"
           else local_selection(plan.num_tiles, plan.topk, 1, heads, dev))
    video_pairs = attended_pairs(plan, sel) - p * seq * heads
    want = triton_video_attention(q, k, v, p, starts, sizes, sel, torch.empty_like(q), tma=False)
    out = torch.empty_like(q)
    emit("plan", seconds=seconds, selection=selection, rows=seq, prefix_rows=p, video_tiles=plan.num_tiles,
         topk_tiles=plan.topk,
         edge_tiles=int((plan.tile_sizes < 64).sum()), layout="fused_qkv_views",
         tma_views={view: tma_view(q, k, v, out, view) for view in ("rows", "4d")})
    if selection == "random":
        select_parts(q, k, plan, timed, args.iters)
    for name in args.kernels:
        variant = KERNEL_VARIANTS[name]
        if variant["tma"] and tma_view(q, k, v, out, variant["tma_view"]) is None:
            emit("kernel", seconds=seconds, kernel=name, skipped="tma_supported is False here (the pointer "
                 "kernel would run): needs compute capability >= 9 and 16-byte aligned tensors")
            continue
        for warps, stages in settings:
            config = dict(variant, num_warps=warps, num_stages=stages, tma_stages=stages)
            out.fill_(float("nan"))  # a setting that writes nothing shows as nan, not as the last one's output
            try:
                ms, _ = timed(lambda: triton_video_attention(q, k, v, p, starts, sizes, sel, out, **config),
                              args.iters)
            except Exception as error:  # noqa: BLE001 - e.g. out of shared memory: report and go on
                emit("kernel", seconds=seconds, kernel=name, num_warps=warps, num_stages=stages,
                     error=f"{type(error).__name__}: {str(error)[:300]}")
                continue
            emit("kernel", seconds=seconds, selection=selection, kernel=name, num_warps=warps, num_stages=stages,
                 kernel_ms=ms,
                 tflops=4 * hd * video_pairs / ms / 1e9, rel_vs_pointer=rel(out[:, p:], want[:, p:]))


def select_parts(q, k, plan, timed, iters: int) -> dict:
    """A "select" line: select_tiles (vsa_kernel.py) and its parts on these q / k -- mean pooling of q and k, the
    block scores, the top-k as torch.topk + sort and as the Triton pass (vsa_topk.py) -- and whether both top-k
    paths choose the same tiles."""
    from comfyui_h3.backend.attention.vsa_kernel import pooled
    from comfyui_h3.backend.attention.vsa_topk import topk_ascending, topk_ascending_torch, triton_topk_supported

    p, sizes, kk = plan.num_prefix, plan.tile_sizes, plan.topk
    qp, kp = pooled(q, p, sizes), pooled(k, p, sizes)
    scores = qp @ kp.transpose(-1, -2) * q.shape[-1] ** -0.5
    part = {"pool_q_and_k_ms": timed(lambda: (pooled(q, p, sizes), pooled(k, p, sizes)), iters)[0],
            "scores_ms": timed(lambda: qp @ kp.transpose(-1, -2) * q.shape[-1] ** -0.5, iters)[0],
            "topk_sort_torch_ms": timed(lambda: topk_ascending_torch(scores, kk), iters)[0]}
    if triton_topk_supported(scores, kk) or scores.device.type == "cpu":
        use = None if scores.is_cuda else True  # the CPU: through Triton's interpreter (a dry run)
        part["topk_triton_ms"] = timed(lambda: topk_ascending(scores, kk, use_triton=use), iters)[0]
        if scores.is_cuda:  # the kernel's warps per row (vsa_topk.NUM_WARPS)
            part["topk_triton_ms_by_warps"] = {
                w: timed(lambda w=w: topk_ascending(scores, kk, num_warps=w), iters)[0] for w in (1, 2, 4, 8)}
        part["topk_same_tiles"] = bool(torch.equal(topk_ascending(scores, kk, use_triton=use),
                                                   topk_ascending_torch(scores, kk)))
    part["select_tiles_ms"] = timed(lambda: select_tiles(q, k, p, sizes, kk, out_dtype=torch.int32), iters)[0]
    return emit("select", **part)


def random_block(cfg, dev, dtype):
    """A full-size block, normal(0, 0.02) weights (norms at 1), fused QKV; and its state before fusing (diffusers')."""
    torch.manual_seed(0)
    block = H3Block(cfg)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0, 0.02)
    ref_state = {k: v.clone() for k, v in block.state_dict().items()}
    block = block.to(dev, dtype).eval()
    block.attn.fuse_qkv()
    return block, ref_state


def projection(block: dict, layers: int, steps: int, dense_first: float) -> dict:
    """Whole forward = `layers` blocks (the rest of a forward is < 1% and the same on both paths) and a `steps`-step
    request with the first ceil(dense_first * steps) steps dense, from the measured block times (ms -> s)."""
    dense_fwd, vsa_fwd = layers * block["dense_block_ms"] / 1e3, layers * block["vsa_block_ms"] / 1e3
    n_dense = math.ceil(dense_first * steps)
    out = {"layers": layers, "steps": steps, "dense_first": dense_first, "dense_forward_s": dense_fwd,
           "vsa_forward_s": vsa_fwd, "dense_request_s": steps * dense_fwd,
           "vsa_request_s": n_dense * dense_fwd + (steps - n_dense) * vsa_fwd}
    out["vsa_over_dense_request"] = out["vsa_request_s"] / out["dense_request_s"]
    if "vsa_fp8_block_ms" in block:
        fp8_fwd = layers * block["vsa_fp8_block_ms"] / 1e3
        out["vsa_fp8_request_s"] = n_dense * dense_fwd + (steps - n_dense) * fp8_fwd
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, nargs="+", default=[10.0], help="clip lengths (one run per shape)")
    ap.add_argument("--text", type=int, default=502)
    ap.add_argument("--topk", type=float, default=0.1, help="tiles (>= 1) or a fraction of the video tiles (< 1)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--skip-diffusers", action="store_true")
    ap.add_argument("--compile", action="store_true", help="regional torch.compile of the blocks, as the engine")
    ap.add_argument("--fp8", action="store_true", help="also the VSA block with FP8 GEMM weights (fp8_linear.py)")
    ap.add_argument("--sage", action="store_true", help="also VSA at SAGE precision (vsa_sage.py): block, attention, "
                                                        "kernel, error vs bf16 VSA")
    ap.add_argument("--layers", type=int, default=50, help="blocks per forward, for the projections")
    ap.add_argument("--dense-first", type=float, default=0.25, help="projections: fraction of the steps dense")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU (a dry run of every part)")
    ap.add_argument("--json")
    ap.add_argument("--tune", action="store_true", help="time the kernel's launch settings (GPU)")
    ap.add_argument("--kernel-only", action="store_true", help="only the Triton kernel's launch variants and settings")
    ap.add_argument("--kernels", nargs="+", default=list(KERNEL_VARIANTS), choices=list(KERNEL_VARIANTS),
                    help="--kernel-only: the variants to time")
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8], help="--kernel-only: num_warps to time")
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4, 5], help="--kernel-only: num_stages to time")
    ap.add_argument("--selection", nargs="+", default=["random"], choices=["random", "local"],
                    help="--kernel-only: key tiles chosen by the rule on random q / k, or each tile's nearest "
                         "(local_selection: a trained model's locality at its most)")
    ap.add_argument("--quality", metavar="MODEL_DIR|tiny|full", help="the quality table instead of the timings "
                    "(full: the released-size model, random weights in memory)")
    ap.add_argument("--size", help="--quality: WIDTHxHEIGHT (default 128x64 tiny, else 1344x768)")
    ap.add_argument("--steps", type=int, default=50, help="--quality: denoising steps; else the projections' steps")
    ap.add_argument("--settings", nargs="+", default=["0.05:0", "0.1:0", "0.1:0.25", "0.2:0.25", "0.3:0.5"],
                    help="--quality: topk:dense_steps pairs (counts >= 1 or fractions < 1)")
    args = ap.parse_args()
    if args.quality:
        return quality(args)
    if args.kernel_only:
        return kernel_only(args)

    tiny = args.tiny
    dev = torch.device("cpu" if tiny else "cuda")
    dtype = torch.float32 if tiny else torch.bfloat16
    cfg = H3TransformerConfig(**TINY) if tiny else H3TransformerConfig()
    heads, hd = cfg.num_attention_heads, cfg.attention_head_dim
    emit("env", device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", torch=torch.__version__,
         dtype=str(dtype), heads=heads, head_dim=hd, compiled=args.compile,
         triton_kernel=dev.type == "cuda" and triton_supported(torch.empty(1, 1, 1, hd, dtype=dtype, device=dev)))
    block, ref_state = random_block(cfg, dev, dtype)
    fp8_block = None
    if args.fp8:
        fp8_block, _ = random_block(cfg, dev, dtype)
        fp8_block.use_fp8_gemms(emulate=dev.type != "cuda")
    results = []
    for seconds in args.seconds:
        if args.compile:  # one graph per shape and attention path, as the engine compiles for a request's shape
            torch._dynamo.reset()
            for b in (block, fp8_block):
                if b is not None:
                    b.compile(dynamic=False)
        part = run_shape(args, cfg, block, fp8_block, ref_state, seconds, dev, dtype, first=not results)
        part["projection"] = emit("projection", seconds=seconds,
                                  **projection(part["block"], args.layers, args.steps, args.dense_first))
        results.append(part)
    emit("summary", shapes=[{"seconds": r["plan"]["seconds"], "rows": r["plan"]["rows"],
                             "vsa_over_dense_block": r["block"]["vsa_over_dense"],
                             "vsa_fp8_over_dense_block": r["block"].get("vsa_fp8_over_dense"),
                             "vsa_over_dense_attention": r["attention"]["vsa_over_dense_attention"],
                             "vsa_over_dense_request": r["projection"]["vsa_over_dense_request"]} for r in results])
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


def run_shape(args, cfg, block, fp8_block, ref_state, seconds, dev, dtype, first: bool) -> dict:
    """Plan, block (dense / VSA / VSA with FP8 GEMMs / diffusers') and attention alone at one clip length."""
    tiny = dev.type == "cpu"
    geo = resolve_geometry(int(round(seconds * 24)), 128 if tiny else 768, 256 if tiny else 1344)
    layout = build_layout(torch.ones(24 if tiny else args.text, dtype=torch.long), geo, cfg.patch_size)
    settings = VSASettings(topk=args.topk, dense_steps=0)
    plan = make_plan(layout, settings)
    tiled = plan.permute_layout(layout)  # what the DiT sees under vsa: rows in tile order
    seq, heads, hd = layout.seq_len, cfg.num_attention_heads, cfg.attention_head_dim
    timed = timer(dev)
    results = {"plan": emit("plan", seconds=seconds, rows=seq, prefix_rows=plan.num_prefix, grid=plan.grid,
                            video_tiles=plan.num_tiles, topk_tiles=plan.topk,
                            full_tiles=int((plan.tile_sizes == 64).sum()),
                            edge_tiles=int((plan.tile_sizes < 64).sum()))}
    ts, row_idx = row_timestep_plan(layout, 0.4, 0.6)
    temb = torch.randn(ts.numel(), cfg.time_embed_dim, device=dev, dtype=torch.float32)
    inv_freq = rope_inv_freq(cfg.rope_freq_dim, cfg.rope_theta).to(dev)

    def inputs(lay, rows):
        cos, sin = rope_tables(lay.position_ids.to(dev), inv_freq)
        adaln_rows = rows * 3 + lay.token_tags
        return (cos, sin), RowSegments.from_rows(adaln_rows), adaln_rows

    rope_d, seg_d, adaln_d = inputs(layout, row_idx)
    rope_v, seg_v, _ = inputs(tiled, row_idx[plan.order])
    x = torch.randn(1, seq, cfg.hidden_size, device=dev, dtype=dtype)
    x_tiled = x[:, plan.order.to(dev)].contiguous()
    dense_attn = get_attention("sdpa")
    vsa = get_backend(f"vsa:{settings.spec()}")
    inv = plan.inverse.to(dev)

    def vsa_attn(q, k, v):
        return vsa(q, k, v, plan)

    @torch.no_grad()
    def run_dense():
        return block(x.clone(), block.adaln_proj(temb), seg_d, rope_d, dense_attn)

    @torch.no_grad()
    def run_vsa(b=block):
        return b(x_tiled.clone(), b.adaln_proj(temb), seg_v, rope_v, vsa_attn)

    vsa_sage = get_backend(f"vsa:{dataclasses.replace(settings, precision='sage').spec()}") if args.sage else None

    @torch.no_grad()
    def run_vsa_sage(b=block):  # the sparse step at SAGE precision (vsa_sage.py)
        return b(x_tiled.clone(), b.adaln_proj(temb), seg_v, rope_v, lambda q, k, v: vsa_sage(q, k, v, plan))

    dense_out = run_dense()
    vsa_out = run_vsa()[:, inv]  # back to packed order to compare
    part = {"block_rel_err_vsa_vs_dense": rel(vsa_out, dense_out)}
    if vsa_sage is not None:
        part["block_rel_err_vsa_sage_vs_vsa"] = rel(run_vsa_sage()[:, inv], vsa_out)
    del dense_out, vsa_out
    part["dense_block_ms"], part["dense_block_peak_gib"] = timed(run_dense, args.iters)
    part["vsa_block_ms"], part["vsa_block_peak_gib"] = timed(run_vsa, args.iters)
    part["vsa_over_dense"] = part["vsa_block_ms"] / part["dense_block_ms"]
    if fp8_block is not None:
        part["vsa_fp8_block_ms"], _ = timed(lambda: run_vsa(fp8_block), args.iters)
        part["vsa_fp8_over_dense"] = part["vsa_fp8_block_ms"] / part["dense_block_ms"]
    if vsa_sage is not None:
        part["vsa_sage_block_ms"], _ = timed(run_vsa_sage, args.iters)
        part["vsa_sage_over_dense"] = part["vsa_sage_block_ms"] / part["dense_block_ms"]
        if fp8_block is not None:
            part["vsa_sage_fp8_block_ms"], _ = timed(lambda: run_vsa_sage(fp8_block), args.iters)
            part["vsa_sage_fp8_over_dense"] = part["vsa_sage_fp8_block_ms"] / part["dense_block_ms"]
    if first and not (tiny or args.skip_diffusers):
        from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

        ref = MiniMaxH3TransformerBlock(cfg.hidden_size, heads, hd, cfg.ffn_dim, cfg.time_embed_dim, cfg.norm_eps,
                                        cfg.qk_norm_eps)
        ref.load_state_dict(ref_state)
        ref = ref.to(dev, dtype).eval()
        adaln_dev = adaln_d.to(dev)
        with torch.no_grad():
            part["diffusers_block_ms"], part["diffusers_block_peak_gib"] = timed(
                lambda: ref(x, temb, adaln_dev, rope_d), args.iters)
        part["vsa_over_diffusers"] = part["vsa_block_ms"] / part["diffusers_block_ms"]
        del ref
    results["block"] = emit("block", seconds=seconds, **part)
    del x, x_tiled

    # Attention alone on rows in tile order.
    q, k, v = (torch.randn(1, seq, heads, hd, device=dev, dtype=dtype) for _ in range(3))
    p = plan.num_prefix
    starts, sizes, tile_of = plan.tables(dev)
    sel = select_tiles(q, k, p, plan.tile_sizes, plan.topk)
    pairs = attended_pairs(plan, sel)
    part = {"attended_fraction": pairs / (seq * seq * heads)}
    part["dense_attention_ms"], _ = timed(lambda: dense_attn(q, k, v), args.iters)
    part["vsa_attention_ms"], part["vsa_attention_peak_gib"] = timed(lambda: vsa(q, k, v, plan), args.iters)
    part["select_ms"], _ = timed(lambda: select_tiles(q, k, p, plan.tile_sizes, plan.topk), args.iters)
    if vsa_sage is not None:
        from comfyui_h3.backend.attention import vsa_sage as sage_rows

        part["vsa_sage_attention_ms"], _ = timed(lambda: vsa_sage(q, k, v, plan), args.iters)
        part["vsa_sage_attention_rel_vs_vsa"] = rel(vsa_sage(q, k, v, plan)[:, p:], vsa(q, k, v, plan)[:, p:])
        part["vsa_sage_quantize_ms"], _ = timed(lambda: sage_rows.quantize(q, k, v), args.iters)
        if sage_rows.kernel_supported(q):
            ops, out8 = sage_rows.quantize(q, k, v), torch.empty_like(q)
            part["vsa_sage_kernel_ms"], _ = timed(
                lambda: sage_rows.kernel_video_attention(ops, p, starts, sizes, sel, out8), args.iters)
            part["vsa_sage_kernel_tflops"] = 4 * hd * (pairs - p * seq * heads) / part["vsa_sage_kernel_ms"] / 1e9
    if dev.type == "cuda" and triton_supported(q):
        from comfyui_h3.backend.attention.vsa_kernel import KERNEL_CONFIG, triton_video_attention

        out = torch.empty_like(q)
        part["kernel_ms"], _ = timed(lambda: triton_video_attention(q, k, v, p, starts, sizes, sel, out), args.iters)
        video_pairs = pairs - p * seq * heads
        part["kernel_tflops"] = 4 * hd * video_pairs / part["kernel_ms"] / 1e9
        part["kernel_config"] = dict(KERNEL_CONFIG)
        if args.tune and first:  # launch settings and the P.V precision, each timed on the same inputs
            want = triton_video_attention(q, k, v, p, starts, sizes, sel, torch.empty_like(q), pv_fp16=False,
                                          pairs=1)
            for pairs_, warps, stages, pv16 in itertools.product((1, 2), (4, 8), (2, 3, 4), (False, True)):
                config = dict(pairs=pairs_, num_warps=warps, num_stages=stages)
                try:
                    ms, _ = timed(lambda: triton_video_attention(q, k, v, p, starts, sizes, sel, out,
                                                                 pv_fp16=pv16, **config), args.iters)
                except Exception as error:  # noqa: BLE001 - e.g. out of shared memory: report and go on
                    emit("tune", **config, pv_fp16=pv16, error=str(error)[:200])
                    continue
                emit("tune", **config, pv_fp16=pv16, kernel_ms=ms, tflops=4 * hd * video_pairs / ms / 1e9,
                     rel_vs_pairs1_bf16=rel(out[:, p:], want[:, p:]))  # the kernel fills the video rows only
    part["dense_tflops"] = 4 * hd * seq * seq * heads / part["dense_attention_ms"] / 1e9
    part["vsa_over_dense_attention"] = part["vsa_attention_ms"] / part["dense_attention_ms"]
    full = make_plan(layout, VSASettings(topk=10 ** 9, dense_steps=0))
    part["all_tiles_rel_err_vs_dense"] = rel(sparse_attention(q, k, v, full, dense_attn), dense_attn(q, k, v))
    results["attention"] = emit("attention", seconds=seconds, **part)
    return results


if __name__ == "__main__":
    main()
