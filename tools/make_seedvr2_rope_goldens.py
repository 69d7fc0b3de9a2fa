"""Write tests/fixtures/seedvr2_rope.safetensors from the OFFICIAL SeedVR window RoPE modules.

Usage (in a separate environment with torch, einops, rotary-embedding-torch and safetensors; never the project venv):
    python tools/make_seedvr2_rope_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out ...]

The checkout (github.com/ByteDance-Seed/SeedVR) is imported from the given path and is never committed. Tiny random
float32 q/k (CPU) go through the modules exactly as the window attention calls them: the 3B's
``NaMMRotaryEmbedding3d(dim=128)`` (models/dit_v2/rope.py) with the window shapes and the text repeated per window
(as ``NaSwinAttention.forward`` does), and the 7B's ``NaRotaryEmbedding3d(dim=head_dim // 2)`` (models/dit/rope.py,
as ``NaMMSRTransformerBlock`` builds it) with the window shapes. All windows of a model go in one call (the
official concatenation of per-window tables). The freshly built modules' ``freqs`` buffers are stored too.
"""

from __future__ import annotations

import json

from seedvr2_official import official_checkout, write_golden  # noqa: E402 - tools/ is sys.path[0] for a script

HEADS, HEAD_DIM, TXT_LEN = 2, 128, 6
SHAPES_3B = [(2, 2, 3), (1, 3, 2), (2, 1, 1)]
SHAPES_7B = [(2, 3, 2), (1, 2, 3), (1, 1, 1)]


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_rope.safetensors")
    import torch

    from common.cache import Cache
    from models.dit.rope import NaRotaryEmbedding3d
    from models.dit_v2.rope import NaMMRotaryEmbedding3d

    gen = torch.Generator().manual_seed(4321)
    tensors = {}

    # 3B: video of all windows, text repeated once per window (each copy gets the same text table).
    rope3b = NaMMRotaryEmbedding3d(dim=HEAD_DIM)
    n3 = sum(t * h * w for t, h, w in SHAPES_3B)
    vq, vk = (torch.randn(n3, HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    tq, tk = (torch.randn(TXT_LEN, HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    win = len(SHAPES_3B)
    out = rope3b(
        vq, vk, torch.tensor(SHAPES_3B), tq.repeat(win, 1, 1), tk.repeat(win, 1, 1),
        torch.tensor([[TXT_LEN]] * win), Cache(),
    )
    oq, ok, otq, otk = out
    for i in range(1, win):  # every window's text copy is rotated identically
        assert torch.equal(otq[:TXT_LEN], otq[i * TXT_LEN:(i + 1) * TXT_LEN])
    tensors.update({
        "3b.q_vid": vq, "3b.k_vid": vk, "3b.q_txt": tq, "3b.k_txt": tk,
        "3b.out_q_vid": oq, "3b.out_k_vid": ok, "3b.out_q_txt": otq[:TXT_LEN], "3b.out_k_txt": otk[:TXT_LEN],
        "3b.freqs": rope3b.rope.freqs.float(),
    })

    # 7B: video only.
    rope7b = NaRotaryEmbedding3d(dim=HEAD_DIM // 2)
    n7 = sum(t * h * w for t, h, w in SHAPES_7B)
    q, k = (torch.randn(n7, HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    oq, ok = rope7b(q, k, torch.tensor(SHAPES_7B), Cache())
    tensors.update({"7b.q_vid": q, "7b.k_vid": k, "7b.out_q_vid": oq, "7b.out_k_vid": ok,
                    "7b.freqs": rope7b.rope.freqs.float()})

    meta = {
        "source": "github.com/ByteDance-Seed/SeedVR",
        "commit": commit,
        "made_by": "tools/make_seedvr2_rope_goldens.py",
        "shapes_3b": json.dumps(SHAPES_3B),
        "shapes_7b": json.dumps(SHAPES_7B),
        "txt_len": str(TXT_LEN),
    }
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    write_golden(args.out, tensors, meta)


if __name__ == "__main__":
    main()
