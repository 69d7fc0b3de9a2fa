"""Write a random H3 LoRA (every block's attention, MLP and AdaLN projections) in one of the layouts the pack reads:
for tests, demos and timing a full-size LoRA without downloading one.

    python tools/write_lora.py OUT.safetensors [--layout diffusers|peft|kohya|native] [--rank 4] [--seed 2024]
        [--config transformer/config.json] [--dtype float32|bfloat16]

Without --config the LoRA fits the tiny H3 set; a released transformer/config.json makes a full-size one (rank 64 in
bfloat16 is ~1.3 GB for all 50 blocks). An existing OUT is never replaced.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    import torch

    from comfyui_h3.backend.models.lora_write import LAYOUTS, make_random_lora

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layout", choices=LAYOUTS, default="kohya")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--config", help="a transformer config.json (default: the tiny set's)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    args = ap.parse_args(argv)
    config = json.load(open(args.config)) if args.config else None
    path = make_random_lora(args.out, config, args.rank, args.seed, args.layout, getattr(torch, args.dtype))
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB, {args.layout}, rank {args.rank})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
