"""Write the SeedVR2 DiT goldens from the OFFICIAL NaDiT modules:
tests/fixtures/seedvr2_dit_3b.safetensors, seedvr2_dit_7b.safetensors and seedvr2_dit_keys.json.

Usage (in a separate environment with torch, diffusers 0.29.1, einops 0.7.0, rotary-embedding-torch 0.5.3,
omegaconf and safetensors; never the project venv):
    python tools/make_seedvr2_dit_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out DIR/any-name]
(the three files go to the folder of --out; default tests/fixtures/).

The checkout (github.com/ByteDance-Seed/SeedVR) is imported from the given path and is never committed.
- Keys: the released configs (configs_3b/main.yaml builds models.dit_v2.nadit.NaDiT, configs_7b/main.yaml builds
  models.dit.nadit.NaDiT) are instantiated on the meta device; their state dict keys/shapes in order and parameter
  counts go to seedvr2_dit_keys.json, so tests check the released key sets without the official code.
- Numerics: tiny configs made from the released ones by overriding only the sizes (width, heads, head_dim, layers,
  mm_layers, rope_dim, text width, window counts), float32. Only the outputs (and the official RoPE freqs buffer)
  are stored: the random-looking weights and inputs come from tools/seedvr2_det.py (exact integer arithmetic that
  tests/pipelines/seedvr2/test_seedvr2_dit.py imports too; per-weight and per-input sums in the metadata guard it), so
  the fixtures stay under 3 MB (stored bfloat16 weights would add 1.6 MB).
- Patches, in memory only: an `apex.normalization` stub (FusedRMSNorm = float32 RMSNorm math, FusedLayerNorm =
  nn.LayerNorm) and a `flash_attn.flash_attn_varlen_func` stub (exact per-segment softmax attention in float64)
  because neither installs on CPU; `torch.Tensor.bfloat16` is the identity while the DiT runs (the official
  attention casts q/k/v to bf16 even in a float32 run). Each model runs with its own forward defaults (the 3B's
  enabled cache is what makes its output head reuse the attention modulation slice).
"""

from __future__ import annotations

import importlib
import json
import sys
import types

from seedvr2_det import det_dit_weights, det_uniform  # noqa: E402 - tools/ is sys.path[0] for a script
from seedvr2_official import official_checkout, write_golden  # noqa: E402

TXT_DIM = 32
# Tiny sizes per variant (everything else from the released config).
TINY = {
    "3b": dict(vid_dim=64, heads=2, head_dim=32, num_layers=4, mm_layers=2, rope_dim=32),
    "7b": dict(vid_dim=64, heads=2, head_dim=48, num_layers=4),
}
# (token grid (T, H, W) after the (1, 2, 2) patch, window counts, text length, timestep). The models' counts
# (4, 3, 3) on 16:9, portrait and temporal grids (an empty shifted t window at (10, 6, 8)); small counts on a small
# grid for many windows of many shapes; one other timestep.
CASES = [
    ((1, 20, 36), (4, 3, 3), 6, 1000.0),
    ((3, 20, 36), (4, 3, 3), 6, 1000.0),
    ((10, 6, 8), (4, 3, 3), 5, 1000.0),
    ((3, 31, 17), (4, 3, 3), 7, 1000.0),
    ((5, 9, 11), (2, 12, 15), 3, 437.0),
]


def _install_stubs(torch):
    from torch import nn

    class FusedRMSNorm(nn.Module):
        def __init__(self, normalized_shape, elementwise_affine=True, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(normalized_shape)) if elementwise_affine else None

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            if self.weight is not None:
                y = y * self.weight.float()
            return y.to(x.dtype)

    apex = types.ModuleType("apex")
    norm = types.ModuleType("apex.normalization")
    norm.FusedRMSNorm = FusedRMSNorm
    norm.FusedLayerNorm = nn.LayerNorm
    apex.normalization = norm

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, **_):
        out = torch.empty_like(q)
        bounds = cu_seqlens_q.tolist()
        assert bounds == cu_seqlens_k.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            qs, ks, vs = (x[a:b].transpose(0, 1).double() for x in (q, k, v))  # h l d
            p = torch.softmax(qs @ ks.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
            out[a:b] = (p @ vs).transpose(0, 1).to(q.dtype)
        return out

    fa = types.ModuleType("flash_attn")
    fa.flash_attn_varlen_func = flash_attn_varlen_func
    sys.modules.update({"apex": apex, "apex.normalization": norm, "flash_attn": fa})


def _released_kwargs(checkout, variant):
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("eval"):
        OmegaConf.register_new_resolver("eval", eval)
    cfg = OmegaConf.load(str(checkout / f"configs_{variant}" / "main.yaml"))
    kwargs = OmegaConf.to_container(cfg.dit.model, resolve=True)
    obj = kwargs.pop("__object__")
    return getattr(importlib.import_module(obj["path"]), obj["name"]), obj["path"], kwargs


def _tiny_kwargs(kwargs, variant, counts):
    kw = dict(kwargs)
    kw.update(TINY[variant])
    n = kw["num_layers"]
    kw["txt_dim"] = kw["vid_dim"]
    kw["emb_dim"] = 6 * kw["vid_dim"]
    kw["txt_in_dim"] = TXT_DIM
    kw["block_type"] = n * ["mmdit_sr"]
    kw["window"] = n * [tuple(counts)]
    kw["window_method"] = n // 2 * ["720pwin_by_size_bysize", "720pswin_by_size_bysize"]
    return kw


def _our_config(variant, kw, counts):
    """The fields of backend/models/seedvr2/dit_config.DiTConfig for these official kwargs."""
    dim = kw["vid_dim"]
    if variant == "3b":
        hidden = int(2 * dim * kw["expand_ratio"] / 3)
        hidden = 256 * ((hidden + 255) // 256)
        extra = dict(mm_layers=kw["mm_layers"], mlp="swiglu", mlp_hidden=hidden, rope="mmrope3d",
                     rope_dim=kw["rope_dim"])
    else:
        extra = dict(mm_layers=kw["num_layers"], mlp="gelu", mlp_hidden=dim * kw["expand_ratio"], rope="pixel",
                     rope_dim=kw["head_dim"] // 2)
    return dict(variant=variant, dim=dim, heads=kw["heads"], head_dim=kw["head_dim"], layers=kw["num_layers"],
                txt_dim=kw["txt_in_dim"], vid_in_channels=kw["vid_in_channels"],
                vid_out_channels=kw["vid_out_channels"], patch=list(kw["patch_size"]), window_counts=list(counts),
                norm_eps=float(kw["norm_eps"]), **extra)


def official_forward(net, vid, txt, timestep):
    """The official DiT on one clip `vid` [t, H, W, C] (H, W: twice the latent grid) and its text `txt` [L, D], in
    float32 throughout: its attention casts to bfloat16, which is made a no-op for the duration."""
    import torch

    t, height, width = vid.shape[:3]
    patched = torch.Tensor.bfloat16
    torch.Tensor.bfloat16 = lambda self, *a, **k: self  # keep the official attention in float32
    try:
        with torch.no_grad():
            return net(
                vid=vid.reshape(-1, vid.shape[-1]), txt=txt, vid_shape=torch.tensor([[t, height, width]]),
                txt_shape=torch.tensor([[txt.shape[0]]]), timestep=torch.tensor([timestep]),
            ).vid_sample
    finally:
        torch.Tensor.bfloat16 = patched


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_dit_3b.safetensors")
    import torch

    _install_stubs(torch)
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    source = {"source": "github.com/ByteDance-Seed/SeedVR", "commit": commit,
              "made_by": "tools/make_seedvr2_dit_goldens.py"}

    keys = dict(source)
    for variant in ("3b", "7b"):
        cls, path, kw = _released_kwargs(checkout, variant)
        with torch.device("meta"):
            net = cls(**kw)
        keys[variant] = {
            "module": f"{path}.{cls.__name__}",
            "params": sum(p.numel() for p in net.parameters()),
            "keys": [[k, list(t.shape)] for k, t in net.state_dict().items()],
        }
    keys_path = out_dir / "seedvr2_dit_keys.json"
    keys_path.write_text(json.dumps(keys, separators=(",", ":")) + "\n")
    print(f"wrote {keys_path} ({keys_path.stat().st_size} bytes)")

    for vi, variant in enumerate(("3b", "7b")):
        cls, path, released = _released_kwargs(checkout, variant)
        tensors, cases, sums = {}, [], {}
        # Window counts are per layer in the official config: each case builds the model with its counts and
        # loads the same weights.
        for ci, (grid, counts, txt_len, timestep) in enumerate(CASES):
            kw = _tiny_kwargs(released, variant, counts)
            net = cls(**kw).eval()
            if ci == 0:
                config = _our_config(variant, kw, counts)
                params = dict(net.named_parameters())
                weights = det_dit_weights({k: list(p.shape) for k, p in params.items()})
                sums = {k: float(v.double().sum()) for k, v in weights.items()}
                freqs = net.blocks[0].attn.rope.rope.freqs.clone()
            with torch.no_grad():
                for k, p in net.named_parameters():
                    p.copy_(weights[k])
            t, h, w = grid
            vid = det_uniform((t, 2 * h, 2 * w, kw["vid_in_channels"]), salt=10 * ci + 1)
            txt = det_uniform((txt_len, TXT_DIM), salt=10 * ci + 2)
            out = official_forward(net, vid, txt, timestep)
            tensors[f"{ci}.out"] = out.reshape(t, 2 * h, 2 * w, -1).contiguous()
            cases.append({"grid": list(grid), "counts": list(counts), "txt_len": txt_len, "timestep": timestep,
                          "vid_sum": float(vid.double().sum()), "txt_sum": float(txt.double().sum())})
            print(variant, grid, counts, "out std", float(out.std()))
        tensors["rope_freqs"] = freqs.float().contiguous()  # the official buffer of every block
        meta = dict(source, variant=variant, module=f"{path}.{cls.__name__}", config=json.dumps(config),
                    cases=json.dumps(cases), txt_dim=str(TXT_DIM),
                    weight_sums=json.dumps(sums))
        dest = out_dir / f"seedvr2_dit_{variant}.safetensors"
        write_golden(dest, tensors, meta, f", {len(CASES)} cases")


if __name__ == "__main__":
    main()
