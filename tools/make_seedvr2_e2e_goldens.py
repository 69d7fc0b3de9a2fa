"""Write tests/fixtures/seedvr2_e2e.safetensors: one whole SeedVR2 restoration (one sample, one step) run by the
OFFICIAL code, with tiny models, in float32 on CPU.

Usage (in a separate environment with torch, torchvision, diffusers 0.29.1, einops 0.7.0, rotary-embedding-torch
0.5.3, omegaconf and safetensors; never the project venv):
    python tools/make_seedvr2_e2e_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out ...]

What runs is the official recipe of projects/inference_seedvr2_{3b,7b}.py for one video:
- its preprocessing, rebuilt from its own transforms (the script reads files; here the frames are given): frames
  uint8 -> / 255, NaResize "area" (bicubic, antialias) with res_h x res_w = the x2 size, clamp 0..1, DivisibleCrop
  16, Normalize(0.5, 0.5), "t c h w -> c t h w"; the last frame repeated to 4n+1 (its cut_videos, sp_size 1);
- VideoDiffusionInfer (projects/video_diffusion_sr/infer.py) from configs_{3b,7b}/main.yaml with the DiT and VAE
  sizes made tiny, vae dtype float32, loaded from checkpoints of deterministic weights through its own
  configure_dit_model / configure_vae_model (strict loads; causal slicing and memory limits as configured);
  vae_encode (posterior sample x 0.9152), the script's own generation_step (x_T and aug noise by randn_like,
  cond_noise_scale 0, get_condition "sr") and runner.inference with cfg 1 and 1 sampling step (Euler, v_lerp,
  uniform trailing: t = 1000, x0 = x_T - v), vae_decode;
- the script's output path: cut to the original frame count, the colour fix against the transformed input
  (projects/video_diffusion_sr/color_fix.py's wavelet_reconstruction when the checkout has it; the file is not in
  the repository, so by default `wavelet_reconstruction` below, written from StableSR's math: five levels of a
  dilated 3x3 [1 2 1]-binomial blur with replicate padding, radius 1, 2, 4, 8, 16, the content's high frequencies
  (accumulated per level) plus the input's low frequencies), clip(-1, 1) * 0.5 + 0.5, * 255, round, uint8.
The randomness is recorded by wrapping torch.randn / torch.randn_like while the official code runs (order: the
posterior eps, x_T, the aug noise; the last is multiplied by 0) and stored, so our test injects the same draws.

Patches, in memory only (see make_seedvr2_dit_goldens.py): the apex / flash_attn stubs and torch.Tensor.bfloat16 as
the identity (the official attention casts to bf16 even in float32), common.distributed.get_device -> CPU, a one-rank
gloo process group (its @log_runtime decorators call barrier()), a
`mediapy` and a `torchvision.io.video` stub (the script imports them to read and write files; unused here).

Weights: DiT and VAE from tools/seedvr2_det.py (det_dit_weights, det_vae_weights; the tests rebuild them from the same
module); per-tensor sums in the metadata guard
that. The fixture holds the input frames, the text embedding, per variant the recorded eps and x_T, the condition
latent and x0 (to localise a difference), the decoded frames before and after the colour fix (float32, [F, 3, H, W],
cut to the input's frame count) and the uint8 frames [F, H, W, 3].
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from pathlib import Path

from seedvr2_det import det_dit_weights, det_uniform, det_vae_weights  # noqa: E402 - tools/ is sys.path[0]
from seedvr2_official import official_checkout, write_golden  # noqa: E402

VARIANTS = ("3b", "7b")
COUNTS = (4, 3, 3)
FRAMES, HEIGHT, WIDTH, SCALE = 7, 27, 43, 2  # -> 54 x 86, cropped to 48 x 80 at (3, 3); 7 frames -> 9 for the model
TXT_LEN = 5
VAE_TINY = {"block_out_channels": [8, 16, 24, 24], "norm_num_groups": 4}
DECODER_OUT_GAIN = 0.25  # keeps the random decoder's output mostly inside [-1, 1], so the uint8 frames are not clipped
SEED = 666  # the official scripts' default


def wavelet_blur(x, radius):
    import torch
    import torch.nn.functional as F

    k = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]], dtype=x.dtype, device=x.device) / 16
    c = x.shape[1]
    return F.conv2d(F.pad(x, (radius,) * 4, mode="replicate"), k.expand(c, 1, 3, 3), groups=c, dilation=radius)


def wavelet_decomposition(x, levels=5):
    """(high, low): the high frequencies accumulated level by level, as StableSR does (not x - low in one step)."""
    import torch

    high = torch.zeros_like(x)
    for i in range(levels):
        low = wavelet_blur(x, 2**i)
        high += x - low
        x = low
    return high, low


def wavelet_reconstruction(content, style):
    """content [N, C, H, W] with style's low frequencies (StableSR's wavelet colour fix)."""
    return wavelet_decomposition(content)[0] + wavelet_decomposition(style)[1]


def _install_io_stubs(torch):
    import common.distributed as dist_pkg
    import common.distributed.basic as dist_basic

    cpu = lambda: torch.device("cpu")  # noqa: E731
    dist_pkg.get_device = dist_basic.get_device = cpu
    sys.modules["mediapy"] = types.ModuleType("mediapy")
    video = types.ModuleType("torchvision.io.video")

    def read_video(*_, **__):
        raise RuntimeError("files are not read by the golden script")

    video.read_video = read_video
    sys.modules["torchvision.io.video"] = video
    return cpu


class RandomDraws:
    """Wraps torch.randn / torch.randn_like while active, keeping a copy of every draw in order."""

    def __init__(self, torch):
        self.torch, self.draws = torch, []

    def __enter__(self):
        t = self.torch
        self.real = t.randn, t.randn_like

        def randn(*a, **k):
            x = self.real[0](*a, **k)
            self.draws.append(("randn", x.clone()))
            return x

        def randn_like(*a, **k):
            x = self.real[1](*a, **k)
            self.draws.append(("randn_like", x.clone()))
            return x

        t.randn, t.randn_like = randn, randn_like
        return self

    def __exit__(self, *exc):
        self.torch.randn, self.torch.randn_like = self.real


def _runner(torch, checkout, variant, tiny_kwargs, our_config, tmp):
    """The official VideoDiffusionInfer of `variant` at tiny sizes, loaded from deterministic weights."""
    from omegaconf import OmegaConf

    from common.config import create_object, load_config
    from projects.video_diffusion_sr.infer import VideoDiffusionInfer

    config = load_config(str(checkout / f"configs_{variant}" / "main.yaml"))
    OmegaConf.set_readonly(config, False)
    dit_kw = OmegaConf.to_container(config.dit.model, resolve=True)
    obj = dit_kw.pop("__object__")
    kw = tiny_kwargs(dit_kw, variant, COUNTS)
    config.dit.model = OmegaConf.create(dict(kw, __object__=obj))
    config.vae.model = OmegaConf.merge(config.vae.model, VAE_TINY)
    config.vae.dtype = "float32"

    dit = create_object(config.dit.model)
    weights = det_dit_weights({k: list(p.shape) for k, p in dit.named_parameters()})
    state = {k: weights.get(k, v) for k, v in dit.state_dict().items()}  # buffers (RoPE freqs) as built
    dit_sums = {k: float(v.double().sum()) for k, v in weights.items()}
    torch.save(state, tmp / f"dit_{variant}.pth")
    vae = create_object(config.vae.model)
    vae_weights = det_vae_weights({k: list(p.shape) for k, p in vae.named_parameters()}, DECODER_OUT_GAIN)
    assert set(vae_weights) == set(vae.state_dict()), "the VAE has buffers: store them too"
    vae_sums = {k: float(v.double().sum()) for k, v in vae_weights.items()}
    torch.save(vae_weights, tmp / "vae.pth")
    del dit, vae
    config.vae.checkpoint = str(tmp / "vae.pth")

    runner = VideoDiffusionInfer(config)
    runner.configure_dit_model(device="cpu", checkpoint=str(tmp / f"dit_{variant}.pth"))
    runner.configure_vae_model()
    runner.vae.set_memory_limit(**runner.config.vae.memory_limit)  # as configure_runner does
    runner.config.diffusion.cfg.scale = 1.0
    runner.config.diffusion.cfg.rescale = 0.0
    runner.config.diffusion.timesteps.sampling.steps = 1
    runner.configure_diffusion()
    return runner, our_config(variant, kw, COUNTS), dit_sums, vae_sums


def _preprocess(torch, frames_u8):
    """The official script's video_transform and cut_videos (sp_size 1) for frames [F, h, w, 3] uint8."""
    from torchvision.transforms import Compose, Lambda, Normalize

    from data.image.transforms.divisible_crop import DivisibleCrop
    from data.image.transforms.na_resize import NaResize
    from data.video.transforms.rearrange import Rearrange

    res_h, res_w = SCALE * HEIGHT, SCALE * WIDTH  # "area" mode: the x2 area
    transform = Compose([
        NaResize(resolution=(res_h * res_w) ** 0.5, mode="area", downsample_only=False),
        Lambda(lambda x: torch.clamp(x, 0.0, 1.0)),
        DivisibleCrop((16, 16)),
        Normalize(0.5, 0.5),
        Rearrange("t c h w -> c t h w"),
    ])
    video = transform(frames_u8.permute(0, 3, 1, 2) / 255.0)  # read_video(..., "TCHW") / 255.0
    t = video.size(1)
    padded = video
    if t > 1 and (t - 1) % 4:
        padded = torch.cat([video] + [video[:, -1:]] * (4 - (t - 1) % 4), dim=1)
    return video, padded


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_e2e.safetensors")
    import torch
    from einops import rearrange

    from make_seedvr2_dit_goldens import TXT_DIM, _install_stubs, _our_config, _tiny_kwargs

    os.chdir(checkout)  # load_config resolves `__inherit__` paths against the working directory
    _install_stubs(torch)
    cpu = _install_io_stubs(torch)
    try:
        from projects.video_diffusion_sr.color_fix import wavelet_reconstruction as colour_fix
        colour_fix_source = "projects/video_diffusion_sr/color_fix.py"
    except ImportError:
        colour_fix, colour_fix_source = wavelet_reconstruction, "tools/make_seedvr2_e2e_goldens.py (StableSR math)"

    # colour gradients with noise on top (structure for the VAE and the colour fix, detail for the resize)
    noise = det_uniform((FRAMES, HEIGHT, WIDTH, 3), salt=7) * 0.5 + 0.5
    yy = torch.linspace(0, 1, HEIGHT)[:, None, None].expand(HEIGHT, WIDTH, 1)
    xx = torch.linspace(0, 1, WIDTH)[None, :, None].expand(HEIGHT, WIDTH, 1)
    ramp = torch.cat([yy, xx, (yy + xx) / 2], -1)
    frames = ((3 * ramp + noise) / 4).mul(255).round().to(torch.uint8)
    text = det_uniform((TXT_LEN, TXT_DIM), salt=8)

    tensors = {"frames_in": frames.contiguous(), "text": text.contiguous()}
    meta = {"source": "github.com/ByteDance-Seed/SeedVR", "commit": commit,
            "made_by": "tools/make_seedvr2_e2e_goldens.py", "torch": torch.__version__,
            "scale": str(SCALE), "fit": "crop", "colour_fix": colour_fix_source, "vae_tiny": json.dumps(VAE_TINY),
            "decoder_out_gain": repr(DECODER_OUT_GAIN), "txt_dim": str(TXT_DIM)}

    patched = torch.Tensor.bfloat16
    torch.Tensor.bfloat16 = lambda self, *a, **k: self  # keep the official attention in float32
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # one-rank gloo group: the official @log_runtime decorators call torch.distributed.barrier()
            torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
            for variant in VARIANTS:
                runner, config, dit_sums, vae_sums = _runner(torch, checkout, variant, _tiny_kwargs, _our_config,
                                                             Path(tmp))
                script = __import__(f"projects.inference_seedvr2_{variant}", fromlist=["generation_step"])
                script.get_device = cpu
                decoded_latents = []
                vae_decode = runner.vae_decode

                def record_decode(latents):  # x0 of the one step, as the sampler hands it to the VAE
                    decoded_latents.extend(x.clone() for x in latents)
                    return vae_decode(latents)

                runner.vae_decode = record_decode
                torch.manual_seed(SEED)
                with torch.no_grad(), RandomDraws(torch) as rec:
                    video, padded = _preprocess(torch, frames)
                    cond = runner.vae_encode([padded])
                    samples = script.generation_step(
                        runner, {"texts_pos": [text], "texts_neg": [text]}, cond_latents=cond)
                kinds = [k for k, _ in rec.draws]
                assert kinds == ["randn", "randn_like", "randn_like"], kinds  # eps, x_T, aug noise
                eps, x_t = rec.draws[0][1], rec.draws[1][1]
                (x0,) = decoded_latents
                sample = samples[0][:FRAMES]  # t c h w, cut to the input's frame count
                fixed = colour_fix(sample, rearrange(video, "c t h w -> t c h w")[:FRAMES])
                out = rearrange(fixed, "t c h w -> t h w c").clip(-1, 1).mul_(0.5).add_(0.5).mul_(255).round()
                tensors.update({
                    f"{variant}.eps": eps.contiguous(), f"{variant}.x_T": x_t.contiguous(),
                    f"{variant}.cond": cond[0].contiguous(), f"{variant}.x0": x0.contiguous(),
                    f"{variant}.decoded": sample.contiguous(), f"{variant}.fixed": fixed.contiguous(),
                    f"{variant}.frames": out.to(torch.uint8).contiguous(),
                })
                meta[f"{variant}.config"] = json.dumps(config)
                meta[f"{variant}.dit_weight_sums"] = json.dumps(dit_sums)
                meta["vae_weight_sums"] = json.dumps(vae_sums)
                meta["model_frames"] = str(padded.shape[1])
                meta["model_size"] = json.dumps(list(video.shape[2:]))
                clipped = float((fixed.abs() > 1).float().mean())
                print(f"{variant}: model input {tuple(padded.shape)}, latent {tuple(cond[0].shape)}, decoded std "
                      f"{float(sample.std()):.3f}, fixed clipped {clipped:.3%}")
    finally:
        torch.Tensor.bfloat16 = patched
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    write_golden(args.out, tensors, meta)


if __name__ == "__main__":
    main()
