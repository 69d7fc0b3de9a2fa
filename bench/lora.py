"""Time merging a LoRA into the H3 DiT (issue 32): a random rank-R LoRA over every block's attention, MLP and AdaLN
projections (tools/write_lora.py's layout), merged into a random DiT of the released shape on the GPU, as a load
does it (models/lora.py: header and shape check, NaN check, then the merge).

    python bench/lora.py [--rank 64] [--layout kohya] [--tiny] [--json FILE]

Reports: the file's size, the header check, the NaN check and the merge (seconds, synchronised), and a switch done
as un-merge (strength -s) plus merge at another strength: what switching in place by re-merging would cost on
device-resident weights. --tiny: the tiny set's shape on the CPU (a dry run of the script).
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
from comfyui_h3.backend.models.lora import lora_choice, merge_loras, read_lora  # noqa: E402
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--layout", default="kohya")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    cfg = H3TransformerConfig.from_dict(dict(TINY_TRANSFORMER_CONFIG)) if args.tiny else H3TransformerConfig()
    with torch.device("meta"):
        model = H3Transformer(cfg)
    model = random_dit_(model.to(dtype).to_empty(device=device)).eval().requires_grad_(False)
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lora.safetensors")
        write_s, _ = timed(lambda: make_random_lora(path, cfg.to_dict(), args.rank, layout=args.layout,
                                                    dtype=torch.bfloat16), torch.device("cpu"))
        header_s, lora = timed(lambda: read_lora(path, shapes), torch.device("cpu"))
        choice = lora_choice(path, 1.0)
        merge_s, _ = timed(lambda: merge_loras(model, [choice]), device)
        unmerge_s, _ = timed(lambda: merge_loras(model, [lora_choice(path, -1.0)]), device)
        remerge_s, _ = timed(lambda: merge_loras(model, [lora_choice(path, 0.5)]), device)
        record = {"bench": "lora_merge", "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                  "torch": torch.__version__, "blocks": cfg.num_layers, "rank": args.rank, "layout": args.layout,
                  "dtype": str(dtype).removeprefix("torch."), "modules": len(lora.edits),
                  "file_mib": round(os.path.getsize(path) / 2**20, 1), "write_s": round(write_s, 3),
                  "header_check_s": round(header_s, 3), "merge_s": round(merge_s, 3),
                  "switch_s": round(unmerge_s + remerge_s, 3)}
    print(json.dumps(record))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
