"""The engine on a GPU, end to end, on the embedded tiny model: spawn a CUDA worker, generate, time it, and check
the CUDA fp32 result against the CPU fp32 path (same seed). Also bf16 with compiled blocks (the default on CUDA).

    python bench/engine_smoke.py [--out-json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-json")
    args = ap.parse_args()
    from comfyui_h3.backend.engine import Engine
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.backend.models.tiny import make_tiny_h3
    from comfyui_h3.backend.pipelines.h3.request import H3Request

    folder = make_tiny_h3(os.path.join(tempfile.mkdtemp(), "tiny-h3"))
    request = dict(prompt="a drum solo", num_frames=124, steps=8, seed=3, width=64, height=64)
    report = {}
    cpu = h3_config(str(folder), device="cpu", dtype="float32").build_pipeline(0).run(H3Request(**request))
    for name, cfg in (("cuda_fp32_eager", h3_config(str(folder), device="cuda", dtype="float32", compile="off")),
                      ("cuda_bf16_compiled", h3_config(str(folder), device="cuda", dtype="bfloat16"))):
        engine = Engine(cfg)
        t0 = time.perf_counter()
        engine.start()
        started = time.perf_counter() - t0
        runs = []
        for _ in range(2):
            t1 = time.perf_counter()
            result = engine.generate(H3Request(**request))
            runs.append(time.perf_counter() - t1)
        engine.shutdown()
        err = ((result.video_latents - cpu.video_latents).norm() / cpu.video_latents.norm()).item()
        aerr = ((result.audio_latents - cpu.audio_latents).norm() / cpu.audio_latents.norm()).item()
        report[name] = dict(start_s=started, first_s=runs[0], second_s=runs[1], video_rel_err_vs_cpu=err,
                            audio_rel_err_vs_cpu=aerr, frames=list(result.frames.shape), timings=result.timings)
        print(name, json.dumps(report[name]), flush=True)
    if args.out_json:
        with open(args.out_json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
