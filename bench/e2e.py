"""The whole MiniMax-H3 T2VA request end to end at the released size with random weights held in memory (text encoder,
DiT, video and audio VAEs; no weight files): ours (engine pipeline: compiled blocks, AdaLN cache, optional FP8) vs
diffusers' modular pipeline (MiniMaxH3Blocks) with components of the same architecture, same shape and step count.
One side per process (each needs ~120 GiB: run them on two GPUs at once):

    CUDA_VISIBLE_DEVICES=0 python bench/e2e.py --side ours --seconds 5 --steps 50 --json ours.json
    CUDA_VISIBLE_DEVICES=1 python bench/e2e.py --side diffusers --seconds 5 --steps 50 --json diffusers.json
    python bench/e2e.py --tiny --side ours|diffusers       # tiny configs on the CPU: the script end to end
    CUDA_VISIBLE_DEVICES=0 python bench/e2e.py --side ours --seconds 10 --fasth3 --json fasth3.json
        # the FastH3 student's path: learned VSA gates (random), VSA top-k 0.1, 4 steps on its ladder

Both sides: prompt -> decoded video frames + soundtrack in host memory (no MP4: encoding is the save stage, measured
in bench/decode_stream.py). Each side first runs a warm-up request (`--warmup-steps`, default 2: CUDA context, cuDNN
plans, and for ours the block compile), then the timed request. Ours reports its stage manifest (text encode, each
step, decode, peaks); diffusers reports wall time plus the DiT's and the VAE decode's time from CUDA events around
their forward calls.

The model folder is a skeleton: the tiny set's tokenizer / processor / schedulers and model_index.json, with the
released configs of the DiT, the VAEs and a Qwen3-VL text encoder of the released width (5120, 64 layers; H3 reads
hidden_states[50]: ours gets the 50-layer stack its loader keeps, diffusers 51 layers, the fewest it accepts).
The tiny tokenizer makes the prompt's token count, so both sides see the same text rows. Random weights: normal(0,
0.02) for the DiTs (default inits blow up through 50 blocks), the libraries' own initialisation for the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPT = ("A red fox trots through fresh snow at dawn, breath steaming in the cold air; the camera tracks low beside "
          "it as pine branches drop powder and a distant river glints; soft crunching footsteps and birdsong.")

#: Qwen3-VL text tower of H3's conditioner width (hidden 5120, 64 heads of 128, 8 KV heads, 64 layers).
TEXT_RELEASED = dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936)
VISION_RELEASED = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=5120,
                       deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304)


def make_skeleton(root: str, tiny: bool) -> str:
    """The tiny model set (configs, tokenizer, processor, schedulers), with the released configs unless `tiny`; the
    weight files are removed so nothing can be loaded from disk by accident."""
    from comfyui_h3.backend.models.tiny import make_tiny_h3

    path = str(make_tiny_h3(os.path.join(root, "skeleton")))
    if not tiny:
        from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

        for name, cls in (("transformer", MiniMaxH3Transformer3DModel), ("transformer_ref", MiniMaxH3Transformer3DModel),
                          ("vae", AutoencoderKLMiniMaxH3), ("audio_vae", AutoencoderKLMiniMaxH3Audio)):
            folder = os.path.join(path, name)
            if os.path.isdir(folder):
                with open(os.path.join(folder, "config.json")) as handle:
                    tiny_config = json.load(handle)
                with torch.device("meta"):
                    cls().save_config(folder)  # the class defaults are the released configurations ...
                with open(os.path.join(folder, "config.json")) as handle:
                    config = json.load(handle)
                for key, value in tiny_config.items():  # ... except what the class leaves unset (e.g. the VAEs'
                    if config.get(key) is None and value is not None:  # latent statistics, same channel counts)
                        config[key] = value
                with open(os.path.join(folder, "config.json"), "w") as handle:
                    json.dump(config, handle, indent=1)
        text = os.path.join(path, "text_encoder", "config.json")
        with open(text) as handle:
            config = json.load(handle)
        config["text_config"].update(TEXT_RELEASED)
        config["vision_config"].update(VISION_RELEASED)
        with open(text, "w") as handle:
            json.dump(config, handle, indent=1)
    for name in ("transformer", "transformer_ref", "vae", "audio_vae", "text_encoder"):
        folder = os.path.join(path, name)
        for entry in os.listdir(folder) if os.path.isdir(folder) else ():
            if entry.endswith((".safetensors", ".safetensors.index.json")):
                os.remove(os.path.join(folder, entry))
    return path


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def random_dit_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """normal(0, 0.02) weights, norms at 1 (random default inits overflow bf16 through 50 blocks)."""
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight") and "norm_out.linear" not in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
    return module


def text_encoder(folder: str, device, dtype, layers: int | None = None):
    """Qwen3-VL with the 50 decoder layers H3 reads, final norm and LM head removed (components.load_text_encoder's
    rule), random weights made on `device`. `layers`: keep this many instead, norm and head kept (diffusers refuses a
    50-layer stack, so it gets 51: one layer more than ours runs, ~2% of the text encode)."""
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    from comfyui_h3.backend.pipelines.h3.text import TEXT_LAYER

    config = AutoConfig.from_pretrained(folder)
    config.text_config.num_hidden_layers = layers or TEXT_LAYER
    with torch.device(device), default_dtype(dtype):
        model = Qwen3VLForConditionalGeneration._from_config(config, dtype=dtype)
    if layers is None:
        model.model.language_model.norm = torch.nn.Identity()
        model.lm_head = torch.nn.Identity()
    return model.eval().requires_grad_(False)


def diffusers_module(cls, folder: str, device, dtype):
    with torch.device(device), default_dtype(dtype):
        model = cls.from_config(cls.load_config(folder))
    return model.to(dtype).eval().requires_grad_(False)


def patch_our_loaders(device) -> None:
    """Our engine builds its components from the skeleton's configs with random weights instead of reading files."""
    from comfyui_h3.backend.models.h3_transformer import (FP32_MODULE_PREFIXES, H3Transformer,
                                                          H3TransformerConfig, finish_loading)
    from comfyui_h3.backend.pipelines.h3 import components

    def load_h3_transformer(folder, dev, dtype, attention="sdpa", fuse=True, storage="compute", adapter=None):
        from comfyui_h3.backend.attention.dispatch import get_attention

        cfg = H3TransformerConfig.from_json(os.path.join(folder, "config.json"))
        with torch.device("meta"):
            model = H3Transformer(cfg, get_attention(attention) if isinstance(attention, str) else attention)
        model = model.to(dtype).to_empty(device=dev)
        random_dit_(model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith(FP32_MODULE_PREFIXES):
                    p.data = p.data.float()
        if adapter is not None:  # --fasth3: random learned VSA gates (the adapter file only marks the student)
            with torch.no_grad():
                for block in model.transformer_blocks:
                    block.attn.add_gate(torch.empty_like(block.attn.to_q.weight).normal_(0.0, 0.02))
            model.vsa_gates = True
        return finish_loading(model, cfg, dev, fuse=fuse, storage=storage)  # rotary table, fused QKV, FP8: as loaded

    components.load_h3_transformer = load_h3_transformer
    components.load_text_encoder = lambda folder, dtype: text_encoder(str(folder), device, dtype)
    components._load_diffusers = lambda cls, kind, folder, dtype: diffusers_module(cls, str(folder), device, dtype)
    components.stored_shapes = lambda folder: {}  # the skeleton has configs only


def cuda_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_ours(args, folder, device) -> dict:
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.pipelines.h3.request import H3Request
    from comfyui_h3.backend.runtime import WeightPolicy

    patch_our_loaders(device)
    weights = WeightPolicy(adaln="cache" if args.adaln_cache else "direct", storage="fp8" if args.fp8 else "compute")
    compile_ = "off" if args.no_compile or device.type != "cuda" else "on"
    attention, student = "sdpa", None
    if args.fasth3:  # the student's path: gates in every block, VSA, the 4-step ladder
        from comfyui_h3.backend.attention.vsa import spec
        from comfyui_h3.tiny_model import ensure_tiny_student

        attention, student = spec(args.vsa_topk, 0), str(ensure_tiny_student())
    t0 = time.perf_counter()
    pipe = h3_config(folder, dtype=args.dtype, vae_dtype=args.dtype, compile=compile_, device=str(device),
                     weights=weights, attention=attention, student=student).build_pipeline(0)
    build_s = time.perf_counter() - t0

    def request(steps):
        return H3Request(prompt=PROMPT, num_frames=args.frames, steps=steps, seed=42, width=args.width,
                         height=args.height, schedule="fasth3" if args.fasth3 else "default")

    t0 = time.perf_counter()
    pipe.run(request(args.warmup_steps))
    cuda_sync()
    warm_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = pipe.run(request(args.steps))
    cuda_sync()
    total = time.perf_counter() - t0
    manifest = getattr(result, "manifest", None) or {}
    video = result.frames
    return {"side": "ours", "e2e_s": total, "build_s": build_s, "warmup_s": warm_s,
            "video": list(video.shape), "video_dtype": str(video.dtype),
            "audio": list(result.audio.shape) if getattr(result, "audio", None) is not None else None,
            "weights": {"adaln": weights.adaln, "storage": weights.storage, "compile": compile_},
            "attention": attention, "fasth3": bool(args.fasth3),
            "manifest": manifest}


class EventTimer:
    """CUDA-event (or host-clock) time spent inside a module's forward (hooks: the call signature stays what callers
    inspect), or inside another method (`method`, wrapped), summed over calls."""

    def __init__(self, module, method="forward"):
        self.total_ms, self.calls, self.pending, self._open = 0.0, 0, [], None
        if method == "forward":
            module.register_forward_pre_hook(lambda *_: self._start())
            module.register_forward_hook(lambda *_: self._stop())
            return
        inner = getattr(module, method)

        def timed(*a, **k):
            self._start()
            out = inner(*a, **k)
            self._stop()
            return out

        setattr(module, method, timed)

    def _start(self):
        if torch.cuda.is_available():
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._open = time.perf_counter()

    def _stop(self):
        if torch.cuda.is_available():
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pending.append((self._open, end))
        else:
            self.total_ms += (time.perf_counter() - self._open) * 1000
        self.calls += 1

    def seconds(self) -> float:
        cuda_sync()
        self.total_ms += sum(s.elapsed_time(e) for s, e in self.pending)
        self.pending = []
        return self.total_ms / 1000

    def reset(self):
        self.seconds()
        self.total_ms, self.calls = 0.0, 0


def run_diffusers(args, folder, device) -> dict:
    from diffusers import (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Blocks,
                           MiniMaxH3Transformer3DModel)

    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    pipe = MiniMaxH3Blocks().init_pipeline(folder)
    pipe.load_components(names=["tokenizer", "processor", "scheduler", "audio_scheduler"])
    transformer = random_dit_(diffusers_module(MiniMaxH3Transformer3DModel, os.path.join(folder, "transformer"),
                                               device, dtype))
    with torch.no_grad():  # the released mixed precision: these modules are float32 in the checkpoint
        from comfyui_h3.backend.models.tiny import TRANSFORMER_FP32_PREFIXES
        for name, p in transformer.named_parameters():
            if name.startswith(TRANSFORMER_FP32_PREFIXES):
                p.data = p.data.float()
    pipe.update_components(
        transformer=transformer,
        vae=diffusers_module(AutoencoderKLMiniMaxH3, os.path.join(folder, "vae"), device, dtype),
        audio_vae=diffusers_module(AutoencoderKLMiniMaxH3Audio, os.path.join(folder, "audio_vae"), device, dtype),
        text_encoder=text_encoder(os.path.join(folder, "text_encoder"), device, dtype, layers=51))
    build_s = time.perf_counter() - t0
    dit_timer = EventTimer(transformer)
    vae_timer = EventTimer(pipe.vae, "decode")

    def call(steps):  # diffusers' num_inference_steps counts grid points: N give N - 1 DiT evaluations; ours
        # counts evaluations (schedule.py), so both run `steps` DiT forwards
        return pipe(prompt=PROMPT, num_frames=args.frames, height=args.height, width=args.width,
                    num_inference_steps=steps + 1, generator=torch.Generator(device).manual_seed(42),
                    output=["videos", "audio"])

    t0 = time.perf_counter()
    with torch.no_grad():
        call(args.warmup_steps)
    cuda_sync()
    warm_s = time.perf_counter() - t0
    dit_timer.reset()
    vae_timer.reset()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = call(args.steps)
    cuda_sync()
    total = time.perf_counter() - t0
    videos = out["videos"] if isinstance(out, dict) else out[0]
    shape = list(videos.shape) if hasattr(videos, "shape") else [len(videos)]
    return {"side": "diffusers", "e2e_s": total, "build_s": build_s, "warmup_s": warm_s, "video": shape,
            "dit_s": dit_timer.seconds(), "dit_calls": dit_timer.calls, "vae_decode_s": vae_timer.seconds(),
            "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=("ours", "diffusers"), required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--fp8", action="store_true", help="ours: FP8 GEMM weights")
    ap.add_argument("--no-adaln-cache", dest="adaln_cache", action="store_false")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny configs on the CPU")
    ap.add_argument("--fasth3", action="store_true",
                    help="ours: the FastH3 student's path (random learned VSA gates in every block, attention vsa "
                         "with --vsa-topk and no dense steps, the 4-step fasth3 schedule: --steps and "
                         "--warmup-steps become 4)")
    ap.add_argument("--vsa-topk", type=float, default=0.1, help="--fasth3: video tiles each video tile attends")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.fasth3 and args.side != "ours":
        ap.error("--fasth3 runs our side only (diffusers has no FastH3 student)")
    from comfyui_h3.backend.pipelines.h3.geometry import frames_for_seconds

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        args.width, args.height, args.dtype = 64, 64, "float32"
        args.steps, args.warmup_steps = min(args.steps, 3), 2
    else:
        args.width, args.height = 1344, 768
    if args.fasth3:
        args.steps = args.warmup_steps = 4
    args.frames = frames_for_seconds(args.seconds)
    root = tempfile.mkdtemp(prefix="h3-e2e-")
    try:
        folder = make_skeleton(root, args.tiny)
        run = run_ours if args.side == "ours" else run_diffusers
        result = run(args, folder, device)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.update(machine=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                  seconds=args.seconds, frames=args.frames, size=f"{args.width}x{args.height}", steps=args.steps,
                  dtype=args.dtype)
    text = json.dumps(result, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
