"""Live sampling previews (backend/pipelines/h3/preview.py) against a DiT step, one GPU, random bf16 weights: one denoise
step at the 10-s 1344x768 shape (243 frames -> 72 latent frames, 73,888 rows) through the engine's driver
(denoise.py) with previews off and with a preview on that step, and the preview alone (gather of the 4 sheet frames'
rows, x0, the 24 -> 3 projection, the contact sheet, the copy to the host) on the same tensors.

    python bench/preview_cost.py [--seconds 10] [--layers 50] [--iters 2] [--compile] [--vae MODEL_DIR] [--json OUT]
    python bench/preview_cost.py --tiny      # a tiny config and shape on the CPU: checks the script end to end

Reports the step's median ms off / on and their ratio, the preview's median ms (CUDA events; and wall clock with the
host copy's wait) and its share of a step (the issue's bound: under 2 %), the sheet's shape and bytes. `--vae`: also
times fitting the projection from that model folder's VAE (once per engine; the tiny model's with --tiny). One JSON
line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from adaln_cache import _sync, _timed, mid_step_setup  # noqa: E402  (bench/ is on sys.path)

from comfyui_h3.backend.pipelines.h3.denoise import denoise  # noqa: E402
from comfyui_h3.backend.pipelines.h3.preview import LatentRGB, StepPreview  # noqa: E402

BOUND = 0.02  # the issue's: previews cost under 2 % of a step


def _fit_seconds(model_dir: str, dev) -> float:
    """Seconds to fit the preview projection from a model folder's VAE (loaded as the engine loads it)."""
    from diffusers import AutoencoderKLMiniMaxH3

    from comfyui_h3.backend.pipelines.h3.conditioning import ConditionEncoder

    vae = AutoencoderKLMiniMaxH3.from_pretrained(os.path.join(model_dir, "vae"), torch_dtype=torch.float32)
    vae = vae.to(dev).eval().requires_grad_(False)
    encoder = ConditionEncoder(vae, None, dev)
    frames = int(vae.config.clip_length) + int(vae.tokens_chunk_size)
    LatentRGB.fit(lambda px: encoder.encode_pixels(px, sample=False), frames)  # warm-up (kernels, allocator)
    _sync(dev)
    t0 = time.perf_counter()
    LatentRGB.fit(lambda px: encoder.encode_pixels(px, sample=False), frames)
    _sync(dev)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--text", type=int, default=502, help="text rows")
    ap.add_argument("--layers", type=int, default=50, help="DiT blocks (the release has 50)")
    ap.add_argument("--iters", type=int, default=2, help="timed denoise steps per variant")
    ap.add_argument("--preview-iters", type=int, default=20, help="timed previews")
    ap.add_argument("--compile", action="store_true", help="compile each block as the engine does on CUDA")
    ap.add_argument("--vae", help="a MiniMax-H3 folder: also time fitting the projection from its VAE")
    ap.add_argument("--tiny", action="store_true", help="a tiny config and shape (CPU when there is no GPU)")
    ap.add_argument("--json")
    args = ap.parse_args()

    setup = mid_step_setup(args, "bench/preview_cost.py")
    dev, cfg, model, layout, geo, plan = setup.dev, setup.cfg, setup.model, setup.layout, setup.geo, setup.plan
    video0, audio0, t0, gen, vt = setup.video0, setup.audio0, setup.t0, setup.gen, setup.vt
    channels = cfg.video_patch_dim // (cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2])
    rgb = LatentRGB(torch.randn(channels, 3, generator=gen) * 0.2, torch.full((3,), 0.5)).to(dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"

    sheets = []

    def step(preview: bool):
        watch = StepPreview(rgb, cfg.patch_size, every=1) if preview else None
        return denoise(model, plan, video0.clone(), audio0.clone(), preview=watch,
                       on_step=lambda done, total, preview=None: sheets.append(preview))

    r = {"bench": "preview_cost", "rows": layout.seq_len, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
         "latent_grid": [geo.latent_frames, geo.latent_height, geo.latent_width], "dtype": "bfloat16",
         "compiled": args.compile, "tiny": args.tiny, "torch": torch.__version__, "device": name}
    with torch.no_grad():
        step(False)  # warm-up (and the compile, with --compile)
        off_ms, r["peak_gib_off"] = _timed(lambda: step(False), args.iters, dev)
        step(True)
        on_ms, r["peak_gib_on"] = _timed(lambda: step(True), args.iters, dev)
        sheet = sheets[-1]
        assert sheet is not None and sheet.dtype.name == "uint8", "the preview step made no sheet"

        # The preview alone, on the step's own tensors: target rows of the state, a velocity, each row's t.
        ncv = layout.num_condition_video_rows
        x_in, velocity = video0[ncv:], torch.randn_like(video0[ncv:])
        row_ts = torch.full((x_in.shape[0],), vt, device=dev)
        watch = StepPreview(rgb, cfg.patch_size, every=1)
        watch.begin(layout, dev)
        capture_ms, _ = _timed(lambda: watch.capture(x_in, velocity, row_ts), args.preview_iters, dev)
        wall = []
        for _ in range(args.preview_iters):
            _sync(dev)
            t1 = time.perf_counter()
            watch.capture(x_in, velocity, row_ts)  # returns once the sheet is on the host
            wall.append((time.perf_counter() - t1) * 1e3)

    r["step_ms_off"], r["step_ms_on"] = statistics.median(off_ms), statistics.median(on_ms)
    r["step_ms_off_all"], r["step_ms_on_all"] = off_ms, on_ms
    r["step_on_over_off"] = r["step_ms_on"] / r["step_ms_off"]
    r["preview_ms"] = statistics.median(capture_ms)
    r["preview_wall_ms"] = statistics.median(wall)
    r["preview_share_of_step"] = max(r["preview_ms"], r["preview_wall_ms"]) / r["step_ms_off"]
    r["under_2_percent"] = r["preview_share_of_step"] < BOUND
    r["sheet_shape"], r["sheet_bytes"] = list(sheet.shape), int(sheet.nbytes)
    if args.vae or args.tiny:
        folder = args.vae
        if folder is None:
            from comfyui_h3.backend.models.tiny import make_tiny_h3

            folder = str(make_tiny_h3(os.path.join(tempfile.mkdtemp(), "tiny-h3")))
        r["fit_s"], r["fit_vae"] = _fit_seconds(folder, dev), "tiny" if args.vae is None else args.vae
    r["total_s"] = time.perf_counter() - t0
    print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(r, handle, indent=1)


if __name__ == "__main__":
    main()
