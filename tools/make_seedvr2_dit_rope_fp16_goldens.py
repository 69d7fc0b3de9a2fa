"""Write tests/fixtures/seedvr2_dit_rope_fp16.safetensors from the OFFICIAL NaDiT modules: the tiny 3B and 7B of
tools/make_seedvr2_dit_goldens.py (same configs, deterministic weights and inputs) run in float32 with every
block's ``rope.rope.freqs`` buffer a float16 tensor, as the official loader leaves it after loading a released fp16
checkpoint (``load_state_dict(..., assign=True)``). The official code rotates with that buffer (positions cast to
its dtype), so this is what a file with fp16-rounded buffers must give.

Usage (in the environment of tools/make_seedvr2_dit_goldens.py):
    python tools/make_seedvr2_dit_rope_fp16_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out FILE]
Stored per variant: ``{variant}.out`` (the official output), ``{variant}.freqs`` (the fp16 buffer) and, in the
metadata, the case (its input sums as in the DiT goldens) and the fp32 weight sums. The text is long (240 tokens)
so that the 3B's positions reach 250 and the fp16 rounding of its frequencies shows in the output.
"""

from __future__ import annotations

import json

from make_seedvr2_dit_goldens import (TXT_DIM, _install_stubs, _released_kwargs, _tiny_kwargs,  # noqa: E402
                                     official_forward)
from seedvr2_det import det_dit_weights, det_uniform  # noqa: E402
from seedvr2_official import official_checkout, write_golden  # noqa: E402

# (token grid, window counts, text length, timestep); SALT picks the deterministic inputs (det_uniform).
CASE = ((10, 6, 8), (4, 3, 3), 240, 1000.0)
SALT = 7


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_dit_rope_fp16.safetensors")
    import torch

    _install_stubs(torch)
    grid, counts, txt_len, timestep = CASE
    tensors, sums = {}, {}
    for variant in ("3b", "7b"):
        cls, _, released = _released_kwargs(checkout, variant)
        net = cls(**_tiny_kwargs(released, variant, counts)).eval()
        params = dict(net.named_parameters())
        weights = det_dit_weights({k: list(p.shape) for k, p in params.items()})
        sums[variant] = {k: float(v.double().sum()) for k, v in weights.items()}
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(weights[k])
            rounded = None
            for name, mod in net.named_modules():
                if name.endswith("rope.rope"):
                    rounded = mod.freqs.half()
                    mod.freqs = rounded.clone()  # what assign=True leaves from an fp16 file
        t, h, w = grid
        vid = det_uniform((t, 2 * h, 2 * w, released["vid_in_channels"]), salt=10 * SALT + 1)
        txt = det_uniform((txt_len, TXT_DIM), salt=10 * SALT + 2)
        out = official_forward(net, vid, txt, timestep)
        tensors[f"{variant}.out"] = out.reshape(t, 2 * h, 2 * w, -1).contiguous()
        tensors[f"{variant}.freqs"] = rounded.contiguous()
        print(variant, "out std", float(out.std()))
        case = {"salt": SALT, "grid": list(grid), "counts": list(counts), "txt_len": txt_len, "timestep": timestep,
                "vid_sum": float(vid.double().sum()), "txt_sum": float(txt.double().sum())}
    meta = {"source": "github.com/ByteDance-Seed/SeedVR", "commit": commit,
            "made_by": "tools/make_seedvr2_dit_rope_fp16_goldens.py", "case": json.dumps(case),
            "weight_sums": json.dumps(sums)}
    write_golden(args.out, tensors, meta)


if __name__ == "__main__":
    main()
