"""Write tests/fixtures/seedvr2_vae.safetensors and tests/fixtures/seedvr2_vae_keys.json from the OFFICIAL SeedVR
video VAE (models/video_vae_v3, config s8_c16_t4_inflation_sd3.yaml).

Usage (in a separate environment with torch, diffusers 0.29.1, einops, omegaconf and safetensors; never the project
venv):
    python tools/make_seedvr2_vae_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out ...]

The checkout (github.com/ByteDance-Seed/SeedVR) is imported from the given path and is never committed; nothing is
patched (with no process group the official code runs single-rank and its causal slicing needs none).

- seedvr2_vae_keys.json: the released model built from the yaml on the meta device (no weights): every state-dict
  key with its shape, and the parameter count.
- seedvr2_vae.safetensors: a tiny VAE of the released structure (block channels 8, 16, 24, 24, 4 groups: the shortcut
  convs sit in the same blocks, 250 tensors), random float32 weights whose values are float16-exact (stored as float16,
  "w.<key>"), and in float32 on CPU:
  encode cases "enc.<i>": input video "x" [1, 3, F, H, W] (float16-exact), the posterior mean and clamped logvar of
  the whole pass ("mean", "logvar") and, for the longer clips, of the official causal slicing (split_size 4:
  "sliced.mean", "sliced.logvar"); decode cases "dec.<i>": latents "z" (float16-exact) and the whole-pass decode
  ("out"; "sliced.out" for the longest). The logvar bias of two channels is pushed past the clamp range so that the
  official clamp [-30, 20] is exercised.
"""

from __future__ import annotations

import json

from seedvr2_official import official_checkout, write_golden  # noqa: E402 - tools/ is sys.path[0] for a script

YAML = "models/video_vae_v3/s8_c16_t4_inflation_sd3.yaml"
TINY = {"block_out_channels": [8, 16, 24, 24], "norm_num_groups": 4}
# (frames, H, W); 20 x 28 is not a multiple of 8 (the official pads right/bottom: latents 3 x 4).
ENCODE = [(1, 32, 48), (5, 32, 48), (9, 32, 48), (17, 16, 24), (5, 20, 28)]
ENCODE_SLICED = {2, 3}
# (latent frames, h, w)
DECODE = [(1, 4, 6), (2, 4, 6), (3, 3, 5), (5, 2, 3)]
DECODE_SLICED = {3}
LATENT = 16


def _build(torch, create_object, OmegaConf, checkout, overrides):
    cfg = OmegaConf.merge(OmegaConf.load(str(checkout / YAML)), {"freeze_encoder": False}, overrides)
    return create_object(cfg)


def _randomise(torch, vae, gen):
    """Random weights of sensible scale, float16-exact; upscale convs random too (identity would hide the
    depth-to-space channel order); two logvar channels pushed past the clamp range."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if p.ndim == 1 and ("norm" in name.split(".")[-2]):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / (p[0].numel() ** 0.5))
        latent = vae.encoder.conv_out.bias.numel() // 2
        vae.encoder.conv_out.bias[latent] += 40.0
        vae.encoder.conv_out.bias[latent + 1] -= 45.0
        for p in vae.parameters():
            p.copy_(p.half().float())


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_vae.safetensors")
    import torch
    from omegaconf import OmegaConf

    from common.config import create_object
    from models.video_vae_v3.modules.attn_video_vae import VideoAutoencoderKL

    meta = {"source": "github.com/ByteDance-Seed/SeedVR", "commit": commit,
            "made_by": "tools/make_seedvr2_vae_goldens.py", "config": YAML}

    # Released key list, on the meta device.
    with torch.device("meta"):
        released = _build(torch, create_object, OmegaConf, checkout, {})
    sd = released.state_dict()
    keys = {k: list(v.shape) for k, v in sd.items()}
    keys_doc = dict(meta, params=sum(v.numel() for v in sd.values()), tensors=len(keys), keys=keys)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    keys_path = args.out.parent / "seedvr2_vae_keys.json"
    head = json.dumps({k: v for k, v in keys_doc.items() if k != "keys"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in keys.items())
    keys_path.write_text(f"{head},\n \"keys\": {{\n{rows}\n }}\n}}\n")  # one key per line, in module order
    del released, sd

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2025)
    vae = _build(torch, create_object, OmegaConf, checkout, TINY).eval()
    _randomise(torch, vae, gen)
    tensors = {f"w.{k}": v.half() for k, v in vae.state_dict().items()}

    def encode(x, sliced):
        vae.set_causal_slicing(split_size=4 if sliced else None, memory_device="same" if sliced else None)
        post = VideoAutoencoderKL.encode(vae, x).latent_dist
        return post.mean.contiguous(), post.logvar.contiguous()

    def decode(z, sliced):
        vae.set_causal_slicing(split_size=4 if sliced else None, memory_device="same" if sliced else None)
        return VideoAutoencoderKL.decode(vae, z).sample.contiguous()

    with torch.no_grad():
        for i, (f, h, w) in enumerate(ENCODE):
            x = (torch.rand(1, 3, f, h, w, generator=gen) * 2 - 1).half()
            tensors[f"enc.{i}.x"] = x
            tensors[f"enc.{i}.mean"], tensors[f"enc.{i}.logvar"] = encode(x.float(), False)
            if i in ENCODE_SLICED:
                tensors[f"enc.{i}.sliced.mean"], tensors[f"enc.{i}.sliced.logvar"] = encode(x.float(), True)
        for i, (t, h, w) in enumerate(DECODE):
            z = torch.randn(1, LATENT, t, h, w, generator=gen).half()
            tensors[f"dec.{i}.z"] = z
            tensors[f"dec.{i}.out"] = decode(z.float(), False)
            if i in DECODE_SLICED:
                tensors[f"dec.{i}.sliced.out"] = decode(z.float(), True)

    meta.update(tiny=json.dumps(TINY), encode=json.dumps(ENCODE), decode=json.dumps(DECODE),
                torch=torch.__version__)
    write_golden(args.out, tensors, meta, f") and {keys_path} ({keys_doc['params']} parameters")


if __name__ == "__main__":
    main()
