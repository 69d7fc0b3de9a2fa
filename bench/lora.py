"""Time LoRAs on the H3 DiT (issue 32): a random rank-R LoRA over every block's attention, MLP and AdaLN projections
(tools/write_lora.py's layout) on a random DiT of the released shape on the GPU, applied as the engine does it
(models/lora_apply.py): merged at load (header, shape and NaN checks, the merge, the base copies kept on the host),
then, on the fused model, switched to another strength, to no LoRA and back; with --fp8 the same switch on FP8
codes. And what not merging would cost: each touched GEMM of one block at --tokens rows, the merged weight alone
against it plus the un-merged low-rank branch (x A^T) B^T.

    python bench/lora.py [--rank 64] [--layout kohya] [--tokens 32760] [--fp8] [--tiny] [--json FILE]

--tiny: the tiny set's shape on the CPU (a dry run of the script).
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig  # noqa: E402
from comfyui_h3.backend.models import lora_apply  # noqa: E402
from comfyui_h3.backend.models.lora import lora_choice, read_lora  # noqa: E402
from comfyui_h3.backend.models.lora_apply import apply_loras  # noqa: E402
from comfyui_h3.backend.models.lora_write import make_random_lora  # noqa: E402
from comfyui_h3.backend.models.tiny import TINY_TRANSFORMER_CONFIG  # noqa: E402
from e2e import random_dit_  # noqa: E402


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def branch_cost(shapes: dict, lora, tokens: int, rank: int, device, dtype) -> dict:
    """Block 0's touched GEMMs at `tokens` rows: merged (x W^T) against un-merged (x W^T + (x A^T) B^T), seconds
    summed over the block's linears (the fastest of 5 after a warm-up)."""
    keys = sorted({k for e in lora.edits for k in e.weight.ours if k.startswith("transformer_blocks.0.")
                   and k.endswith(".weight") and ".adaln_proj." not in k and len(shapes[k]) == 2})
    merged = unmerged = 0.0
    for key in keys:
        out_f, in_f = shapes[key]
        w = torch.randn(out_f, in_f, device=device, dtype=dtype)
        a, b = (torch.randn(rank, in_f, device=device, dtype=dtype), torch.randn(out_f, rank, device=device,
                                                                                  dtype=dtype))
        x = torch.randn(tokens, in_f, device=device, dtype=dtype)
        for fn, slot in ((lambda: x @ w.T, 0), (lambda: torch.addmm(x @ w.T, x @ a.T, b.T), 1)):
            fn()
            best = min(timed(fn, device)[0] for _ in range(5))
            if slot:
                unmerged += best
            else:
                merged += best
    return {"gemms": len(keys), "merged_s": round(merged, 5), "unmerged_s": round(unmerged, 5),
            "unmerged_over_merged": round(unmerged / merged, 4) if merged else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--layout", default="kohya")
    ap.add_argument("--tokens", type=int, default=32760, help="rows of the un-merged branch timing (5 s at 768p)")
    ap.add_argument("--fp8", action="store_true", help="also switch on FP8 codes (scaled-mm GPUs)")
    ap.add_argument("--host-share", type=float, default=None, help="lora_apply.HOST_SHARE for this run")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.host_share is not None:
        lora_apply.HOST_SHARE = args.host_share
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    cfg = H3TransformerConfig.from_dict(dict(TINY_TRANSFORMER_CONFIG)) if args.tiny else H3TransformerConfig()
    with torch.device("meta"):
        model = H3Transformer(cfg)
    model = random_dit_(model.to(dtype).to_empty(device=device)).eval().requires_grad_(False)
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
    record = {"bench": "lora_apply", "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "blocks": cfg.num_layers, "rank": args.rank, "layout": args.layout,
              "dtype": str(dtype).removeprefix("torch."), "host_share": lora_apply.HOST_SHARE}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lora.safetensors")
        record["write_s"], _ = timed(lambda: make_random_lora(path, cfg.to_dict(), args.rank, layout=args.layout,
                                                              dtype=torch.bfloat16), torch.device("cpu"))
        record["header_check_s"], lora = timed(lambda: read_lora(path, shapes), torch.device("cpu"))
        record["modules"], record["file_mib"] = len(lora.edits), round(os.path.getsize(path) / 2**20, 1)
        steps = [("merge_at_load_s", [lora_choice(path, 1.0)])]
        record["merge_at_load_s"], done = timed(lambda: apply_loras(model, steps[0][1]), device)
        base = model.lora_base
        record["base_kept_gib"] = None if base is None else round(sum(t.numel() * t.element_size()
                                                                      for t in base.values()) / 2**30, 2)
        record["weights_touched"] = done["weights"]
        model.fuse_projections()
        for name, chosen in (("switch_strength_s", [lora_choice(path, 0.5)]), ("switch_to_none_s", []),
                             ("switch_from_none_s", [lora_choice(path, 1.0)])):
            try:
                record[name] = round(timed(lambda: apply_loras(model, chosen), device)[0], 3)
            except lora_apply.CannotSwitch as exc:
                record[name] = f"refused: {exc}"
        if args.fp8 and device.type == "cuda":
            for block in model.transformer_blocks:
                block.use_fp8_gemms(emulate=False)
            torch.cuda.empty_cache()
            try:
                record["fp8_switch_strength_s"] = round(timed(lambda: apply_loras(model, [lora_choice(path, 0.25)]),
                                                              device)[0], 3)
            except lora_apply.CannotSwitch as exc:
                record["fp8_switch_strength_s"] = f"refused: {exc}"
        record["branch"] = branch_cost(shapes, lora, args.tokens if not args.tiny else 256, args.rank, device, dtype)
    for key in ("write_s", "header_check_s", "merge_at_load_s"):
        record[key] = round(record[key], 3)
    print(json.dumps(record))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
