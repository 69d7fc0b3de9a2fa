"""`python -m comfyui_h3 storyboard FILE --out film.mp4`: a shot list made into one film on one engine
(storyboard_job.py); progress per shot and step on stderr; Ctrl-C finishes the step and keeps the finished shots as
<out>_partial_NNNNN.mp4."""

from __future__ import annotations

import json
import os
import sys


def storyboard(args, model_dir) -> int:
    from . import comfy_services as services
    from .backend.engine import EngineCancelled, get_engine
    from .backend.media.encode import release_placeholder, reserve_path
    from .backend.pipelines.h3.family import engine_config
    from .cli_generate import attention_flags, lora_choices, native_file_args, reference_from_file, student_file
    from .cli_signals import stop_requested
    from .storyboard_job import make_film, storyboard_file

    board = storyboard_file(args.shots)
    folder = os.path.dirname(os.path.abspath(args.shots))
    references = [reference_from_file(p if os.path.isabs(p) else os.path.join(folder, p))
                  for p in board.reference_images]
    out = reserve_path(os.path.abspath(args.out))  # FileExistsError now: never over a file
    model_dir = model_dir() if callable(model_dir) else model_dir
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    try:
        engine = get_engine(engine_config(
            model_dir, **attention_flags(args), adaln_cache=getattr(args, "adaln_cache", False),
            weights="fp8" if getattr(args, "fp8", False) else "bf16",
            resident_blocks=getattr(args, "resident_blocks", "all"), device=args.device, dtype=dtype,
            student=student_file(args), files=native_file_args(args), loras=lora_choices(args)))
    except BaseException:
        release_placeholder(out)
        raise
    print(f"storyboard: {len(board.shots)} shots, {board.total_frames} frames ({board.seconds:.2f} s)",
          file=sys.stderr)

    def run(request):
        shot = run.count = getattr(run, "count", 0) + 1
        reporter = services.ProgressReporter(request.steps, desc=f"shot {shot}/{len(board.shots)}")
        try:
            return engine.generate(request, progress=lambda done, total: reporter.update_absolute(done, total),
                                   should_cancel=stop_requested)
        except EngineCancelled:
            return None

    try:
        report = make_film(board, run, out, references, should_stop=stop_requested)
    finally:
        engine.shutdown()
    if report["path"]:
        print(report["path"])
    print(json.dumps({k: v for k, v in report.items() if k != "shots"}), file=sys.stderr)
    return 130 if report["stopped"] else 0
